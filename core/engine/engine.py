"""The engine: a Llama-family model served through the paged KV cache with continuous batching.

The engine is driven by the serving simulator's own `core.serving.scheduler.Scheduler` (FCFS admission with a
watermark, chunked prefill budget, newest-first preemption by recompute), with `EngineMemory` as its memory policy
(the real BlockManager and KVCache) and the engine's `SequenceGroup`s as its groups. Each step:
`schedule()` decides (decode groups, prefill chunks, preemptions); `allocate()` appends each decoding sequence's
last token to the block manager (copying a shared last block first); the engine builds one flattened batch, runs
the forward pass (K/V written by slot, read by the paged kernels) and samples, forking or freeing sequences;
`postprocess()` counts the outputs and releases finished requests; the step's metrics are recorded.
See `core.engine` for the public API.
"""

import math
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from core.common import cdiv, check_int
from core.device import default_device, memory_budget_bytes
from core.engine.config import ModelConfig
from core.engine.gguf_file import gguf_config, gguf_tokenizer, gguf_weights
from core.engine.memory import EngineMemory
from core.engine.metrics import EngineRun, EngineSnapshot, StepRecorder
from core.engine.model import ForwardBatch, LlamaModel
from core.engine.postprocess import finish_group_outputs, process_group
from core.engine.sampling import SamplingParams
from core.engine.sequence import RequestOutput, Sequence, SequenceGroup
from core.engine.weights import expected_shapes, load_weights, random_weights
from core.errors import InvalidArgumentError, ModelLoadError, ModelTooLargeError
from core.paging.block_manager import BlockManager
from core.paging.kv_cache import KVCache, kv_cache_bytes
from core.serving.scheduler import ScheduledStep, Scheduler

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def _resolve_dtype(dtype: torch.dtype | None, device: torch.device, config: ModelConfig) -> torch.dtype:
    if dtype is not None:
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InvalidArgumentError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        return dtype
    return config.checkpoint_dtype if device.type == "cuda" else torch.float32


def _load_tokenizer(path: Path):
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:
        raise ModelLoadError(f"the tokenizer files in {str(path)!r} do not load: {err}") from None


