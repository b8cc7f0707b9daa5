"""The Simulator page's one step from URL to domain: `params_from` builds `SimulatorParams` from the page's values."""

import math

from core.page_models.simulator import DEFAULT_PARAMS, SimulatorParams
from core.planning.memory.kv_accounting import BLOCK_SIZES
from ui.query_state import encode_params, parse_params
from ui.simulator.state import FIELDS, FIELDS_BY_KEY, params_from


def values(**url: str) -> dict:
    parsed, errors = parse_params(url, FIELDS)
    assert errors == []
    return parsed


def test_an_empty_url_is_the_default_parameters():
    assert params_from(values()) == DEFAULT_PARAMS == SimulatorParams()


def test_every_field_reaches_its_parameter():
    url = {
        "dataset": "fixed",
        "num_requests": "40",
        "rate": "3.5",
        "seed": "7",
        "n": "2",
        "prefix_len": "64",
        "prefix_fraction": "0.5",
        "fixed_prompt": "100",
        "fixed_output": "20",
        "model": "llama-3.1-8b",
        "gpu": "h100-80gb",
        "capacity": "raw",
        "raw_capacity": "4096",
        "overhead_ms": "5",
        "policies": "paged,orca-max",
        "block_size": "32",
        "prefix_caching": "1",
        "max_num_seqs": "8",
        "max_tokens": "512",
        "preemption": "swap",
        "swap_gib": "2",
    }
    assert params_from(values(**url)) == SimulatorParams(
        dataset="fixed",
        num_requests=40,
        rate=3.5,
        seed=7,
        n=2,
        prefix_len=64,
        prefix_fraction=0.5,
        prompt_len=100,
        output_len=20,
        model="llama-3.1-8b",
        gpu="h100-80gb",
        capacity_source="raw",
        raw_capacity_tokens=4096,
        overhead_ms=5.0,
        policies=("paged", "orca-max"),
        block_size=32,
        enable_prefix_caching=True,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        preemption_mode="swap",
        swap_space_gib=2.0,
    )


def test_a_trace_runs_as_sharegpt_and_all_at_once_is_an_infinite_rate():
    params = params_from(values(dataset="trace", all_at_once="1", rate="9"))
    assert params.dataset == "sharegpt" and params.rate == math.inf


def test_hybrid_reads_the_models_kv_cache_groups():
    """Gemma 2 9B: 42 layers alternating sliding window (4,096 tokens) and full attention: two groups of 21."""
    params = params_from(values(model="gemma-2-9b", hybrid="1"))
    assert sorted((g.kind, g.num_layers, g.window) for g in params.kv_groups) == [
        ("full", 21, None),
        ("sliding_window", 21, 4096),
    ]
    assert params_from(values(model="opt-13b", hybrid="1")).kv_groups is None  # one kind: nothing to split


def test_a_link_round_trips_to_the_same_parameters():
    chosen = values(block_size="64", policies="orca-oracle", seed="3")
    assert params_from(values(**encode_params(chosen, FIELDS))) == params_from(chosen)


def test_block_sizes_come_from_the_one_table():
    assert FIELDS_BY_KEY["block_size"].choices == BLOCK_SIZES
