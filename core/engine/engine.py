"""The engine: a Llama-family model served through the paged KV cache with continuous batching.

The loop has vLLM's / nano-vllm's shape: `add_request` queues a request, `step()` runs one scheduler step and
returns the requests it finished (and, with streaming, those it advanced), `has_unfinished_requests()` says
whether to keep stepping, `abort_request` drops one. `generate` is a loop over `step`.

The engine is driven by `core.sched.scheduler.Scheduler`, the serving simulator's too (FCFS admission with a
watermark, chunked prefill budget, newest-first preemption by recompute), with `EngineMemory` as its memory policy
(a `core.kv.KVCacheManager` with one block table per KV cache group, and the KVCache: the engine's only door to
KV memory) and the engine's `SequenceGroup`s as its groups. Each step runs through `core.sched.driver.run_step`,
the simulator's driver too, with `core.engine.step_executor.EngineExecutor` as its executor: `schedule()`
decides (decode groups, prefill chunks, preemptions); `allocate()` appends each decoding sequence's last token to
the KV cache manager (copying a shared last block first); the `ModelRunner` builds one flattened batch and runs
the forward pass (K/V written by slot, read by the paged kernels); each request samples, deciding which sequences
end or fork; `postprocess()` marks the step's tokens computed, applies those forks and frees, counts the outputs
and releases finished requests (the scheduler, through `EngineMemory`, is the only writer of KV memory); the
driver's observer, a `StepObserver`, records the step's row (metrics and timings, `core.engine.metrics`) and
snapshots. See `core.engine` for the
public API. What the engine is built from (the dtype, a checkpoint or random weights, the pool's size) is
`core.engine.loading`; chat prompts through the tokenizer's template are `core.engine.chat`.
"""

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from core.common import check_int
from core.engine.chat import chat_prompt, conversations_of
from core.engine.config import ModelConfig
from core.engine.loading import engine_bytes, load_checkpoint, pool_blocks, random_model
from core.engine.memory import EngineMemory, kv_groups_of
from core.engine.metrics import EngineRun, StepObserver, StepRecorder
from core.engine.model import LlamaModel
from core.engine.model_runner import ModelRunner
from core.engine.requests import RequestInbox, make_group, prompts_and_params
from core.engine.sampling import SamplingParams
from core.engine.sequence import RequestOutput, SequenceGroup
from core.engine.step_executor import EngineExecutor
from core.errors import InvalidArgumentError
from core.kv import KVCacheManager
from core.paging.kv_cache import KVCache
from core.sched import driver
from core.sched.scheduler import Scheduler

