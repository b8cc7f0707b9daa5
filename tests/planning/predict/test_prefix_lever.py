"""Shared prefixes and multi-turn chats through the simulator's real prefix cache (`Load.shared_prefix_len`,
`num_prefixes`, `prefix_zipf`, `turns`): hit rates against block arithmetic worked by hand and the LRU hit rate of
uniform requests over more prefixes than the cache holds, TTFT against the same load without sharing, and bad
values exiting 2 with one line naming the flag. Small simulations: llama-3.1-8b on an H100 at 30% memory
(~58k KV slots), a few hundred requests."""

import pytest

from core.errors import InvalidArgumentError
from core.planning.commands.predict_cli import max_rate_main, predict_main
from core.planning.predict.deployment import Deployment
from core.planning.predict.load import Load
from core.planning.predict.prediction import predict
from core.serving.steady_state import SteadyStateSettings

SMALL = SteadyStateSettings(tolerance=0.2, initial_measured=100, max_requests=400, warmup_lifetimes=2.0)
SMALL_CACHE = Deployment("llama-3.1-8b", "h100-80gb", max_num_seqs=32, gpu_memory_utilization=0.3)
BLOCK = 16
PREFIX, PROMPT = 3500, 4000
CACHED_PREFIX = PREFIX // BLOCK * BLOCK  # only full blocks are cached: 3,488 tokens


def _run(load: Load, deployment: Deployment = SMALL_CACHE):
    return predict(deployment, load, settings=SMALL)


def test_a_shared_3500_token_prefix_hits_and_cuts_ttft():
    """Four 3.5k-token prefixes fit the cache many times over: after its first use each is a hit of its 218 full
    blocks, so the hit rate is just under 3,488 / 4,000 = 0.872, and TTFT drops to the 512 uncached tokens'
    prefill against the whole 4k prompt's."""
    shared = _run(Load(4.0, PROMPT, 32, shared_prefix_len=PREFIX, num_prefixes=4))
    plain = _run(Load(4.0, PROMPT, 32))
    hit = shared.to_dict()["prefix_hit_rate"]
    assert 0.75 <= hit <= CACHED_PREFIX / PROMPT
    assert hit == pytest.approx(CACHED_PREFIX / PROMPT, rel=0.02)  # misses: only each prefix's first use
    assert plain.to_dict()["prefix_hit_rate"] is None  # no sharing: counted blocks, no cache to ask
    assert shared.metrics["ttft_p50_s"] < 0.25 * plain.metrics["ttft_p50_s"]
    assert shared.metrics["mean_ttft_s"] < 0.25 * plain.metrics["mean_ttft_s"]
    assert shared.stable and plain.stable


def test_far_more_prefixes_than_the_cache_holds_are_evicted():
    """400 uniform prefixes of 3.5k tokens against ~58k slots: LRU keeps at most kv_tokens / 3,488 ~ 16 of them
    (fewer with running requests' blocks), and under uniform requests an LRU cache of M of G items hits M / G
    of the time, so the hit rate is at most 0.872 x 16 / 400 ~ 0.035: evictions measured, not assumed. A bigger
    cache (90% of the GPU, ~450k slots, ~129 prefixes) keeps more of them and hits more."""
    many = _run(Load(4.0, PROMPT, 32, shared_prefix_len=PREFIX, num_prefixes=400))
    hit = many.to_dict()["prefix_hit_rate"]
    held = many.kv_tokens / CACHED_PREFIX
    assert 0 < hit <= CACHED_PREFIX / PROMPT * held / 400 * 1.2
    big = Deployment("llama-3.1-8b", "h100-80gb", max_num_seqs=32, gpu_memory_utilization=0.9)
    bigger = _run(Load(4.0, PROMPT, 32, shared_prefix_len=PREFIX, num_prefixes=400), big)
    assert bigger.to_dict()["prefix_hit_rate"] > 3 * hit


