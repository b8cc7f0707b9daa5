"""A fleet of replicas behind a router: one replica is the plain simulator, each policy routes as its rule says
(hand-built replica views), and spaced-out requests hit exactly what a brute-force per-replica cache predicts."""

import pickle

import numpy as np
import pandas.testing as pd_testing
import pytest

from core.errors import InvalidArgumentError, RoutingError
from core.planning.cost.step_model import StepTimeModel
from core.planning.predict.load import Load
from core.serving.fleet import Fleet, replica_breakdown, simulate_fleet
from core.serving.memory_policies import orca_max, paged
from core.serving.router import AFFINITY, ROUTING_POLICIES, SATURATION_BATCHES, PrefixHistory, Router
from core.serving.simulator import SimulatorConfig, simulate
from core.serving.workload import fixed

FLAT = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.010)  # 10 ms a step
SLOPED = StepTimeModel(0.0, 0.0, 0.0, 0.0, 1e12, 1e15, overhead_s=0.004, per_token_overhead_s=2e-5)
CACHING = paged(16, enable_prefix_caching=True)


def _config(capacity=8000, step=FLAT):
    return SimulatorConfig(kv_capacity_tokens=capacity, max_seq_len=2048, step_time=step, max_snapshots=1)


def _prefix_load(rate, groups=6, seed=3):
    return Load(
        rate=rate, prompt_len=300, output_len=20, shared_prefix_len=200, num_prefixes=groups, seed=seed
    )


@pytest.mark.parametrize("routing", ROUTING_POLICIES)
def test_one_replica_is_the_plain_simulator(routing):
    """N = 1 under every policy schedules what `simulate` schedules: same admissions, first tokens, finishes
    and prefix hits (decode batches are only cut at more places)."""
    requests = _prefix_load(rate=30.0).requests(200)
    single = simulate(requests, CACHING, _config(2000, SLOPED))
    fleet = simulate_fleet(requests, CACHING, _config(2000, SLOPED), Fleet(1, routing))
    for column in ("admit_time", "first_token_time", "finish_time"):
        np.testing.assert_allclose(fleet.requests[column], single.requests[column], rtol=1e-12, atol=1e-9)
    assert fleet.requests["prefix_hit_tokens"].tolist() == single.requests["prefix_hit_tokens"].tolist()
    assert (fleet.requests["replica"] == 0).all()
    assert fleet.steps["tokens_generated"].sum() == single.steps["tokens_generated"].sum()


