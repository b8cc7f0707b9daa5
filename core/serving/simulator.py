"""Replay a serving workload through an iteration-level (continuous batching) scheduler, as vLLM does, under a
paged or a contiguous KV policy, and record step by step where the KV memory goes.

Scheduler (one iteration = one step):
1. Every running, decoding sequence gets one token. Under the paged policy, if the free blocks cannot take this
   step's new blocks, the newest running request is preempted (all its sequences together), repeatedly:
   `recompute` frees its blocks and puts it back at the front of the waiting queue (its prompt and generated
   tokens are prefilled again); `swap` moves its blocks to CPU swap space (falling back to recompute when that is
   full) and brings it back, before any new request, once the blocks are free again.
2. The step's token budget is `max_num_batched_tokens` minus the decode tokens. Prompts being prefilled continue
   (oldest first), then waiting requests are admitted first-come first-served while the budget, `max_num_seqs` and
   memory allow (paged: the prompt's blocks plus a 1% watermark are free; contiguous: the buddy allocator places
   the policy's reservation). A prompt larger than the budget is prefilled in chunks over several steps; the step
   that finishes a prefill emits the request's first output token. Nothing new is admitted in a step that
   preempted, or while swapped requests wait.
3. The step takes `StepTimeModel.step_time` seconds; requests that emitted their last token are freed.

Steps in which nothing but decoding happens are replayed in one batch (identical bookkeeping, recorded per step),
which is what makes 10,000-request runs take seconds; the paged policy still calls `BlockManager.append_token`
for every token of every sequence.
"""

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core.errors import InvalidArgumentError
from core.serving.memory_policies import ContiguousMemory, Group, PagedMemory, Policy
from core.serving.step_time import StepTimeModel, opt_13b_a100
from core.serving.workload import Request

PAPER_KV_TOKENS = 15_728  # OPT-13B on one A100-40GB: 12 GiB of KV / 800 KiB per token (paper Table 1: 15.7K)

COLUMNS = (
    "step",
    "time_s",
    "step_time_ms",
    "running",
    "running_seqs",
    "waiting",
    "swapped",
    "preemptions",
    "preemptions_total",
    "free_blocks",
    "free_slots",
    "token_states",
    "reservation",
    "internal_fragmentation",
    "allocator_slack",
    "external_fragmentation",
    "tokens_generated",
    "prefill_tokens",
    "kv_tokens_read",
    "prefix_hit_tokens",
)
_COL = {name: i for i, name in enumerate(COLUMNS)}
# columns that stay constant through a batched decode-only stretch, and those the last row takes after the frees
_CONST = [
    _COL[c]
    for c in (
        "running",
        "running_seqs",
        "swapped",
        "preemptions",
        "preemptions_total",
        "allocator_slack",
        "tokens_generated",
        "prefill_tokens",
        "prefix_hit_tokens",
    )
]
_LAST = [
    _COL[c]
    for c in (
        "token_states",
        "reservation",
        "internal_fragmentation",
        "allocator_slack",
        "free_slots",
        "free_blocks",
    )
]


@dataclass(frozen=True)
class SimulatorConfig:
    """Engine limits and hardware of a simulation.

    kv_capacity_tokens: KV slots of the whole cache (tokens). Paged: capacity // block_size blocks.
    max_num_seqs: running sequences at most (parallel samples count one each). max_num_batched_tokens: tokens per
    step (decode + prefill); must be >= max_num_seqs. max_seq_len: prompt + output limit (2048 as in the paper).
    preemption_mode: "recompute" or "swap"; swap_space_bytes: CPU swap space (vLLM's default 4 GiB).
    watermark: fraction of blocks kept free when admitting (vLLM's 0.01). step_time: the roofline step model.
    max_snapshots: block-table snapshots (paged) and batch context lengths kept, at evenly spaced steps.
    """

    kv_capacity_tokens: int = PAPER_KV_TOKENS
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_seq_len: int = 2048
    preemption_mode: str = "recompute"
    swap_space_bytes: float = 4 * 1024**3
    watermark: float = 0.01
    step_time: StepTimeModel = field(default_factory=opt_13b_a100)
    max_snapshots: int = 100

    def __post_init__(self):
        for name in (
            "kv_capacity_tokens",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_seq_len",
            "max_snapshots",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InvalidArgumentError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes one token per step"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise InvalidArgumentError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}"
            )
        if not 0 <= self.watermark < 1:
            raise InvalidArgumentError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if not self.swap_space_bytes >= 0:
            raise InvalidArgumentError(f"swap_space_bytes must be >= 0, got {self.swap_space_bytes!r}")


