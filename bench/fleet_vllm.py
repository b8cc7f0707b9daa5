"""Two real vLLM replicas behind a test client's router, against the lab's fleet simulator: the fleet's prefix
hit rate measured per routing policy and predicted for the same load and the same blocks per replica. Prints one
JSON object.

    python bench/fleet_vllm.py                       # 8 prefix groups x 6 users, 21 blocks per replica
    python bench/fleet_vllm.py --groups 6 --users 4  # smaller
    python bench/fleet_vllm.py --out bench/results/fleet-vllm.json

The replicas: `.venv-vllm`'s `vllm serve` of SmolLM2-135M-Instruct as a Hugging Face folder (tests/vllm_server.py's
settings: block size 32, prefix caching, bf16, VLLM_CPU_KVCACHE_SPACE=1), each with `--num-gpu-blocks-override
BLOCKS` (vLLM keeps block 0 as its null block, so BLOCKS - 1 hold tokens), `--enforce-eager` (no compile: hit
rates do not depend on it), OMP_NUM_THREADS=1 and KV events, on free loopback ports; both are stopped (their
process groups) in every path, and started at once (their start is most of the run).

The load: `groups` shared prefixes of `prefix_blocks` x 32 random token ids, each asked by `users` users with a
question of `question_len` unique tokens, the (group, user) pairs in a seeded shuffled order, sent one at a time
(each finished before the next is sent) with max_tokens 1, greedy. The order is random, so round-robin sends each
prefix to both replicas; in the order groups x users it would partition them by chance.

The policies:
- round-robin: request k to replica k % 2 (what a plain load balancer does).
- prefix-aware: `core.serving.router.Router("prefix-aware")`, the simulator's own router, fed by what each
  replica's KV events say it caches: the client binds a SUB socket where each vLLM connects, folds its
  BlockStored / BlockRemoved / AllBlocksCleared into a `core.live.tree.CachedBlockTree`, and a replica's cached
  prefix of a prompt is the longest chain of the prompt's full blocks found in its tree by their tokens (as the
  Live page matches them, `core.live.fleet_prefixes`); nothing is in flight when a request is routed (one at a
  time), so the router's score is the uncached prompt tokens and ties go round-robin, as in the simulator. After
  each response the client waits for the chosen replica's event batches (up to EVENT_WAIT_S).

Measured: each replica's `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` deltas over the policy's requests
(tokens; the prefix cache is reset through /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1, before each policy),
the fleet's = their sums' ratio. Predicted: `core.serving.fleet.simulate_fleet` of the same requests (prompt
lengths, prefix groups, order; arrivals 10 s apart so each finishes before the next, as sent) on two replicas of
(BLOCKS - 1) x 32 tokens of KV each, paged with prefix caching at block size 32, no watermark (vLLM v1's
KVCacheManager keeps none), the same policy. Target: |predicted - measured| <= 0.1 per policy. Also reported: how
many requests the client's prefix-aware router sent where the simulator's did.
"""

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.kernels.cpu_isa import machine  # noqa: E402
from core.kv.events import decode_event_batch  # noqa: E402
from core.live.metrics import parse_vllm_metrics  # noqa: E402
from core.live.tree import DEFAULT_MEDIUM, CachedBlockTree  # noqa: E402
from core.planning.cost.step_model import StepTimeModel  # noqa: E402
from core.serve.launcher import free_port  # noqa: E402
from core.serve.vllm_env import find_vllm  # noqa: E402
from core.serve.vllm_server import VLLMServeConfig  # noqa: E402
from core.serving.fleet import Fleet, simulate_fleet  # noqa: E402
from core.serving.memory_policies import paged  # noqa: E402
from core.serving.router import Router  # noqa: E402
from core.serving.simulator import SimulatorConfig  # noqa: E402
from core.serving.workload import Request  # noqa: E402

BLOCK_SIZE = 32
SERVED_NAME = "smollm2"
TOPIC = "kv-events"
MAX_MODEL_LEN = 512
MAX_NUM_BATCHED_TOKENS = 2048
EVENT_WAIT_S = 1.0
START_TIMEOUT_S = 900
POLICIES = ("round-robin", "prefix-aware")
TARGET = 0.1
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