def test_zipf_popularity_hits_more_than_uniform_over_the_same_prefixes():
    uniform = _run(Load(4.0, PROMPT, 32, shared_prefix_len=PREFIX, num_prefixes=100))
    zipf = _run(Load(4.0, PROMPT, 32, shared_prefix_len=PREFIX, num_prefixes=100, prefix_zipf=1.2))
    assert zipf.to_dict()["prefix_hit_rate"] > 2 * uniform.to_dict()["prefix_hit_rate"]


def test_each_chat_turn_hits_the_previous_turns_full_blocks():
    """Four turns of 1,000-token first prompt and 100-token outputs, 5 s apart (each turn long finished): turn t
    re-sends turn t-1's prompt and output, of which the cache holds the computed full blocks (the last output
    token is never computed): prompts 1,000 / 2,100 / 3,200 / 4,300 tokens hit 0 / 1,088 / 2,192 / 3,296."""
    p = _run(Load(2.0, 1000, 100, turns=4, turn_gap_s=5.0))
    requests = p.state.result.requests.dropna(subset=["finish_time"])
    expected = {
        1000: 0,
        2100: 1099 // BLOCK * BLOCK,
        3200: 2199 // BLOCK * BLOCK,
        4300: 3299 // BLOCK * BLOCK,
    }
    assert set(requests["prompt_len"]) == set(expected)
    for prompt, hits in zip(requests["prompt_len"], requests["prefix_hit_tokens"], strict=True):
        assert hits == expected[prompt]
    assert p.load.max_len == 4300 + 100
    assert 0.55 < p.to_dict()["prefix_hit_rate"] < 0.7  # 6,576 / 10,600 = 0.62 for an even mix of turns


def test_chats_sharing_a_system_prompt_keep_it_in_every_turn():
    load = Load(2.0, 600, 50, shared_prefix_len=512, num_prefixes=2, turns=3, turn_gap_s=5.0)
    requests = load.requests(60)
    assert [r.request_id for r in requests] == list(range(60))
    assert all(r.prefix_len == 512 and r.prefix_group in (0, 1) for r in requests)
    assert {r.prompt_len for r in requests} == {600, 600 + 50 + 88, 600 + 2 * (50 + 88)}
    arrivals = [r.arrival_time for r in requests]
    assert arrivals == sorted(arrivals)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"shared_prefix_len": -1}, "--shared-prefix-len"),
        ({"shared_prefix_len": 4001}, "--shared-prefix-len"),
        ({"shared_prefix_len": 3900, "length_spread": 0.1}, "--shared-prefix-len"),
        ({"num_prefixes": 0}, "--num-prefixes"),
        ({"prefix_zipf": 0.0}, "--prefix-zipf"),
        ({"prefix_zipf": -1.0}, "--prefix-zipf"),
        ({"turns": 0}, "--turns"),
        ({"turn_gap_s": 0.0}, "--turn-gap"),
    ],
)
def test_bad_lever_values_name_the_flag(kwargs, flag):
    with pytest.raises(InvalidArgumentError, match=flag):
        Load(1.0, PROMPT, 32, **kwargs)


def test_default_load_keeps_the_counted_policy():
    load = Load(1.0, 100, 10)
    assert not load.uses_prefix_cache and load.max_len == 110
    assert load.per_replica(2).rate == 0.5 and load.per_replica(2).shared_prefix_len == 0


@pytest.mark.parametrize(
    "bad",
    [
        ["--shared-prefix-len", "-5"],
        ["--shared-prefix-len", "200"],
        ["--prefix-zipf", "0"],
        ["--turns", "0"],
        ["--num-prefixes", "x"],
    ],
)
def test_cli_bad_lever_flags_exit_2_with_one_line(bad, capsys):
    base = ["--model", "llama-3.1-8b", "--gpu", "h100-80gb", "--prompt-len", "100", "--output-len", "10"]
    for main, extra in ((predict_main, ["--rate", "1"]), (max_rate_main, ["--tpot-p99", "0.1"])):
        try:
            code = main([*base, *extra, *bad])
        except SystemExit as exit_:
            code = exit_.code
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert bad[0] in err or bad[0].lstrip("-").replace("-", "_") in err, err