@dataclass(frozen=True, eq=False)
class StepSnapshot:
    """The state after one sampled step.

    context_lens: int64 [num decoding sequences], tokens each decoding sequence attends to at that step.
    Paged only (None otherwise), indexed by physical block id: owner_request (request id of the first live
    sequence holding the block, -1 when free), ref_count, fill (tokens stored), is_cached (holds a prefix-cache
    block, owned or free); block_tables: int32 [num decoding sequences, max blocks], row i the block table of the
    sequence of context_lens[i], padded with -1.
    """

    step: int
    time_s: float
    context_lens: np.ndarray
    owner_request: np.ndarray | None = None
    ref_count: np.ndarray | None = None
    fill: np.ndarray | None = None
    is_cached: np.ndarray | None = None
    block_tables: np.ndarray | None = None


@dataclass(eq=False)
class SimulationResult:
    """steps: one row per step, columns `COLUMNS` (slots are KV token positions; `time_s` is the end of the step;
    `free_blocks` is the free-list size: free blocks for paged, free buddy blocks for contiguous).
    requests: one row per request (arrival_time, first_token_time, finish_time in seconds; lengths in tokens).
    summary: see `summarize`. snapshots: sampled `StepSnapshot`s in step order."""

    policy: Policy
    config: SimulatorConfig
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    snapshots: list[StepSnapshot]
    wall_s: float

    def summarize(self, t_start: float | None = None, t_end: float | None = None) -> dict:
        return summarize(self.steps, self.requests, self.config.kv_capacity_tokens, t_start, t_end)


def summarize(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    capacity: int,
    t_start: float | None = None,
    t_end: float | None = None,
) -> dict:
    """Figure 2 breakdown and serving metrics over the steps that end in [t_start, t_end] (default: all).

    The four `*_pct` are shares of the whole KV capacity averaged over time (each step weighted by its duration):
    token states, reservation, internal fragmentation, external fragmentation & others (allocator slack + free
    slots); they sum to 100. avg_batched_requests: mean requests in the batch per step. throughput: generated
    tokens / simulated seconds. mean_normalized_latency_s: mean over finished requests of (finish - arrival) /
    output_len, seconds per token. preemptions: preemption events in the window.
    """
    sel = steps
    if t_start is not None:
        sel = sel[sel["time_s"] >= t_start]
    if t_end is not None:
        sel = sel[sel["time_s"] <= t_end]
    out: dict = {"num_steps": len(sel)}
    if len(sel) == 0:
        return out | {
            "token_states_pct": 0.0,
            "reservation_pct": 0.0,
            "internal_fragmentation_pct": 0.0,
            "external_fragmentation_pct": 100.0,
            "avg_batched_requests": 0.0,
            "preemptions": 0,
        }
    weight = sel["step_time_ms"].to_numpy()
    total = weight.sum() * capacity

    def share(values) -> float:
        return float(100.0 * (np.asarray(values, dtype=np.float64) * weight).sum() / total)

    out["token_states_pct"] = share(sel["token_states"])
    out["reservation_pct"] = share(sel["reservation"])
    out["internal_fragmentation_pct"] = share(sel["internal_fragmentation"])
    out["external_fragmentation_pct"] = share(sel["external_fragmentation"])
    out["avg_batched_requests"] = float(sel["running"].mean())
    out["avg_batched_seqs"] = float(sel["running_seqs"].mean())
    out["preemptions"] = int(sel["preemptions"].sum())
    duration = float(weight.sum() / 1000.0)
    out["duration_s"] = duration
    generated = float(sel["tokens_generated"].sum())
    out["tokens_generated"] = int(generated)
    out["throughput_tokens_per_s"] = generated / duration if duration > 0 else 0.0
    out["mean_step_time_ms"] = float(weight.mean())
    done = requests.dropna(subset=["finish_time"])
    if t_start is not None:
        done = done[done["finish_time"] >= t_start]
    if t_end is not None:
        done = done[done["finish_time"] <= t_end]
    out["requests_finished"] = len(done)
    if len(done):
        latency = done["finish_time"] - done["arrival_time"]
        out["requests_per_s"] = len(done) / duration if duration > 0 else 0.0
        out["mean_latency_s"] = float(latency.mean())
        out["mean_normalized_latency_s"] = float((latency / done["output_len"]).mean())
        out["mean_ttft_s"] = float((done["first_token_time"] - done["arrival_time"]).mean())
    queries = float(sel["prefill_tokens"].sum() + sel["prefix_hit_tokens"].sum())
    out["prefix_hit_tokens"] = int(sel["prefix_hit_tokens"].sum())
    out["prefix_hit_rate"] = float(sel["prefix_hit_tokens"].sum() / queries) if queries else 0.0
    return out


