"""Chat prompts: one conversation through a tokenizer's chat template, as vLLM's `LLM.chat` renders it."""

from core.errors import InvalidArgumentError


def conversations_of(messages) -> list:
    """`messages` as a list of conversations: one conversation (a list of {"role", "content"} dicts) or a list of
    them. Raises InvalidArgumentError when there is none."""
    conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages or [])
    if not conversations:
        raise InvalidArgumentError("chat needs at least one conversation (a list of role/content messages)")
    return conversations


def chat_prompt(tokenizer, conversation) -> tuple[str, list[int]]:
    """(text, token ids) of one conversation through the tokenizer's chat template, ending with the opened
    assistant turn (transformers' `apply_chat_template(add_generation_prompt=True)`); the template writes
    the special tokens itself, so the text is tokenized without adding any. Raises InvalidArgumentError for a
    tokenizer without chat template (or none) and for a malformed conversation."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise InvalidArgumentError("this model has no chat template: give prompts to generate instead")
    if not isinstance(conversation, list | tuple) or not conversation:
        raise InvalidArgumentError("a conversation is a non-empty list of {'role', 'content'} messages")
    for message in conversation:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise InvalidArgumentError(f"a message needs a role and a text content, got {message!r}")
        if message.get("role") not in ("system", "user", "assistant"):
            raise InvalidArgumentError(
                f"a message's role is 'system', 'user' or 'assistant', got {message.get('role')!r}"
            )
    text = tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])