__all__ = ["DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "Engine", "engine_bytes"]

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class Engine:
    """A model, its paged KV pool and the scheduler. Build it with `from_pretrained` or `from_config`.

    num_blocks: blocks in the pool; None sizes it from the memory budget (`PAGED_LAB_MAX_BYTES`, 4 GiB by
    default) less the weights, capped at max_num_seqs x max_position_embeddings tokens.
    last_run: the `EngineRun` of the last `generate` call (None before the first); `current_run()` is the record
    of the steps since the last `reset_metrics` (what a server driving `step` reads).
    warmup: run the model once on a throwaway batch when built (`warmup_ms` says how long it took), so one-time
    costs (building the C attention kernel, first-call dispatch) are not charged to the first step.

    Threads: `add_request`, `abort_request` and `has_unfinished_requests` may be called from any thread; they
    only touch a locked inbox (`core.engine.requests.RequestInbox`). `step` (and `generate`) run under the
    engine's step lock, so one thread steps at a time; queued adds and aborts are applied by the stepping thread
    when a step starts (or at once, by the caller, when no step is running). Everything else (the scheduler, the
    KV cache manager, the KV cache, `current_run`) belongs to the stepping thread.

    kv_specs: one `core.kv` layer spec per layer (`layer_specs`). kv_groups: the KV cache groups
    (`core.kv.layout.kv_cache_groups`); `manager` is the `core.kv.KVCacheManager` with one block table per group
    over ONE pool of `num_blocks` blocks of `block_size` tokens, and layer l reads and writes through the tables of
    group `layer_group[l]`. enable_kv_cache_events: the manager's pool queues vLLM's KV cache events (BlockStored
    as computed blocks enter the prefix cache, BlockRemoved on eviction); drain them with `manager.take_events()`.
    block_hasher: the manager's block key (`core.kv.block_hash`; None: Python's hash), e.g. a `VllmBlockHasher`
    so that the events carry the hashes a vLLM server would send.

    Sliding window: a group of sliding-window layers (window W; every layer for Mistral-7B-v0.1, some for
    Gemma-2 style `layer_types` or Qwen2's `max_window_layers`) releases, once c tokens are computed, the blocks
    wholly before position c - W + 1 (entries -1, never read by the windowed kernels): a decoding sequence holds
    at most ceil((W + block_size - 1) / block_size) blocks there (its whole prompt until computed), while a full
    group keeps every block. Forks share the blocks still held; copy-on-write is per group. A released full
    block stays cached until evicted; a prefix-cache hit needs the prefix cached in every group.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        num_blocks: int | None = None,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        tokenizer=None,
        backend: str = "auto",
        max_snapshots: int = 100,
        warmup: bool = True,
        enable_kv_cache_events: bool = False,
        block_hasher=None,
    ):
        block_size = check_int(block_size, "block_size", minimum=1, maximum=1024)
        max_num_seqs = check_int(max_num_seqs, "max_num_seqs", minimum=1)
        max_num_batched_tokens = check_int(
            max_num_batched_tokens, "max_num_batched_tokens", minimum=max_num_seqs
        )
        self.config = config
        kv_dtype = weights["model.embed_tokens.weight"].dtype
        self.kv_specs, self.kv_groups, self.layer_group = kv_groups_of(config, block_size, kv_dtype)
        self.model = LlamaModel(config, weights, backend, self.layer_group)
        self.tokenizer = tokenizer
        num_blocks, kv_budget = pool_blocks(
            config, self.model.weight_bytes, self.model.dtype, block_size, max_num_seqs, num_blocks
        )
        self.cache = KVCache(
            config.num_layers,
            num_blocks,
            block_size,
            config.num_kv_heads,
            config.head_dim,
            self.model.dtype,
            self.model.device,
            max_bytes=max(kv_budget, 0),
        )
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.manager = KVCacheManager(
            [group.spec for group in self.kv_groups],
            num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            enable_kv_cache_events=self.enable_kv_cache_events,
            **({} if block_hasher is None else {"block_hasher": block_hasher}),
        )
        self.memory = EngineMemory(self.manager, self.cache, self.layer_group)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_snapshots = check_int(max_snapshots, "max_snapshots", minimum=1)
        self.scheduler = Scheduler(self.memory, max_num_seqs, max_num_batched_tokens, "recompute")
        self._seq_ids = itertools.count()
        self._inbox = RequestInbox()
        self._live: dict = {}  # request_id -> group, for every request in the scheduler's queues
        self.runner = ModelRunner(self.model, self.memory)
        self._executor = EngineExecutor(
            self.scheduler,
            self.runner,
            config.eos_token_ids,
            self._new_seq_id,
            tokenizer,
            self._forget,
        )
        self.last_run: EngineRun | None = None
        self._step_lock = threading.RLock()
        self.warmup_ms = self.runner.warm_up() if warmup else 0.0
        self.reset_metrics()

    # ---- construction -------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        num_blocks: int | None = None,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        enable_prefix_caching: bool = False,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        **kwargs,
    ) -> "Engine":
        """Load a Llama / Mistral / Qwen2 directory as Hugging Face saves it (config.json + safetensors, sharded
        or not; a tokenizer when present), or a Llama-architecture `.gguf` file (dequantized; its tokenizer and
        chat template: `core.engine.gguf_file`). dtype None: float32 on CPU, the checkpoint's dtype on CUDA
        (float32 for a GGUF file).

        Raises ModelLoadError (missing or malformed files, unsupported architecture or setting) and
        ModelTooLargeError (weights over the memory budget, checked before loading).
        """
        config, weights, tokenizer = load_checkpoint(path, dtype, device)
        return cls(
            config,
            weights,
            num_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tokenizer=tokenizer,
            **kwargs,
        )

    @classmethod
    def from_config(
        cls,
        config: ModelConfig | dict,
        *,
        seed: int = 0,
        num_blocks: int | None = None,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        enable_prefix_caching: bool = False,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        **kwargs,
    ) -> "Engine":
        """A model with seeded random weights (see `core.engine.weights.random_weights`). `config`: a ModelConfig,
        or a Hugging Face config dict (as in config.json, or a transformers config's `to_dict()`)."""
        config, weights = random_model(config, seed, dtype, device)
        return cls(
            config,
            weights,
            num_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            **kwargs,
        )

    # ---- chat -------------------------------------------------------------------------------------------

    def chat(
        self,
        messages,
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        progress: Callable[[float], None] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: `messages` is one conversation (a list of {"role", "content"} dicts) or a list of
        conversations. Each is rendered by the tokenizer's chat template with the assistant's turn opened
        (`chat_prompt`) and generated as `generate` does; one RequestOutput per conversation, in order, whose
        `prompt` is the rendered text and whose `CompletionOutput.text` is the decoded answer (EOS and other
        special tokens left out). An answer ends at the model's EOS (kept in token_ids) unless ignore_eos.
        Raises InvalidArgumentError (before anything runs) for a model without tokenizer or chat template, or a
        malformed message."""
        rendered = [self.chat_prompt(c) for c in conversations_of(messages)]
        outputs = self.generate([ids for _, ids in rendered], params, progress=progress)
        for output, (text, _) in zip(outputs, rendered, strict=True):
            output.prompt = text
        return outputs

    def chat_prompt(self, conversation) -> tuple[str, list[int]]:
        """(text, token ids) of one conversation through the tokenizer's chat template, ending with the opened
        assistant turn (transformers' `apply_chat_template(add_generation_prompt=True)`); the template writes
        the special tokens itself, so the text is tokenized without adding any. Raises InvalidArgumentError."""
        return chat_prompt(self.tokenizer, conversation)

    # ---- requests -----------------------------------------------------------------------------------------

    def _forget(self, finished_ids: list) -> None:
        """Drop the requests a step finished from the live requests and tell the inbox (the executor's `forget`)."""
        for request_id in finished_ids:
            self._live.pop(request_id, None)
        self._inbox.finished(finished_ids)

    def _new_seq_id(self) -> int:
        return next(self._seq_ids)  # itertools.count: atomic under the interpreter lock, safe from any thread

    def _group(self, request_id, prompt, params, seed_offset=0, return_logits=False, stream=False):
        group = make_group(
            request_id,
            prompt,
            params,
            tokenizer=self.tokenizer,
            vocab_size=self.config.vocab_size,
            max_num_seqs=self.max_num_seqs,
            new_seq_id=self._new_seq_id,
            seed_offset=seed_offset,
            return_logits=return_logits,
            stream=stream,
        )
        self.memory.check_fits(group, params.max_tokens, params.num_sequences)
        return group

    def add_request(
        self,
        prompt,
        params: SamplingParams | None = None,
        request_id: int | str | None = None,
        *,
        stream: bool = False,
        return_logits: bool = False,
    ) -> int | str:
        """Queue one request (a list of token ids, or text when the model has a tokenizer) with `params` (default
        16 tokens at temperature 1.0); returns its id (`request_id`, or the smallest free integer). It joins the
        running batch at the next `step`. stream: `step` also reports it after every step that gives it tokens.
        Safe to call from any thread (see the class docstring). Raises InvalidArgumentError (bad prompt or params,
        a request that can never fit the pool, an id already used by an unfinished request), queueing nothing."""
        params = SamplingParams(max_tokens=16) if params is None else params
        if request_id is None:
            request_id = self._inbox.new_request_id()
        elif isinstance(request_id, bool) or not isinstance(request_id, int | str):
            raise InvalidArgumentError(f"request_id must be an int or a str, got {type(request_id).__name__}")
        group = self._group(request_id, prompt, params, 0, return_logits, stream)
        self._inbox.add(group)
        self._apply_inbox_if_idle()
        return request_id

    def abort_request(self, request_id: int | str) -> bool:
        """Stop an unfinished request: it leaves the queues and its blocks go back to the pool, at once when no
        step is running, else when the next step starts. Returns False (and does nothing) when no unfinished
        request has this id (never added, finished or aborted already). Safe to call from any thread."""
        queued = self._inbox.abort(request_id)
        self._apply_inbox_if_idle()
        return queued

    def has_unfinished_requests(self) -> bool:
        """True while a request added is neither finished nor aborted, or an abort is still to be applied."""
        return self._inbox.has_unfinished()

    def _apply_inbox_if_idle(self) -> None:
        if self._step_lock.acquire(blocking=False):
            try:
                self._apply_inbox()
            finally:
                self._step_lock.release()

    def _apply_inbox(self) -> None:
        """Move added requests into the scheduler and apply aborts, in call order (step lock held)."""
        for kind, item in self._inbox.drain():
            if kind == "add":
                self._live[item.request_id] = item
                self.scheduler.add(item)
            elif item in self._live:
                self._drop(self._live.pop(item))

    def _drop(self, group: SequenceGroup) -> None:
        """Take a group out of the scheduler's queues; the scheduler gives its blocks back."""
        self.scheduler.abort(group)

    def _abort_all(self) -> None:
        """Drop every request (after an error): the pool is empty again and nothing is queued."""
        self._inbox.drain()
        self._inbox.clear()
        self.scheduler.reset()
        self._live.clear()
        self.memory.cow_log.clear()

    # ---- the loop -----------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler step: apply queued adds and aborts, schedule (admit, preempt, chunk prefills), allocate
        the decodes' slots, run the model on the flattened batch, sample, postprocess (finished requests free
        their blocks), record the step's row. Returns the requests that finished in this step, and the streamed
        ones that got tokens (`finished` False); [] when there is nothing to do. Call from one thread at a time.
        A step that raises drops every request (the pool is left empty) and re-raises."""
        with self._step_lock:
            started = time.perf_counter()
            self._apply_inbox()
            if not self.scheduler.has_unfinished:
                return []
            try:
                return self._step(started)
            except BaseException:
                self._abort_all()
                raise

    def _step(self, started: float) -> list[RequestOutput]:
        """schedule -> allocate -> run -> postprocess (nano-vllm's loop) through the run driver the simulator
        uses too (`core.sched.driver.run_step`); the executor runs the model, the observer records the step."""
        self._observer.step_started = started
        return driver.run_step(self.scheduler, self._executor, self._observer)

    # ---- runs ---------------------------------------------------------------------------------------------

    def reset_metrics(self) -> None:
        """Start a new record: steps, snapshots, copy-on-write events and finished requests (see `current_run`)."""
        self._recorder = StepRecorder(self.max_snapshots, preemptions_base=self.scheduler.num_preemptions)
        self._observer = StepObserver(self.memory, self.scheduler, self.runner, self._recorder)

    def current_run(self) -> EngineRun:
        """An `EngineRun` of every step since the last `reset_metrics` (or the engine's start, or the last
        `generate`): `requests` holds the requests that finished in that span, in the order they finished."""
        return self._recorder.run(self.num_blocks, self.block_size)

    def generate(
        self,
        prompts,
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        return_logits: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (a list of token ids, or a string when the model has a tokenizer; one prompt
        alone is accepted too) with `params` (one SamplingParams for all, or a list with one per prompt; default
        16 tokens at temperature 1.0); returns one RequestOutput per prompt, in order (request ids 0, 1, ...; a
        seeded request i draws from seed + i). A loop over `step` on an engine with no other request unfinished.
        progress(fraction) is called after every step with the fraction of the output tokens asked for that
        exist so far (last call 1.0). Records `self.last_run`. Raises InvalidArgumentError for a prompt that can
        never fit the pool, or when requests added with `add_request` are unfinished; after any error the pool is
        left empty, as before the call."""
        started = time.perf_counter()
        prompts, per_prompt = prompts_and_params(prompts, params)
        with self._step_lock:
            if self.has_unfinished_requests():
                raise InvalidArgumentError(
                    f"generate runs alone, and {len(self._inbox.unfinished_ids())} request(s) added with "
                    "add_request are unfinished: step them to the end or abort them first"
                )
            groups = [
                self._group(i, prompt, p, seed_offset=i, return_logits=return_logits)
                for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True))
            ]
            self.reset_metrics()
            self._recorder.started = started
            results = {}
            target = sum(g.params.num_sequences * g.params.max_tokens for g in groups)
            try:
                for group in groups:
                    self._inbox.add(group)
                while self.has_unfinished_requests():
                    results.update((out.request_id, out) for out in self.step())
                    if progress is not None:
                        done = sum(sum(s.num_output for s in (*g.seqs, *g.finished)) for g in groups)
                        busy = self.has_unfinished_requests()
                        progress(min(done / target, 1.0) if busy else 1.0)
            except BaseException:
                self._abort_all()
                raise
            self.last_run = self.current_run()
        outputs = [results[i] for i in range(len(groups))]
        self.last_run.requests = self.last_run.requests.sort_values("request_id", ignore_index=True)
        return outputs