def prompt_token_ids(req: Request, prefix_index: int | None) -> list[int]:
    """Token ids standing in for a prompt: the shared prefix's ids depend on its group only, the rest are unique to
    the request, so prefix caching hits exactly the shared system prompt."""
    plen = req.prefix_len if prefix_index is not None else 0
    base = 1_000_000_000 + (prefix_index or 0) * 4096
    own = 2_000_000_000 + req.request_id * 4096
    return [base + j for j in range(plen)] + [own + j for j in range(plen, req.prompt_len)]


class _Recorder:
    """Per-step rows in a growing float64 buffer [steps, len(COLUMNS)]."""

    def __init__(self):
        self.buf = np.empty((4096, len(COLUMNS)))
        self.size = 0

    def reserve(self, rows: int) -> None:
        if self.size + rows > len(self.buf):
            grown = np.empty((max(2 * len(self.buf), self.size + rows), len(COLUMNS)))
            grown[: self.size] = self.buf[: self.size]
            self.buf = grown

    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.buf[: self.size], columns=list(COLUMNS))
        ints = [c for c in COLUMNS if c not in ("time_s", "step_time_ms")]
        return frame.astype(dict.fromkeys(ints, np.int64))


def _validate_requests(requests: Sequence[Request], config: SimulatorConfig) -> list[Request]:
    if len(requests) == 0:
        raise InvalidArgumentError("the workload has no requests")
    for req in requests:
        if not isinstance(req, Request):
            raise InvalidArgumentError(
                f"requests must be core.serving.workload.Request objects, got {type(req)}"
            )
        if req.prompt_len + req.output_len > config.max_seq_len:
            raise InvalidArgumentError(
                f"request {req.request_id}: prompt {req.prompt_len} + output {req.output_len} tokens exceeds "
                f"max_seq_len {config.max_seq_len}"
            )
        if req.n > config.max_num_seqs or req.n > 1024:
            raise InvalidArgumentError(
                f"request {req.request_id}: n={req.n} parallel samples exceeds max_num_seqs "
                f"{config.max_num_seqs} (or 1,024)"
            )
    ordered = sorted(requests, key=lambda r: r.arrival_time)
    return ordered


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    config: SimulatorConfig | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """Run the workload to completion under `policy`; deterministic for given requests.

    progress(fraction) is called with the fraction of requests finished (at most ~100 times, last with 1.0).
    Raises InvalidArgumentError for a request that can never run (longer than max_seq_len, or larger than the
    cache alone) or a bad config.
    """
    started = time.perf_counter()
    config = config or SimulatorConfig()
    if not isinstance(policy, Policy):
        raise InvalidArgumentError(f"policy must be a core.serving.memory_policies.Policy, got {policy!r}")
    reqs = _validate_requests(requests, config)
    capacity = int(config.kv_capacity_tokens)
    if policy.is_paged:
        mem = PagedMemory(policy, capacity, config.watermark)
    else:
        mem = ContiguousMemory(policy, capacity, config.max_seq_len)
    for req in reqs:
        mem.check_fits(req, config.max_seq_len)
    paged = policy.is_paged
    bs = policy.block_size
    model = config.step_time
    kv_bytes = model.kv_bytes_per_token
    swap_capacity_blocks = int(config.swap_space_bytes // (kv_bytes * bs)) if kv_bytes > 0 else 1 << 62
    swap_used_blocks = 0
    swap = config.preemption_mode == "swap"

    prefix_ids: dict = {}
    groups = []
    for index, req in enumerate(reqs):
        pidx = None
        if req.prefix_group is not None and req.prefix_len > 0:
            pidx = prefix_ids.setdefault(req.prefix_group, len(prefix_ids))
        groups.append(Group(req, index, prompt_token_ids(req, pidx) if paged else []))
    total = len(groups)
    arrivals = np.array([r.arrival_time for r in reqs], dtype=np.float64)
    output_lens = [r.output_len for r in reqs]

    req_ids = np.array([r.request_id for r in reqs] + [-1], dtype=np.int64)  # group index -> request id
    rec = _Recorder()
    snapshots: list[StepSnapshot] = []
    stride = 1
    waiting: deque[Group] = deque()
    swapped: deque[Group] = deque()
    running: list[Group] = []
    now = 0.0
    step = 0
    ai = 0
    finished = 0
    preemptions_total = 0
    next_report = 1  # percent
    max_seqs, max_tokens = config.max_num_seqs, config.max_num_batched_tokens

    def take_snapshot(decoding: list[Group]) -> None:
        nonlocal stride, snapshots
        lens = np.array([g.length for g in decoding for _ in range(g.n)], dtype=np.int64)
        if paged:
            snap = mem.manager.snapshot()
            width = int(-(-lens.max() // bs)) if len(lens) else 0
            tables = np.full((len(lens), width), -1, dtype=np.int32)
            row = 0
            for g in decoding:
                for sid in g.seq_ids:
                    table = snap.block_tables[sid]
                    tables[row, : len(table)] = table
                    row += 1
            owners = np.array([sid // 1024 for sid in snap.seq_ids] + [-1], dtype=np.int64)
            owner_group = owners[snap.owner]  # -1 indexes the trailing -1
            snapshots.append(
                StepSnapshot(
                    step - 1,
                    now,
                    lens,
                    req_ids[owner_group].astype(np.int32),
                    snap.ref_count.astype(np.int16),
                    snap.fill.astype(np.int16),
                    snap.is_cached.copy(),
                    tables,
                )
            )
        else:
            snapshots.append(StepSnapshot(step - 1, now, lens))
        if len(snapshots) > config.max_snapshots:
            stride *= 2
            snapshots = [s for s in snapshots if s.step % stride == 0]

    def preempt(victim: Group) -> tuple[int, float]:
        """Free the victim's memory; returns (blocks freed, swap bytes moved)."""
        nonlocal swap_used_blocks
        victim.preemptions += 1
        if swap and victim.todo == 0:
            blocks = mem.blocks_for(victim.req.prompt_len, victim.length - victim.req.prompt_len, victim.n)
            if swap_used_blocks + blocks <= swap_capacity_blocks:
                swap_used_blocks += blocks
                freed = mem.release(victim)
                swapped.append(victim)
                return freed, blocks * bs * kv_bytes
        freed = mem.release(victim)
        victim.todo = 0
        waiting.appendleft(victim)
        return freed, 0.0

    while finished < total:
        while ai < total and arrivals[ai] <= now:
            waiting.append(groups[ai])
            ai += 1
        if not running and not waiting and not swapped:
            now = float(arrivals[ai])
            continue

        # 1. decode memory (paged): preempt the newest requests until this step's new blocks fit
        decoding = [g for g in running if g.todo == 0]
        preempted = 0
        swap_bytes = 0.0
        need = 0
        if paged and decoding:
            for g in decoding:
                if g.length % bs == 0:
                    need += g.n
                elif g.shared_tail:
                    need += g.n - 1
            free = mem.free_blocks
            while need > free:
                victim = running.pop()
                if victim.todo == 0:
                    decoding.pop()
                    if victim.length % bs == 0:
                        need -= victim.n
                    elif victim.shared_tail:
                        need -= victim.n - 1
                freed, moved = preempt(victim)
                free += freed
                swap_bytes += moved
                preempted += 1
        preemptions_total += preempted
        n_decode = sum(g.n for g in decoding)
        budget = max_tokens - n_decode
        seqs = sum(g.n for g in running)
        chunks: list[tuple[Group, int, int]] = []  # (group, tokens, prior context)
        hit_tokens = 0
        swapped_in = False

        if not preempted:
            # 2a. swapped requests come back first (all their blocks, already computed)
            while swapped and seqs + swapped[0].n <= max_seqs:
                g = swapped[0]
                gen = g.length - g.req.prompt_len
                emitted = g.emitted
                g.emitted = gen
                ok = mem.admit(g, need)
                g.emitted = emitted
                if not ok:
                    break
                swapped.popleft()
                mem.prefill(g, g.todo)
                blocks = mem.blocks_for(g.req.prompt_len, gen, g.n)
                swap_used_blocks -= blocks
                swap_bytes += blocks * bs * kv_bytes
                running.append(g)
                seqs += g.n
                swapped_in = True
        # 2b. prompts being prefilled continue, oldest first
        for g in running:
            if budget <= 0:
                break
            if g.todo > 0:
                c = min(g.todo, budget)
                chunks.append((g, c, g.todo_total - g.todo))
                budget -= c
        # 2c. admit waiting requests, first come first served
        if not preempted and not swapped:
            while waiting and budget > 0 and seqs + waiting[0].n <= max_seqs:
                g = waiting[0]
                if not mem.admit(g, need):
                    break
                waiting.popleft()
                if g.admit_step < 0:
                    g.admit_step = step
                running.append(g)
                seqs += g.n
                hit_tokens += mem.hit_tokens
                c = min(g.todo, budget)
                chunks.append((g, c, 0))
                budget -= c

        if not decoding and not chunks:
            if swapped_in or preempted:
                continue
            raise InvalidArgumentError(
                f"the scheduler is stuck at step {step}: {len(waiting)} waiting request(s) fit in no free memory "
                f"and nothing runs (check the KV capacity and the scheduler limits)"
            )

        # 3. how many identical decode-only steps can run at once
        ctx = 0
        for g in decoding:
            ctx += g.n * g.length
        k = 1
        if not chunks and not preempted and not swapped_in:
            k = min(output_lens[g.index] - g.emitted for g in decoding)
            k = min(k, (-step) % stride + 1, 8192)
        cum_need = None
        if k > 1 and paged:
            lengths = np.fromiter((g.length for g in decoding), np.int64, len(decoding))
            ns = np.fromiter((g.n for g in decoding), np.int64, len(decoding))
            shared = np.fromiter((g.shared_tail for g in decoding), np.int64, len(decoding))
            cum_need = mem.decode_need(lengths, ns, shared, k)
            k = max(1, min(k, int(np.searchsorted(cum_need, mem.free_blocks, side="right"))))
        if k > 1:
            j = np.arange(k, dtype=np.float64)
            dts = model.step_time(n_decode, ctx + j * n_decode, ctx + (j + 1) * n_decode)
            if not waiting and not swapped and ai < total:
                ends = now + np.cumsum(dts)
                k = min(k, int(np.searchsorted(ends, arrivals[ai], side="left")) + 1)
                dts = dts[:k]
            end_times = now + np.cumsum(dts)
            end = float(end_times[-1])
            prior = 0
        else:
            prefill_tokens = 0
            prior = 0
            pairs = ctx + n_decode
            for _, c, p in chunks:
                prefill_tokens += c
                prior += p
                pairs += c * p + c * (c + 1) / 2
            dt = model.step_seconds(n_decode + prefill_tokens, ctx + prior, pairs, swap_bytes)
            if dt == 0.0:  # only a swap-in: the transfer alone
                dt = swap_bytes / model.swap_bandwidth
            end = now + dt

        # 4. execute
        if k > 1:
            m0 = mem.metrics()
            cow = sum((g.n - 1) * (g.length % bs) for g in decoding if g.shared_tail) if paged else 0
        mem.decode(decoding, k)
        for g in decoding:
            g.emitted += k
        prefill_total = 0
        generated = n_decode * k
        for g, c, _ in chunks:
            mem.prefill(g, c)
            prefill_total += c
            if g.todo == 0:
                g.emitted += 1
                generated += g.n
                if math.isnan(g.first_token_time):
                    g.first_token_time = end
        done = [g for g in running if g.todo == 0 and g.emitted >= output_lens[g.index]]
        num_running = len(running)
        if done:
            for g in done:
                g.finish_time = end
                mem.release(g)
                finished += 1
            done_ids = {id(g) for g in done}
            running = [g for g in running if id(g) not in done_ids]
        m1 = mem.metrics()

        # 5. record k rows (the last one after this step's frees)
        rec.reserve(k)
        if k == 1:
            rec.buf[rec.size] = (
                step,
                end,
                (end - now) * 1000.0,
                num_running,
                seqs,
                len(waiting),
                len(swapped),
                preempted,
                preemptions_total,
                m1[5],
                m1[4],
                m1[0],
                m1[1],
                m1[2],
                m1[3],
                m1[3] + m1[4],
                generated,
                prefill_total,
                ctx + n_decode + prior,
                hit_tokens,
            )
        else:
            rows = rec.buf[rec.size : rec.size + k]
            grow = cow + n_decode * np.arange(1, k + 1)
            ts = m0[0] + grow
            rows[:, _CONST] = (num_running, seqs, len(swapped), 0, preemptions_total, m0[3], n_decode, 0, 0)
            rows[:, _COL["step"]] = np.arange(step, step + k)
            rows[:, _COL["time_s"]] = end_times
            rows[:, _COL["step_time_ms"]] = dts * 1000.0
            starts = end_times - dts
            rows[:, _COL["waiting"]] = len(waiting) + np.searchsorted(arrivals, starts, side="right") - ai
            rows[:, _COL["token_states"]] = ts
            if paged:
                free_b = m0[5] - cum_need[:k]
                rows[:, _COL["free_blocks"]] = free_b
                rows[:, _COL["free_slots"]] = free_b * bs
                rows[:, _COL["reservation"]] = m0[1]
                rows[:, _COL["internal_fragmentation"]] = (mem.num_blocks - free_b) * bs - ts - m0[1]
            else:
                rows[:, _COL["free_blocks"]] = m0[5]
                rows[:, _COL["free_slots"]] = m0[4]
                rows[:, _COL["reservation"]] = m0[1] - grow
                rows[:, _COL["internal_fragmentation"]] = m0[2]
            rows[-1, _LAST] = (m1[0], m1[1], m1[2], m1[3], m1[4], m1[5])
            rows[:, _COL["external_fragmentation"]] = (
                rows[:, _COL["allocator_slack"]] + rows[:, _COL["free_slots"]]
            )
            rows[-1, _COL["tokens_generated"]] = generated - n_decode * (k - 1)
            rows[:, _COL["kv_tokens_read"]] = ctx + n_decode * np.arange(1, k + 1)
        rec.size += k
        step += k
        now = end
        if (step - 1) % stride == 0:
            take_snapshot([g for g in running if g.todo == 0])
        if progress is not None and finished * 100 >= next_report * total:
            progress(finished / total)
            next_report = finished * 100 // total + 1

    if progress is not None:
        progress(1.0)
    steps_frame = rec.frame()
    requests_frame = pd.DataFrame(
        {
            "request_id": [g.req.request_id for g in groups],
            "arrival_time": arrivals,
            "first_token_time": [g.first_token_time for g in groups],
            "finish_time": [g.finish_time for g in groups],
            "prompt_len": [g.req.prompt_len for g in groups],
            "output_len": output_lens,
            "n": [g.n for g in groups],
            "preemptions": [g.preemptions for g in groups],
        }
    )
    summary = summarize(steps_frame, requests_frame, capacity)
    return SimulationResult(
        policy, config, steps_frame, requests_frame, summary, snapshots, time.perf_counter() - started
    )
