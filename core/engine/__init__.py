"""A real Llama-family model (Llama, Mistral, Qwen2) served through the paged KV cache.

    from core.engine import Engine, SamplingParams
    engine = Engine.from_pretrained("path/to/hf_dir", num_blocks=256)   # or Engine.from_config(config_dict)
    outputs = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=32, temperature=0.0))
    outputs[0].outputs[0].token_ids, .cumulative_logprob, .finish_reason     # CompletionOutput

The loop (vLLM's / nano-vllm's shape; `generate` is this loop):
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8), request_id=None, stream=False)
    while engine.has_unfinished_requests():
        for out in engine.step():       # RequestOutputs finished this step (and streamed ones that progressed)
            ...
    engine.abort_request(rid)           # frees its blocks; False when no such request is unfinished
`add_request` / `abort_request` are safe from any thread; `step` runs under the engine's lock (one stepping
thread). `engine.current_run()` is the `EngineRun` of the steps since `engine.reset_metrics()`.

Per-step metrics and block snapshots of the last run: after `generate`, `engine.last_run` is an `EngineRun`:
- `engine.last_run.steps`: a pandas DataFrame, one row per engine step, columns `STEP_COLUMNS`: the serving
  simulator's `COLUMNS` (free_blocks, free_slots, token_states, reservation, internal_fragmentation,
  running, running_seqs, waiting, preemptions, preemptions_total, tokens_generated, prefill_tokens,
  kv_tokens_read, prefix_hit_tokens, ..., in KV token slots) plus shared_blocks, cow_copies, attention_ms,
  blocks_in_use, blocks_without_sharing, rest_of_model_ms, host_ms (see `core.engine.metrics`; per step
  attention_ms + rest_of_model_ms + host_ms == step_time_ms; `TIMED_COLUMNS` are the wall-clock ones).
- `engine.last_run.snapshots`: `core.sched.snapshots.StepSnapshot`s, the simulator's type (step, time_s,
  context_lens, pool, holder_request, decode_rows), at evenly spaced steps (the last step always); `pool` is the
  KV cache manager's `core.kv.KVCacheSnapshot` at that step (its holders `pool.request_ids` are the live
  sequences, one block table per KV cache group), `holder_request[i]` the prompt index owning holder i.
- `engine.last_run.cow_events` (step, request, seq_id, src_block, dst_block), `.requests`, `.sharing_saving()`.
Progress: `engine.generate(prompts, params, progress=callback)` calls `callback(fraction)` after every step with
the fraction (0..1) of the requested output tokens produced so far; the last call passes 1.0.
Logits: `generate(..., return_logits=True)` fills `CompletionOutput.logits` ([tokens, vocab] float32; not for
beam search).
Per-prompt settings: `generate(prompts, [SamplingParams(...), ...])` (one per prompt).
Scheduling: `core.sched.scheduler.Scheduler`, the one the serving simulator drives too, runs every step, with
`core.engine.memory.EngineMemory` (a `core.kv.KVCacheManager`, one block table per KV cache group over one pool,
plus the KVCache) as its `SchedulerMemory`; `engine.manager` is that manager.
Sharing as in the paper's Figure 15: `core.engine.sharing.measure_sharing` (one row per mode and width).
"""

from core.engine.config import ModelConfig
from core.engine.engine import Engine
from core.engine.metrics import STEP_COLUMNS, TIMED_COLUMNS, EngineRun
from core.engine.sampling import SamplingParams
from core.engine.sequence import CompletionOutput, RequestOutput

__all__ = [
    "STEP_COLUMNS",
    "TIMED_COLUMNS",
    "CompletionOutput",
    "Engine",
    "EngineRun",
    "ModelConfig",
    "RequestOutput",
    "SamplingParams",
]
