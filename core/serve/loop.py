"""The engine loop of `core.serve`: one thread drives `Engine.step()` while requests arrive from HTTP handlers.

Continuous batching comes from the engine: a request added between steps joins the running batch at the next
step. Every request is added with `stream=True`, so each step reports every request that got tokens; the loop
turns that into vLLM's metrics (TTFT at a request's first token, one inter-token latency per later step that
gives it tokens, the per-request histograms at the end, one iteration_tokens_total observation per step) and
hands each output to the request's callback. A request counts as scheduled at the start of the first step after
which the scheduler runs it (or that finishes it): the time the engine's scheduler took it in that step. After
each step it sets the gauges (running, waiting, KV usage = 1 - free blocks / blocks, cached-free blocks counted
free as in vLLM), adds the preemption and prefix-cache deltas, and publishes the KV events the engine's KV cache
manager queued during the step (`engine.manager.take_events()`, from an engine built with `enable_kv_cache_events=True`:
BlockStored as computed blocks enter the prefix cache, BlockRemoved on eviction).

Only this thread steps the engine and touches its scheduler; `submit` and `abort` may run on any thread.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.engine import Engine, SamplingParams
from core.engine.sequence import RequestOutput
from core.errors import InvalidArgumentError
from core.serve.exporter import FinishedRequest, ServerMetrics
from core.serve.kv_publisher import ZmqEventPublisher

IDLE_WAIT_S = 0.05


@dataclass
class _Tracked:
    callback: Callable[[RequestOutput | None, str | None], None]
    arrival: float
    prompt_len: int = 0
    tokens: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None


class EngineLoop:
    def __init__(self, engine: Engine, metrics: ServerMetrics, publisher: ZmqEventPublisher | None = None):
        self.engine = engine
        self.metrics = metrics
        self.publisher = publisher
        if publisher is not None and not engine.enable_kv_cache_events:
            raise InvalidArgumentError(
                "publishing KV events needs an engine built with enable_kv_cache_events=True"
            )
        self._requests: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._preemptions = engine.scheduler.num_preemptions
        self._queries, self._hits = engine.manager.prefix_cache_queries, engine.manager.prefix_cache_hits
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def submit(
        self,
        request_id: str,
        prompt,
        params: SamplingParams,
        callback: Callable[[RequestOutput | None, str | None], None],
    ) -> None:
        """Queue a request; `callback(output, None)` is called (on the loop thread) after every step that gives
        it tokens, `callback(None, message)` if the engine fails. Raises InvalidArgumentError (bad prompt or
        params, a request that can never fit the pool) before anything is queued."""
        tracked = _Tracked(callback, time.perf_counter())
        with self._lock:
            self._requests[request_id] = tracked
        try:
            self.engine.add_request(prompt, params, request_id, stream=True)
        except BaseException:
            with self._lock:
                self._requests.pop(request_id, None)
            raise
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away); its blocks go back to the pool."""
        with self._lock:
            self._requests.pop(request_id, None)
        self.engine.abort_request(request_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.engine.has_unfinished_requests():
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                self._update_gauges()
                continue
            started = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as err:  # the engine dropped every request: tell each one
                with self._lock:
                    failed, self._requests = self._requests, {}
                for tracked in failed.values():
                    tracked.callback(None, f"the engine failed: {type(err).__name__}: {err}")
                continue
            self.steps += 1
            now = time.perf_counter()
            self._mark_scheduled(started, outputs)
            self._update_gauges()  # before any response completes: a client that then reads /metrics sees this step
            step_tokens = sum(self._deliver(out, now) for out in outputs)
            self.metrics.iteration_tokens.observe(step_tokens)

    def _mark_scheduled(self, started: float, outputs: list[RequestOutput]) -> None:
        """Record `started` as the scheduled time of every request the step ran for the first time."""
        ids = [g.request_id for g in self.engine.scheduler.running] + [o.request_id for o in outputs]
        with self._lock:
            for request_id in ids:
                tracked = self._requests.get(request_id)
                if tracked is not None and tracked.scheduled_at is None:
                    tracked.scheduled_at = started

    def _deliver(self, out: RequestOutput, now: float) -> int:
        """Observe `out`'s metrics and hand it to its callback; the tokens it adds to the step's
        iteration_tokens_total (its prompt at its first token, plus its new tokens)."""
        with self._lock:
            tracked = self._requests.get(out.request_id)
        if tracked is None:
            return 0  # aborted meanwhile
        tokens = sum(len(o.token_ids) for o in out.outputs)
        new = tokens - tracked.tokens
        m = self.metrics
        step_tokens = max(new, 0)
        if new > 0:
            if tracked.first_token_at is None:
                tracked.first_token_at = now
                m.ttft.observe(now - tracked.arrival)
                m.prompt_tokens.inc(len(out.prompt_token_ids))
                step_tokens += len(out.prompt_token_ids)
            else:
                m.itl.observe(now - tracked.last_token_at)
            tracked.last_token_at = now
            tracked.tokens = tokens
            m.generation_tokens.inc(new)
        if out.finished:
            reason = out.outputs[0].finish_reason if out.outputs else "abort"
            if tracked.first_token_at is None:  # finished without a token: only its e2e latency is defined
                m.e2e.observe(now - tracked.arrival)
                m.request_finished(reason)
            else:
                scheduled = tracked.arrival if tracked.scheduled_at is None else tracked.scheduled_at
                m.request_finished(
                    reason,
                    FinishedRequest(
                        tracked.arrival,
                        scheduled,
                        tracked.first_token_at,
                        tracked.last_token_at,
                        len(out.prompt_token_ids),
                        tracked.tokens,
                    ),
                )
            with self._lock:
                self._requests.pop(out.request_id, None)
        tracked.callback(out, None)
        return step_tokens

    def _update_gauges(self) -> None:
        engine, m = self.engine, self.metrics
        sched = engine.scheduler
        m.running.set(len(sched.running))
        m.waiting.set(len(sched.waiting) + len(getattr(sched, "swapped", ())))
        manager = engine.manager
        m.kv_usage.set(manager.usage)  # 1 - free / blocks; cached-free blocks count free
        if sched.num_preemptions > self._preemptions:
            m.preemptions.inc(sched.num_preemptions - self._preemptions)
            self._preemptions = sched.num_preemptions
        queries, hits = manager.prefix_cache_queries, manager.prefix_cache_hits
        if queries > self._queries:
            m.prefix_queries.inc(queries - self._queries)
            self._queries = queries
        if hits > self._hits:
            m.prefix_hits.inc(hits - self._hits)
            self._hits = hits
        if self.publisher is not None:
            self.publisher.publish(manager.take_events())