class Replica:
    """One `vllm serve` on loopback and the SUB socket its KV events arrive on (bound here: vLLM connects)."""

    def __init__(self, index: int, blocks: int, folder: str, context: zmq.Context, log_dir: Path):
        self.index, self.blocks = index, blocks
        self.http, events, replay = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.tree = CachedBlockTree()
        self.batches = 0
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self.sub.bind(f"tcp://127.0.0.1:{events}")
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "topic": TOPIC,
            "endpoint": f"tcp://127.0.0.1:{events}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        }
        serve = VLLMServeConfig(
            model_dir=folder,
            served_name=SERVED_NAME,
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            num_gpu_blocks_override=blocks,
            threads=1,
            kv_events=config,
            extra_args=("--enforce-eager",),
            extra_env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache between the policies
        )
        command, env = serve.command(find_vllm().command, self.http), serve.env()
        self.log_path = log_dir / f"fleet-vllm-{index}.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log_dir
            )

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"replica {self.index} exited ({self.process.returncode}): " + "\n".join(tail))
        try:
            with OPENER.open(self.url + "/health", timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def post(self, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        with OPENER.open(request, timeout=300) as response:
            raw = response.read()
        return json.loads(raw) if raw.strip().startswith(b"{") else {}

    def counters(self) -> tuple[float, float]:
        with OPENER.open(self.url + "/metrics", timeout=30) as response:
            m = parse_vllm_metrics(response.read().decode())
        return m.prefix_cache_hits or 0.0, m.prefix_cache_queries or 0.0

    def drain(self, wait_s: float) -> int:
        """Fold every waiting event batch into the tree (waiting up to wait_s for the first); returns batches."""
        got = 0
        timeout_ms = int(wait_s * 1000)
        while self.sub.poll(timeout_ms):
            _topic, _seq, payload = self.sub.recv_multipart()
            self.tree.apply_batch(decode_event_batch(payload))
            got += 1
            timeout_ms = 50  # then whatever follows at once
        self.batches += got
        return got

    def cached_blocks(self, blocks: list[tuple[int, ...]]) -> int:
        """Leading blocks of `blocks` (token tuples) cached here, matched by tokens down the tree."""
        pool = (0, DEFAULT_MEDIUM)
        cached = self.tree.blocks(pool)
        parent, hit = None, 0
        for want in blocks:
            match = next((h for h in self.tree.children(pool, parent) if cached[h].token_ids == want), None)
            if match is None:
                break
            parent, hit = match, hit + 1
        return hit

    def stop(self) -> None:
        self.sub.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


class _View:
    """What `Router` reads of a replica, from the client's side: nothing in flight (one request at a time)."""

    num_waiting = num_running = uncached_in_flight = 0
    kv_usage = 0.0

    def __init__(self, replica: Replica):
        self.replica = replica

    def cached_prefix_blocks(self, block_hashes) -> int:
        return self.replica.cached_blocks(block_hashes)


def workload(groups: int, users: int, prefix_blocks: int, question_len: int, seed: int):
    """[(group, prompt token ids)] in a seeded shuffled order (module docstring)."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(100, 49_000) for _ in range(prefix_blocks * BLOCK_SIZE)] for _ in range(groups)
    ]
    pairs = [(g, u) for g in range(groups) for u in range(users)]
    rng.shuffle(pairs)
    return [(g, prefixes[g] + [rng.randrange(100, 49_000) for _ in range(question_len)]) for g, _u in pairs]


def predict(load, prefix_len: int, blocks: int, routing: str) -> dict:
    requests = [
        Request(i, 10.0 * i, len(p), 1, prefix_group=g, prefix_len=prefix_len)
        for i, (g, p) in enumerate(load)
    ]
    step = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.010)
    config = SimulatorConfig(
        kv_capacity_tokens=(blocks - 1) * BLOCK_SIZE,
        max_seq_len=MAX_MODEL_LEN,
        watermark=0.0,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        step_time=step,
        max_snapshots=1,
    )
    result = simulate_fleet(
        requests, paged(BLOCK_SIZE, enable_prefix_caching=True), config, Fleet(2, routing)
    )
    frame = result.requests
    per = []
    for r in range(2):
        mine = frame[frame["replica"] == r]
        per.append(
            {
                "requests": len(mine),
                "hits_tokens": int(mine["prefix_hit_tokens"].sum()),
                "queries_tokens": int(mine["prompt_len"].sum()),
            }
        )
    return {
        "fleet_hit_rate": float(frame["prefix_hit_tokens"].sum() / frame["prompt_len"].sum()),
        "per_replica": per,
        "assignment": frame["replica"].astype(int).tolist(),
    }


def measure(replicas: list[Replica], load, routing: str) -> dict:
    for rep in replicas:
        rep.post("/reset_prefix_cache")
        rep.drain(0.5)
        rep.tree.clear()
    before = [rep.counters() for rep in replicas]
    router = Router(routing, len(replicas), MAX_NUM_BATCHED_TOKENS)
    views = [_View(rep) for rep in replicas]
    assignment = []
    started = time.perf_counter()
    for _group, prompt in load:
        full = (len(prompt) - 1) // BLOCK_SIZE  # the last prompt token is never served from the cache
        blocks = [tuple(prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]) for i in range(full)]
        chosen, _cached = router.route(views, len(prompt), blocks, BLOCK_SIZE)
        replicas[chosen].post(
            "/v1/completions", {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
        )
        replicas[chosen].drain(EVENT_WAIT_S)
        assignment.append(chosen)
    after = [rep.counters() for rep in replicas]
    per = [
        {"requests": assignment.count(r), "hits_tokens": int(a[0] - b[0]), "queries_tokens": int(a[1] - b[1])}
        for r, (a, b) in enumerate(zip(after, before, strict=True))
    ]
    hits, queries = sum(p["hits_tokens"] for p in per), sum(p["queries_tokens"] for p in per)
    return {
        "fleet_hit_rate": hits / queries if queries else 0.0,
        "per_replica": per,
        "assignment": assignment,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_vllm", description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--users", type=int, default=6)
    p.add_argument("--prefix-blocks", type=int, default=4)
    p.add_argument("--question-len", type=int, default=20)
    p.add_argument("--blocks", type=int, default=21, help="--num-gpu-blocks-override per replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated bench still stops its replicas
    from core.engine.fetch import fetch_model, model_cache_dir
    from core.engine.hf_export import export_hf_folder

    folder = str(
        export_hf_folder(fetch_model("smollm2-135m-instruct"), model_cache_dir() / "SmolLM2-135M-Instruct-hf")
    )
    load = workload(args.groups, args.users, args.prefix_blocks, args.question_len, args.seed)
    prefix_len = args.prefix_blocks * BLOCK_SIZE
    predicted = {policy: predict(load, prefix_len, args.blocks, policy) for policy in POLICIES}
    context = zmq.Context()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    replicas: list[Replica] = []
    started = time.perf_counter()
    try:
        for index in range(2):
            replicas.append(Replica(index, args.blocks, folder, context, log_dir))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(rep.healthy() for rep in replicas):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas did not answer within {START_TIMEOUT_S} s")
            time.sleep(2)
        start_s = time.perf_counter() - started
        measured = {policy: measure(replicas, load, policy) for policy in POLICIES}
    finally:
        for rep in replicas:
            rep.stop()
        context.term()
    policies = {}
    for policy in POLICIES:
        m, q = measured[policy], predicted[policy]
        gap = abs(q["fleet_hit_rate"] - m["fleet_hit_rate"])
        same = sum(a == b for a, b in zip(m["assignment"], q["assignment"], strict=True))
        policies[policy] = {
            "measured_fleet_hit_rate": round(m["fleet_hit_rate"], 4),
            "predicted_fleet_hit_rate": round(q["fleet_hit_rate"], 4),
            "abs_gap": round(gap, 4),
            "within_target": gap <= TARGET,
            "measured_per_replica": m["per_replica"],
            "predicted_per_replica": q["per_replica"],
            "requests_routed_as_predicted": same,
            "wall_s": m["wall_s"],
        }
    result = {
        "bench": "fleet_vllm",
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores ({machine()})",
        "vllm": "vllm-cpu (.venv-vllm), SmolLM2-135M-Instruct bf16, block 32, prefix caching, --enforce-eager",
        "load": {
            "groups": args.groups,
            "users": args.users,
            "requests": len(load),
            "prefix_tokens": prefix_len,
            "question_tokens": args.question_len,
            "max_tokens": 1,
            "order": f"shuffled, seed {args.seed}",
            "sent": "one at a time",
        },
        "blocks_per_replica": args.blocks,
        "usable_blocks_per_replica": args.blocks - 1,
        "prefix_aware_state": "each replica's KV events (BlockStored/BlockRemoved folded into a tree, matched by tokens)",
        "target_abs_gap": TARGET,
        "policies": policies,
        "all_within_target": all(v["within_target"] for v in policies.values()),
        "start_s": round(start_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