def _brute_force_hits(prefix_groups, replicas, prefix_len, block_size):
    """Hit tokens per request when each request finishes before the next arrives and no cache evicts: a request
    hits its prefix's full blocks iff an earlier request of its prefix ran on the same replica."""
    seen, hits = set(), []
    for group, replica in zip(prefix_groups, replicas, strict=True):
        hits.append(prefix_len // block_size * block_size if (group, replica) in seen else 0)
        seen.add((group, replica))
    return hits


def _prefix_aware_reference(r, groups):
    """The score recomputed from the run's own times: replica q's uncached tokens in flight at request i's
    arrival are the uncached prompt tokens of the earlier requests it ran that had not finished; it caches i's
    prefix (192 tokens: 12 full blocks) once an earlier request of i's group ran its prefill there. No hit
    reaches AFFINITY (192 / 300), so the lowest in flight + 300 - cached wins, ties round-robin from i % 4."""
    choices = []
    for i in range(len(r)):
        arrival = r["arrival_time"][i]
        score = []
        for q in range(4):
            earlier = r.iloc[:i][r["replica"][:i] == q]
            running = earlier[earlier["finish_time"] > arrival]
            in_flight = int((running["prompt_len"] - running["prefix_hit_tokens"]).sum())
            warm = any(groups[j] == groups[i] and r["first_token_time"][j] <= arrival for j in earlier.index)
            score.append((in_flight + 300 - (192 if warm else 0), (q - i) % 4))
        choices.append(min(range(4), key=score.__getitem__))
    return choices


@pytest.mark.parametrize(
    "routing", ["round-robin", "random", "prefix-aware", "least-loaded", "approximate-prefix"]
)
def test_spaced_requests_hit_what_each_replica_cached(routing):
    """At 2 req/s (a request lives 0.2 s) every request runs alone: its hits are exactly the brute-force
    per-replica cache's. Round-robin sends request k to k % 4; prefix-aware chooses what its score, recomputed
    from the run's own times, chooses."""
    requests = _prefix_load(rate=2.0, groups=6).requests(60)
    result = simulate_fleet(requests, CACHING, _config(), Fleet(4, routing, seed=5))
    r = result.requests
    groups = [req.prefix_group for req in sorted(requests, key=lambda q: q.arrival_time)]
    expected = _brute_force_hits(groups, r["replica"].tolist(), 200, 16)
    assert r["prefix_hit_tokens"].tolist() == expected
    if routing == "round-robin":
        assert r["replica"].tolist() == [k % 4 for k in range(60)]
    if routing == "prefix-aware":
        assert r["replica"].tolist() == _prefix_aware_reference(r, groups)
        assert len(set(r["replica"])) == 4  # new prefixes spread: an idle fleet's ties go round-robin
    if routing == "random":
        again = simulate_fleet(requests, CACHING, _config(), Fleet(4, routing, seed=5)).requests
        assert again["replica"].tolist() == r["replica"].tolist()
        assert sorted(set(r["replica"])) == [0, 1, 2, 3]
    if routing == "approximate-prefix":
        # on an idle fleet (no queue, no KV held) only the prefix term differs: a request goes to a replica its
        # group was sent to before if any (a full match), else to one holding llm-d's model block (any replica
        # that served before), so new groups pile on replica 0 instead of spreading as prefix-aware's do
        arrival, finish, replica = (r[c].to_numpy() for c in ("arrival_time", "finish_time", "replica"))
        sent: dict = {}
        for i in range(60):
            if i and not (finish[:i] > arrival[i]).any():
                home = sent.get(groups[i]) or set(replica[:i])
                assert replica[i] in home
            sent.setdefault(groups[i], set()).add(replica[i])
        assert (replica == 0).mean() > 0.8


def test_prefix_aware_partitions_what_round_robin_scatters():
    """12 prefixes of 400 tokens on 4 replicas of 2,400 slots each: round-robin makes every replica cache all
    12 (4,800 tokens, twice its cache: it thrashes), prefix-aware gives each replica ~3 (1,200: they fit), so
    its fleet hit rate is far higher and near the ceiling (400 of 500 prompt tokens, less each group's first)."""
    load = Load(rate=12.0, prompt_len=500, output_len=30, shared_prefix_len=400, num_prefixes=12, seed=7)
    requests = load.requests(400)
    rates = {}
    for routing in ("round-robin", "prefix-aware", "approximate-prefix"):
        r = simulate_fleet(requests, CACHING, _config(2400, SLOPED), Fleet(4, routing)).requests
        rates[routing] = r["prefix_hit_tokens"].sum() / r["prompt_len"].sum()
    assert rates["prefix-aware"] > 0.7 > 0.4 > rates["round-robin"]
    # the guess partitions too, a little less tightly: its load terms send a group's request elsewhere when the
    # replica it remembers is busier
    assert rates["prefix-aware"] > rates["approximate-prefix"] > 0.7


def test_approximate_prefix_believes_what_a_replica_evicted():
    """The guess's weakness, in the simulator: spaced requests (6 prefixes, 2 replicas), so a request finds its
    replica idle. The router believes a replica holds a group's prefix iff it sent the group there before (its
    history of 31,250 keys forgets nothing here). With 8,000 slots a replica evicts nothing: the belief is
    right, no believed request misses. With 800 slots (about two prefixes a replica) replicas evict what the
    router still believes: some requests go to the replica the router remembers and miss there."""
    requests = _prefix_load(rate=2.0, groups=6).requests(60)
    groups = [req.prefix_group for req in sorted(requests, key=lambda q: q.arrival_time)]
    missed = {}
    for capacity in (8000, 800):
        r = simulate_fleet(requests, CACHING, _config(capacity), Fleet(2, "approximate-prefix")).requests
        sent, missed[capacity] = set(), 0
        for group, replica, hit in zip(groups, r["replica"], r["prefix_hit_tokens"], strict=True):
            missed[capacity] += (group, replica) in sent and hit == 0
            sent.add((group, replica))
    assert missed[8000] == 0 < missed[800]


def test_session_sticks_to_a_conversation():
    """Multi-turn chats: every turn of a conversation runs on the replica of its first turn, and conversations
    are dealt round-robin in order of their first turns."""
    load = Load(rate=6.0, prompt_len=120, output_len=10, turns=3, turn_gap_s=1.0, seed=2)
    requests = load.requests(90)
    r = simulate_fleet(requests, CACHING, _config(), Fleet(3, "session")).requests
    conversations = [req.conversation for req in sorted(requests, key=lambda q: q.arrival_time)]
    home = {}
    for conv, replica in zip(conversations, r["replica"], strict=True):
        home.setdefault(conv, (len(home) % 3))
        assert replica == home[conv]


class _View:
    def __init__(self, waiting=0, running=0, kv=0.0, in_flight=0, cached=0):
        self.num_waiting, self.num_running, self.kv_usage = waiting, running, kv
        self.uncached_in_flight, self._cached = in_flight, cached

    def cached_prefix_blocks(self, block_hashes):
        return min(self._cached, len(block_hashes))


def test_prefix_aware_score_hand_worked():
    """Prompt 1,000 tokens, block 16, 60 keys. Replica 0: 0 cached, 0 in flight -> 0 + 1000 = 1000.
    Replica 1: 40 blocks (640 tokens, 0.64 < AFFINITY) and 500 in flight -> 500 + 360 = 860: the lowest wins."""
    router = Router("prefix-aware", 2, 2048)
    views = [_View(in_flight=0), _View(in_flight=500, cached=40)]
    assert router.route(views, 1000, list(range(60)), 16) == (1, 640)


def test_prefix_affinity_and_saturation_valve():
    """A hit of >= 0.8 of the prompt keeps the request there at a score up to one prompt worse than the best;
    above SATURATION_BATCHES x max_num_batched_tokens uncached tokens in flight the replica is skipped, affinity or
    not."""
    router = Router("prefix-aware", 2, 100)
    keys = list(range(62))  # 1,000-token prompt, (1000 - 1) // 16 = 62 full blocks
    affine = _View(in_flight=1800, cached=50)  # 800 tokens = 0.8: 1800 + 200 = 2000, one prompt past the best
    idle = _View(in_flight=0, cached=0)  # 0 + 1000 = 1000, the best score
    assert AFFINITY * 1000 <= 50 * 16
    assert router.route([affine, idle], 1000, keys, 16)[0] == 0
    busy = _View(in_flight=1801, cached=50)  # 2001: past the band, the score decides
    assert router.route([busy, idle], 1000, keys, 16)[0] == 1
    saturated = _View(in_flight=SATURATION_BATCHES * 100 + 1, cached=62)
    assert router.route([saturated, idle], 1000, keys, 16)[0] == 1
    both = [_View(in_flight=SATURATION_BATCHES * 100 + 1, cached=62), _View(in_flight=10**6)]
    assert router.route(both, 1000, keys, 16)[0] == 0  # all saturated: all are candidates again


def test_approximate_prefix_hand_worked():
    """llm-d's approximate prefix-cache scorer on 3 replicas, hand-worked: router blocks of 32 tokens over KV
    blocks of 16 (router block j is known by KV key 2j + 1 and j), at most 3 blocks, an LRU of 4 keys a replica.
    Prompts as their KV keys: A = a1..a8, B shares A's first 4 blocks (64 tokens), C = c1..c8. Router keys (M:
    the model block): A [M, a2, a4, a6], B [M, a2, a4, b6], C [M, c2, c4, c6]. Score = matched / 4 + queue term
    ((max waiting - waiting) / (max - min), 1 when all equal) + (1 - KV usage); ties from replica k % 3.
    1. A, idle fleet: all 2.0, tie -> replica 0, which remembers M a2 a4 a6.
    2. C, replica 0 has 1 waiting: r0 = 1/4 (M) + 0 + 1 = 1.25, r1 = r2 = 0 + 1 + 1 = 2; tie from 1 -> replica 1.
    3. B, idle: M held by r0 and r1, a2 and a4 by r0, b6 by none: matched 3, 1, 0 -> r0 (2.75). Its LRU
       (capacity 4) refreshes M a2 a4 and adds b6, evicting a6: it forgets A's third block.
    4. A, idle, but replica 0's cache really evicted A (its view holds 0 blocks): the router still matches M a2
       a4 there (a6: no one) -> r0 at 2.75, and the request misses: 0 cached tokens, the guess's weakness.
    5. C, replica 1 (which remembers all of C: 4 / 4) has 2 waiting and 90 % KV: r1 = 1 + 0 + 0.1 = 1.1; r0 =
       1/4 + 1 + 1 = 2.25; r2 = 0 + 1 + 1 = 2 -> replica 0: the load terms outweigh a full match."""
    router = Router("approximate-prefix", 3, 2048, history=PrefixHistory(32, 3, 4))
    a = [101, 102, 103, 104, 105, 106, 107, 108]
    b = [*a[:4], 205, 206, 207, 208]
    c = [301, 302, 303, 304, 305, 306, 307, 308]
    idle = [_View(), _View(), _View()]
    assert router.route(idle, 130, a, 16) == (0, 0)
    assert router.route([_View(waiting=1), _View(), _View()], 130, c, 16) == (1, 0)
    assert router.route([_View(cached=4), _View(), _View()], 130, b, 16) == (0, 64)
    assert [router.remembers(r) for r in range(3)] == [4, 4, 0]
    assert router.route([_View(cached=0), _View(), _View()], 130, a, 16) == (0, 0)
    busy = [_View(), _View(waiting=2, kv=0.9, cached=8), _View()]
    assert router.route(busy, 130, c, 16) == (0, 0)


def test_approximate_prefix_history_is_the_routers_own():
    """Routing writes no replica (the views are unchanged) and the same requests and views give the same
    choices; a bad history is one plain error."""
    views = [_View(waiting=1, kv=0.2), _View(kv=0.5)]
    before = [vars(v).copy() for v in views]
    choices = [
        [Router("approximate-prefix", 2, 2048).route(views, 100, list(range(k, k + 6)), 16) for k in range(5)]
        for _ in range(2)
    ]
    assert choices[0] == choices[1]
    assert [vars(v) for v in views] == before
    with pytest.raises(RoutingError, match=r"PrefixHistory\.capacity must be a positive integer, got 0"):
        PrefixHistory(capacity=0)


def test_least_loaded_reads_queue_then_kv():
    router = Router("least-loaded", 3, 2048)
    views = [_View(waiting=2, kv=0.1), _View(waiting=1, kv=0.9), _View(waiting=1, kv=0.5)]
    assert router.route(views, 10, [], 16)[0] == 2


def test_bad_fleets_are_one_plain_error_each():
    with pytest.raises(RoutingError, match=r"unknown routing policy 'nearest'.*round-robin"):
        Fleet(2, "nearest")
    with pytest.raises(RoutingError, match="at least one replica, got 0"):
        Fleet(0)
    error = pickle.loads(pickle.dumps(RoutingError("x", "nearest")))
    assert isinstance(error, InvalidArgumentError) and error.policy == "nearest"


def test_replica_breakdown_adds_up():
    requests = _prefix_load(rate=40.0).requests(300)
    result = simulate_fleet(requests, CACHING, _config(3000, SLOPED), Fleet(3, "prefix-aware"))
    parts = replica_breakdown(result, 50, 250)
    assert sum(p["requests"] for p in parts) == 200
    assert sum(p["load_share"] for p in parts) == pytest.approx(1.0)
    window = result.requests.iloc[50:250]
    hits = sum(
        p["prefix_hit_rate"] * window[window["replica"] == p["replica"]]["prompt_len"].sum() for p in parts
    )
    assert hits == pytest.approx(window["prefix_hit_tokens"].sum())
    assert all(0.0 < p["kv_usage"] <= 1.0 for p in parts)


@pytest.mark.parametrize("policy", [paged(16, counted=True), orca_max()], ids=["counted", "orca-max"])
@pytest.mark.parametrize("routing", ["least-loaded", "prefix-aware"])
def test_plain_requests_route_without_a_prefix_cache(policy, routing):
    """Counted or contiguous memory (no prefix cache): the load signals still route, every request runs."""
    requests = fixed(80, 100, 10, 50.0, 1)
    result = simulate_fleet(requests, policy, _config(), Fleet(2, routing))
    assert result.requests["finish_time"].notna().all()
    assert result.requests["prefix_hit_tokens"].sum() == 0
    assert sorted(set(result.requests["replica"])) == [0, 1]


@pytest.mark.parametrize(
    ("policy", "replicas", "capacity", "max_steps", "snapshots"),
    [
        (CACHING, 2, 3000, 8192, 1),
        (CACHING, 3, 1200, 8192, 8),  # a small cache: queued requests, preemptions
        (CACHING, 2, 3000, 5, 1),  # batches capped at 5 steps
        (paged(16, counted=True), 2, 3000, 8192, 1),
        (paged(16), 2, 1200, 7, 4),
    ],
    ids=["prefix", "small-cache", "capped", "counted", "paged-capped"],
)
def test_round_robin_batches_run_past_arrivals_routed_elsewhere(
    monkeypatch, policy, replicas, capacity, max_steps, snapshots
):
    """Round-robin replicas cut their decode-only batches only at the arrivals routed to them: every step row
    and every request is the same to the last bit as when each replica cuts at every arrival (the reference,
    `cut_every_arrival` alone), in fewer batches."""
    import core.serving.fleet as fleet_module
    import core.serving.simulator as simulator_module

    monkeypatch.setattr(simulator_module, "MAX_BATCHED_DECODE_STEPS", max_steps)
    requests = _prefix_load(rate=25.0).requests(160)
    config = SimulatorConfig(
        kv_capacity_tokens=capacity, max_seq_len=2048, step_time=SLOPED, max_snapshots=snapshots
    )
    batches = []
    run_step = fleet_module.driver.run_step

    def counted(*args):
        batches[-1] += 1
        return run_step(*args)

    monkeypatch.setattr(fleet_module.driver, "run_step", counted)
    results = []
    for past in (True, False):
        monkeypatch.setattr(fleet_module, "_runs_past_arrivals", lambda policy, config, past=past: past)
        batches.append(0)
        results.append(simulate_fleet(requests, policy, config, Fleet(replicas), until_finished=140))
    merged, reference = results
    for r in range(replicas):
        pd_testing.assert_frame_equal(
            merged.replica_results[r].steps, reference.replica_results[r].steps, check_exact=True
        )
    finished = reference.requests["finish_time"].notna()
    pd_testing.assert_frame_equal(merged.requests[finished], reference.requests[finished], check_exact=True)
    assert batches[0] < batches[1]
