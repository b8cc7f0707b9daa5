"""The Engine page's inputs as URL fields (`ui.query_state.Field`): parsed and bounded like any user input.

source: "smollm2" (SmolLM2-135M-Instruct once fetched; the default), "tiny" (random weights, no download) or
"directory" (a model directory or .gguf file). q and system: the chat question and system prompt (SmolLM2);
prompts: one prompt per line (the other models). step: the engine step the block heatmap shows (None: the
second snapshot). The chat's earlier turns live in the session only: a shared link reproduces the last turn.
"""

from ui.query_state import Field

SOURCE_LABELS = {
    "smollm2": "SmolLM2-135M-Instruct (trained, 93 MB download)",
    "tiny": "random weights (no download): tiny Llama, 2 layers",
    "directory": "Local model (Hugging Face directory or .gguf file)",
}
DEFAULT_QUESTION = "What is the capital of France?"
DEFAULT_PROMPTS = (
    "1 17 42 7 99 3 250 11 64 5 8 301 77 12 45 9 230 18 6 33\n5 9 200 31\n400 2 88 13 61 7 19 140 52 3"
)

FIELDS = (
    Field("source", "smollm2", "choice", choices=tuple(SOURCE_LABELS), label="model"),
    Field("path", "", "str", max_length=500, label="model path"),
    Field("model_dir", "", "str", max_length=200, label="model under the model root"),
    Field("q", DEFAULT_QUESTION, "str", max_length=2000, label="question"),
    Field("system", "", "str", max_length=2000, label="system prompt"),
    Field("prompts", DEFAULT_PROMPTS, "str", max_length=8000, label="prompts"),
    Field("max_tokens", 32, "int", minimum=1, maximum=512, label="new tokens per output"),
    Field("temperature", 0.8, "float", minimum=0.0, maximum=5.0, step=0.1, label="temperature"),
    Field("top_p", 0.95, "float", minimum=0.01, maximum=1.0, step=0.05, label="top_p"),
    Field("top_k", 0, "int", minimum=0, maximum=10_000, label="top_k"),
    Field("seed", 0, "int", minimum=0, maximum=2**31 - 1, label="seed"),
    Field("n", 4, "int", minimum=1, maximum=16, label="parallel samples"),
    Field("beam_width", 1, "int", minimum=1, maximum=16, label="beam width"),
    Field("prefix_caching", False, "bool", label="prefix caching"),
    Field("pool", 64, "int", minimum=0, maximum=1_000_000, label="pool size (blocks)"),
    Field("block_size", 16, "choice", choices=(8, 16, 32), label="block size"),
    Field("step", None, "int", minimum=0, maximum=10**9, optional=True, label="heatmap step"),
    Field("sharing", False, "bool", label="measure sharing"),
)
