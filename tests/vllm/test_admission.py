"""Admission under KV pressure against a running vLLM: a request whose prompt is mostly cached is admitted when
the blocks past its hit fit, not when its whole prompt would (vLLM V1's `allocate_slots` check, which
`core.kv.scheduler_memory.KVSchedulerMemory.can_admit` now makes).

Two long requests run on the server's 63 usable blocks of 32 tokens: A (a 600-token prompt P, 19 blocks, growing
by 250 outputs) and F (800 tokens, 25 blocks, growing by 180). While they decode, B = P + 32 tokens of its own (632
tokens, 20 blocks counted without hits) is sent for one output token. About 17 blocks are free then: counted
without hits B would wait for A or F to finish (seconds of decoding on 2 cores); counted as vLLM counts it, B
needs only its 2 blocks past the 18 full blocks A holds, so it is admitted and finishes while both still run.
The lab's memory, given the same blocks (the same prompts allocated and grown as far as the server had them when B
was sent), makes the same decision, and the formula it replaced would not have.
"""

import json
import threading
import time
import urllib.request

from core.kv.kv_cache_manager import KVCacheManager
from core.kv.scheduler_memory import KVSchedulerMemory
from core.kv.specs import FullAttentionSpec
from core.live.metrics import parse_vllm_metrics


class _Group:
    """One sequence with fixed tokens, as the scheduler hands groups to the memory."""

    def __init__(self, gid: int, tokens: list[int]):
        self.request_id, self.seq_ids, self.num_seqs = gid, [gid], 1
        self.prompt_len = len(tokens)
        self._tokens = tokens

    def token_ids(self, index: int, start: int, stop: int) -> list[int]:
        return self._tokens[start:stop]


def _metrics(server):
    return parse_vllm_metrics(server.get("/metrics").decode())


def test_a_mostly_cached_prompt_is_admitted_as_vllm_admits_it(real_vllm):
    block_size = real_vllm.block_size
    usable = real_vllm.num_gpu_blocks_override - 1  # vLLM's block 0 is its null block
    prompt_a = [1000 + (7 * i) % 30_000 for i in range(600)]
    prompt_f = [2000 + (11 * i) % 30_000 for i in range(800)]
    prompt_b = prompt_a + [40_000 + i for i in range(32)]
    real_vllm.reset_prefix_cache()
    ended: dict[str, str] = {}  # how A and F ended: "finished" (all their tokens) or "stopped" (by this test)
    stop = threading.Event()

    def send(name, prompt, max_tokens):
        """Stream the request; once B is done, close the connection (vLLM aborts a request whose client left)."""
        body = {"model": real_vllm.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        body |= {"ignore_eos": True, "stream": True}
        request = urllib.request.Request(
            real_vllm.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            for line in response:
                if line.strip() == b"data: [DONE]":
                    ended[name] = "finished"
                    return
                if stop.is_set():
                    ended[name] = "stopped"
                    return

    threads = [
        threading.Thread(target=send, args=("A", prompt_a, 250)),
        threading.Thread(target=send, args=("F", prompt_f, 180)),
    ]
    for thread in threads:
        thread.start()
    deadline = time.perf_counter() + 120
    while (_metrics(real_vllm).num_requests_running or 0) < 2 and time.perf_counter() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # both prefilled and decoding (the running gauge counts a request from its admission)
    # vLLM's usage = 1 - free / (blocks less the null block): the free blocks B meets, give or take the blocks
    # A and F take while B's request travels (one per 32 of their outputs)
    free = round((1.0 - _metrics(real_vllm).kv_cache_usage) * usable)
    assert not ended, "A or F finished before B was sent: the server was too fast for this check"
    real_vllm.complete(prompt_b, max_tokens=1)
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    assert ended == {"A": "stopped", "F": "stopped"}  # B was admitted and done while both still ran
    deadline = time.perf_counter() + 60  # the server aborts both once their streams are closed
    while (_metrics(real_vllm).num_requests_running or 0) and time.perf_counter() < deadline:
        time.sleep(0.05)

    # The lab's memory in the state B met: the same pool, A's prompt computed and held (its full blocks cached),
    # the rest of the held blocks taken by F's prompt and outputs. Counted without hits B (20 blocks) would not
    # fit; counted as vLLM counts it (2 blocks past A's 18 full ones) it does, as the server admitted it.
    kv = KVCacheManager(
        [FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1)],
        usable,
        enable_prefix_caching=True,
    )
    memory = KVSchedulerMemory(kv, 0.0)
    kv.allocate(1, prompt_a)
    kv.mark_computed(1, len(prompt_a))
    f_tokens = prompt_f + [5] * 400  # F's prompt and outputs, as far as it had grown
    kv.allocate(2, f_tokens[: (usable - free - kv.num_held_blocks(1)[0]) * block_size])
    b = _Group(3, prompt_b)
    assert kv.num_free_blocks == free
    assert 2 <= free < memory.admission_blocks(b, len(prompt_b)) == 20
    assert kv.num_blocks_to_admit(prompt_b) == 2 and memory.can_admit(b, len(prompt_b), 0)