def engine_bytes(
    config: ModelConfig,
    num_blocks: int,
    block_size: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> int:
    """Bytes an engine of `config` allocates: its required weights (`expected_shapes`; optional q/k/v biases, a
    few rows per layer, not counted) plus a pool of `num_blocks` KV blocks of `block_size` tokens, in the dtype
    the engine would use (`dtype`, else float32 on CPU and the checkpoint's dtype on CUDA; `device` defaults to
    `default_device()`). Computed from shapes alone, so a caller can refuse before anything is allocated."""
    device = torch.device(device) if device is not None else default_device()
    dtype = _resolve_dtype(dtype, device, config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    weights = sum(math.prod(shape) for shape in expected_shapes(config).values()) * itemsize
    kv = kv_cache_bytes(
        config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, dtype
    )
    return weights + kv


class Engine:
    """A model, its paged KV pool and the scheduler. Build it with `from_pretrained` or `from_config`.

    num_blocks: blocks in the pool; None sizes it from the memory budget (`PAGED_LAB_MAX_BYTES`, 4 GiB by
    default) less the weights, capped at max_num_seqs x max_position_embeddings tokens.
    last_run: the `EngineRun` of the last `generate` call (None before the first).

    Sliding window: when every attention layer shares one window W (`ModelConfig.uniform_sliding_window`,
    Mistral-7B-v0.1), the BlockManager is built with `sliding_window=W`: before a sequence appends the token at
    position n, its blocks wholly before position n - W + 1 go back to the pool (table entries -1, never read by
    the windowed kernels), so a decoding sequence holds at most ceil((W + block_size - 1) / block_size) blocks
    (its whole prompt until the first decode: prompts are allocated whole). Forks share only the blocks still
    held; copy-on-write is unchanged. Prefix caching works with the window: a released full block stays cached
    (its K/V depend only on the tokens before it) until it is evicted. A model mixing full and windowed layers
    (Qwen2 with `max_window_layers`, Gemma-2 style) keeps full-attention block management for all layers: the
    windowed layers would need their own pool and block tables (one BlockManager per KV cache group, as vLLM's
    hybrid allocator and `core.serving.hybrid_memory` do), which this engine does not have.
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
    ):
        block_size = check_int(block_size, "block_size", minimum=1, maximum=1024)
        max_num_seqs = check_int(max_num_seqs, "max_num_seqs", minimum=1)
        max_num_batched_tokens = check_int(
            max_num_batched_tokens, "max_num_batched_tokens", minimum=max_num_seqs
        )
        self.config = config
        self.model = LlamaModel(config, weights, backend)
        self.tokenizer = tokenizer
        budget = memory_budget_bytes()
        kv_budget = budget - self.model.weight_bytes
        per_block = kv_cache_bytes(
            config.num_layers, 1, block_size, config.num_kv_heads, config.head_dim, self.model.dtype
        )
        if num_blocks is None:
            cap = cdiv(max_num_seqs * config.max_position_embeddings, block_size)
            num_blocks = min(kv_budget // per_block, cap)
            if num_blocks < 1:
                raise ModelTooLargeError(
                    f"the weights take {self.model.weight_bytes:,} bytes of the {budget:,}-byte memory budget, "
                    f"leaving no room for one KV block of {per_block:,} bytes",
                    requested_bytes=self.model.weight_bytes + per_block,
                    allowed_bytes=budget,
                )
        num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
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
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching, sliding_window=config.uniform_sliding_window
        )
        self.memory = EngineMemory(self.manager, self.cache)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_snapshots = check_int(max_snapshots, "max_snapshots", minimum=1)
        self.last_run: EngineRun | None = None
        self._next_seq_id = 0

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
        path = Path(path)
        gguf = path.suffix.lower() == ".gguf"
        config = gguf_config(path) if gguf else ModelConfig.from_directory(path)
        device = torch.device(device) if device is not None else default_device()
        dtype = _resolve_dtype(dtype, device, config)
        load = gguf_weights if gguf else load_weights
        weights = load(path, config, dtype, device, memory_budget_bytes())
        tokenizer = gguf_tokenizer(path) if gguf else _load_tokenizer(path)
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
        if not isinstance(config, ModelConfig):
            config = ModelConfig.from_dict(config.to_dict() if hasattr(config, "to_dict") else dict(config))
        device = torch.device(device) if device is not None else default_device()
        dtype = _resolve_dtype(dtype, device, config)
        weights = random_weights(config, dtype, device, check_int(seed, "seed", minimum=0))
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
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages or [])
        if not conversations:
            raise InvalidArgumentError(
                "chat needs at least one conversation (a list of role/content messages)"
            )
        rendered = [self.chat_prompt(c) for c in conversations]
        outputs = self.generate([ids for _, ids in rendered], params, progress=progress)
        for output, (text, _) in zip(outputs, rendered, strict=True):
            output.prompt = text
        return outputs

    def chat_prompt(self, conversation) -> tuple[str, list[int]]:
        """(text, token ids) of one conversation through the tokenizer's chat template, ending with the opened
        assistant turn (transformers' `apply_chat_template(add_generation_prompt=True)`); the template writes
        the special tokens itself, so the text is tokenized without adding any. Raises InvalidArgumentError."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
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
        text = self.tokenizer.apply_chat_template(
            list(conversation), tokenize=False, add_generation_prompt=True
        )
        return text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ---- requests -----------------------------------------------------------------------------------------

    def _prompt_ids(self, prompt) -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidArgumentError("this model has no tokenizer: give prompts as lists of token ids")
            return list(self.tokenizer(prompt)["input_ids"]), prompt
        ids = [check_int(t, "token id", minimum=0, maximum=self.config.vocab_size - 1) for t in prompt]
        if not ids:
            raise InvalidArgumentError("a prompt needs at least one token")
        return ids, None

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def _make_groups(self, prompts, params, return_logits: bool) -> list[SequenceGroup]:
        if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if len(prompts) == 0:
            raise InvalidArgumentError("generate needs at least one prompt")
        per_prompt = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise InvalidArgumentError(f"{len(per_prompt)} SamplingParams given for {len(prompts)} prompts")
        groups = []
        for index, (prompt, params) in enumerate(zip(prompts, per_prompt, strict=True)):
            if not isinstance(params, SamplingParams):
                raise InvalidArgumentError(f"params must be SamplingParams, got {type(params).__name__}")
            if params.num_sequences > self.max_num_seqs:
                raise InvalidArgumentError(
                    f"{params.num_sequences} sequences per request exceed max_num_seqs ({self.max_num_seqs})"
                )
            samples = 1 if params.use_beam_search else params.n  # beams grow from one sequence
            ids, text = self._prompt_ids(prompt)
            generator = None if params.seed is None else torch.Generator().manual_seed(params.seed + index)
            seqs = [
                Sequence(self._new_seq_id(), list(ids), len(ids), logits=[] if return_logits else None)
                for _ in range(samples)
            ]
            group = SequenceGroup(index, params, list(ids), seqs, generator, prompt=text)
            self.memory.check_fits(group, params.max_tokens)
            groups.append(group)
        return groups

    # ---- the loop -----------------------------------------------------------------------------------------

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
        16 tokens at temperature 1.0); returns one RequestOutput per prompt, in order. progress(fraction) is called
        after every step with the fraction of the output tokens asked for that exist so far (last call 1.0).
        Records `self.last_run`. Raises InvalidArgumentError for a prompt that can never fit the pool; after any
        error the pool is left empty, as before the call."""
        started = time.perf_counter()
        groups = self._make_groups(prompts, params or SamplingParams(max_tokens=16), return_logits)
        try:
            return self._run(groups, started, progress)
        except BaseException:
            for group in list(self.memory.held.values()):
                self.memory.release(group)
            raise

    def _run(self, groups: list[SequenceGroup], started: float, progress) -> list[RequestOutput]:
        scheduler = Scheduler(self.memory, self.max_num_seqs, self.max_num_batched_tokens, "recompute")
        for group in groups:
            scheduler.add(group)
        recorder = StepRecorder(self.max_snapshots)
        request_of = {}
        target = sum(g.params.num_sequences * g.params.max_tokens for g in groups)
        step = 0
        while scheduler.has_unfinished:
            t0 = time.perf_counter()
            scheduled = scheduler.schedule()
            if scheduled.is_empty and not scheduled.preempted:
                raise InvalidArgumentError(
                    f"the scheduler is stuck: {len(scheduler.waiting)} waiting request(s) fit in none of the "
                    f"{self.memory.free_blocks:,} free blocks and nothing runs (use more blocks or shorter requests)"
                )
            scheduler.allocate(scheduled)  # appends each decoding sequence's token: EngineMemory.grow
            for request, seq_id, src, dst in self.memory.cow_log:
                recorder.cow_events.append((step, request, seq_id, src, dst))
            cows = len(self.memory.cow_log)
            self.memory.cow_log.clear()
            kv_read = self._execute(scheduled) if not scheduled.is_empty else 0
            outcome = scheduler.postprocess(scheduled)
            for group in groups:
                for seq in group.seqs:
                    request_of[seq.seq_id] = group.request_id
            attention_ms = self.model.attention_ms if not scheduled.is_empty else 0.0
            self._record(
                scheduler, scheduled, outcome, recorder, (step, started, t0), attention_ms, kv_read, cows
            )
            recorder.maybe_snapshot(
                step, lambda s: self._snapshot(s, request_of), not scheduler.has_unfinished
            )
            step += 1
            if progress is not None:
                done = sum(sum(s.num_output for s in (*g.seqs, *g.finished)) for g in groups)
                progress(min(done / target, 1.0) if scheduler.has_unfinished else 1.0)
        outputs = [finish_group_outputs(g, self.tokenizer) for g in groups]
        self.last_run = EngineRun(
            recorder.steps_frame(),
            recorder.snapshots,
            recorder.cow_frame(),
            pd.DataFrame(
                {
                    "request_id": [g.request_id for g in groups],
                    "prompt_len": [len(g.prompt_token_ids) for g in groups],
                    "output_tokens": [sum(len(o.token_ids) for o in out.outputs) for out in outputs],
                    "preemptions": [g.num_preemptions for g in groups],
                    "cached_tokens": [g.num_cached_tokens for g in groups],
                }
            ),
            self.manager.num_blocks,
            self.manager.block_size,
            time.perf_counter() - started,
        )
        return outputs

    def _snapshot(self, step: int, request_of: dict) -> EngineSnapshot:
        blocks = self.manager.snapshot()
        return EngineSnapshot(step, blocks, {s: request_of.get(s, -1) for s in blocks.seq_ids})

    def _prefill_pieces(self, scheduled: ScheduledStep) -> list[tuple[SequenceGroup, Sequence, int, int]]:
        """The scheduler's group chunks (group, start, tokens) as (group, sequence, first position, tokens): a
        group's prefill is the concatenation of its `prefill_plan` (see EngineMemory.admit)."""
        pieces = []
        for group, start, count in scheduled.prefill_chunks:
            offset = 0
            for seq, todo in group.prefill_plan:
                lo, hi = max(start, offset), min(start + count, offset + todo)
                if lo < hi:
                    first = seq.num_allocated - todo + (lo - offset)
                    pieces.append((group, seq, first, hi - lo))
                offset += todo
        return pieces

    def _execute(self, scheduled: ScheduledStep) -> int:
        """Run the forward pass of the step and sample; returns the KV tokens the step's attention read."""
        mem = self.memory
        decode_seqs = [s for g in scheduled.decoding for s in g.seqs]
        tokens = [s.token_ids[-1] for s in decode_seqs]
        positions = [s.num_allocated - 1 for s in decode_seqs]
        slots = [s.pending_slot for s in decode_seqs]
        dec_tables = [self.manager.block_table(s.seq_id) for s in decode_seqs]
        dec_lens = [s.num_allocated for s in decode_seqs]
        pre_tables, pre_ctx, pre_q, last_index = [], [], [], []
        logits_owner: list[list[Sequence]] = [[s] for s in decode_seqs]
        pieces = self._prefill_pieces(scheduled)
        for group, seq, start, chunk in pieces:
            tokens += seq.token_ids[start : start + chunk]
            positions += range(start, start + chunk)
            slots += mem.slots(seq, start, start + chunk).tolist()
            pre_tables.append(self.manager.block_table(seq.seq_id))
            pre_ctx.append(start + chunk)
            pre_q.append(chunk)
            if start + chunk == seq.num_allocated:  # the prefill of this sequence ends: its logits are needed
                owners = [seq] if group.started_sampling else group.seqs  # forked samples share the prompt
                logits_owner.append(owners)
                last_index.append(len(tokens) - 1)
        batch = self._batch(
            tokens, positions, slots, dec_tables, dec_lens, pre_tables, pre_ctx, pre_q, last_index
        )
        logits = self.model.forward(batch, self.cache)  # [len(logits_owner), vocab]
        for seq in decode_seqs:
            mem.mark_computed(seq, seq.num_allocated)
        for group, seq, start, chunk in pieces:
            for owner in [seq] if group.started_sampling else group.seqs:
                mem.mark_computed(owner, start + chunk)
        for row, owners in enumerate(logits_owner):
            for seq in owners:
                seq.pending_logits = logits[row]
        eos = self.config.eos_token_ids
        touched = dict.fromkeys([*scheduled.decoding, *(g for g, _, _ in scheduled.prefill_chunks)])
        for group in touched:
            if group.seqs and all(s.pending_logits is not None for s in group.seqs):
                process_group(group, mem, self._new_seq_id, eos)
        window = self.manager.sliding_window
        if window is None:
            return sum(dec_lens) + sum(pre_ctx)
        # a decode query reads its last W positions; a chunk of q tokens reads the q + W - 1 positions before it
        decode_read = sum(min(n, window) for n in dec_lens)
        return decode_read + sum(min(n, q + window - 1) for n, q in zip(pre_ctx, pre_q, strict=True))

    def _batch(self, tokens, positions, slots, dec_tables, dec_lens, pre_tables, pre_ctx, pre_q, last_index):
        device = self.model.device

        def table_tensor(tables):
            width = max((len(t) for t in tables), default=0)
            array = np.zeros((len(tables), max(width, 1)), dtype=np.int32)
            for row, table in enumerate(tables):
                array[row, : len(table)] = table
            return torch.from_numpy(array).to(device)

        def longs(values):
            return torch.tensor(values, dtype=torch.long, device=device)

        num_decode = len(dec_lens)
        return ForwardBatch(
            token_ids=longs(tokens),
            positions=longs(positions),
            slot_mapping=longs(slots),
            num_decode=num_decode,
            decode_block_tables=table_tensor(dec_tables),
            decode_context_lens=longs(dec_lens),
            prefill_block_tables=table_tensor(pre_tables),
            prefill_context_lens=longs(pre_ctx),
            prefill_query_lens=longs(pre_q),
            logits_indices=longs(list(range(num_decode)) + last_index),
        )

    def _record(self, scheduler, scheduled, outcome, recorder, when, attention_ms, kv_read, cows):
        step, started, t0 = when
        usage = self.memory.usage(self.memory.live_seqs())
        free = self.manager.num_free_blocks
        bs = self.manager.block_size
        now = time.perf_counter()
        recorder.add(
            {
                "step": step,
                "time_s": now - started,
                "step_time_ms": (now - t0) * 1e3,
                "running": scheduled.num_running,
                "running_seqs": scheduled.num_running_seqs,
                "waiting": scheduled.num_waiting,
                "swapped": 0,
                "preemptions": len(scheduled.preempted),
                "preemptions_total": scheduler.num_preemptions,
                "free_blocks": free,
                "free_slots": free * bs,
                "token_states": usage["token_states"],
                "reservation": usage["reservation"],
                "internal_fragmentation": usage["internal_fragmentation"],
                "allocator_slack": 0,
                "external_fragmentation": free * bs,
                "tokens_generated": outcome.tokens_generated,
                "prefill_tokens": outcome.prefill_tokens,
                "kv_tokens_read": kv_read,
                "prefix_hit_tokens": scheduled.prefix_hit_tokens,
                "shared_blocks": usage["shared_blocks"],
                "cow_copies": cows,
                "attention_ms": attention_ms,
                "blocks_in_use": usage["blocks_in_use"],
                "blocks_without_sharing": usage["blocks_without_sharing"],
            }
        )
