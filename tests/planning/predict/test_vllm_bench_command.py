"""The `vllm bench serve` command that replays a `Load` (`core.planning.predict.vllm_bench.vllm_bench_serve_command`):
parsed back with a parser declaring vLLM's flag names and types (vllm/benchmarks/serve.py `add_cli_args`,
vllm/benchmarks/datasets `add_dataset_parser`), every flag carries the load's value; vLLM's length range for
--random-range-ratio (worked from its documented formula) matches `Load.length_spread` within a token; the
prompt count follows Little's law."""

import argparse
import math
import shlex

import pytest

from core.errors import InvalidArgumentError
from core.planning.catalog.models import get_model
from core.planning.predict.load import Load
from core.planning.predict.vllm_bench import bench_num_prompts, vllm_bench_serve_command

LLAMA = get_model("llama-3.1-8b")


def vllm_bench_parser() -> argparse.ArgumentParser:
    """The `vllm bench serve` flags the command may use, with vLLM's names, types and defaults."""
    parser = argparse.ArgumentParser(prog="vllm bench serve", exit_on_error=False)
    parser.add_argument("--model", type=str, default=None)
    parser.add_argument(
        "--dataset-name", type=str, default="random", choices=["random", "sharegpt", "prefix_repetition"]
    )
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    parser.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    parser.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    parser.add_argument("--prefix-repetition-output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--percentile-metrics", type=str, default=None)
    parser.add_argument("--metric-percentiles", type=str, default="99")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse(command: str) -> argparse.Namespace:
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:3] == ["vllm", "bench", "serve"]
    return vllm_bench_parser().parse_args(words[3:])


def test_a_poisson_load_is_replayed_flag_for_flag():
    load = Load(12.25, 1500, 256, length_spread=0.2, seed=7)
    args = parse(vllm_bench_serve_command(LLAMA, load, 4200))
    assert args.model == "meta-llama/Llama-3.1-8B" == LLAMA.hf_repo
    assert (args.dataset_name, args.random_input_len, args.random_output_len) == ("random", 1500, 256)
    assert args.random_range_ratio == 0.2 and args.seed == 7 and args.num_prompts == 4200
    assert args.request_rate == 12.25 and args.max_concurrency is None
    assert args.ignore_eos  # the simulator generates exactly output_len tokens: so must the server
    assert args.percentile_metrics.split(",") == ["ttft", "tpot", "itl", "e2el"]
    assert [int(q) for q in args.metric_percentiles.split(",")] == [50, 90, 95, 99]


def test_a_closed_loop_is_an_unbounded_rate_capped_at_the_clients():
    load = Load(None, 1024, 1024, concurrency=16)
    args = parse(vllm_bench_serve_command(LLAMA, load, 1000))
    assert math.isinf(args.request_rate) and args.max_concurrency == 16
    assert args.random_range_ratio == 0.0  # no spread: the flag is left at vLLM's default (fixed lengths)
    assert "--random-range-ratio" not in vllm_bench_serve_command(LLAMA, load, 1000)


def test_the_percentiles_asked_are_the_ones_reported():
    args = parse(vllm_bench_serve_command(LLAMA, Load(1.0, 10, 10), 1000, ("tpot", "e2e"), (99,)))
    assert (args.percentile_metrics, args.metric_percentiles) == ("tpot,e2el", "99")


def vllm_random_range(length: int, ratio: float) -> tuple[int, int]:
    """vLLM's RandomDataset length range for --random-range-ratio (its help text and sampler: integers uniform
    on [floor(L (1 - r)), ceil(L (1 + r))], output lengths at least 1), special tokens aside."""
    return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


@pytest.mark.parametrize("length", [1, 7, 300, 1500, 2049])
@pytest.mark.parametrize("spread", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_length_spread_is_vllm_s_range_ratio_within_a_token(length, spread):
    load = Load(1.0, length, length, spread)
    ours = load._range(length)
    theirs = vllm_random_range(length, spread)
    assert abs(ours[0] - theirs[0]) <= 1 and abs(ours[1] - theirs[1]) <= 1
    # a range of our draw's width: 1,500 tokens at 0.2 are 1,200..1,800 in both
    assert Load(1.0, 1500, 10, 0.2)._range(1500) == vllm_random_range(1500, 0.2) == (1200, 1800)


def test_the_prompt_count_covers_twenty_in_flight_populations():
    # 10 req/s x 30 s end to end = 300 in flight (Little's law): 6,000 prompts, ramp-up and drain ~1/10 of them
    assert bench_num_prompts(Load(10.0, 100, 100), 10.0 * 30.0) == 6000
    assert bench_num_prompts(Load(10.0, 100, 100), 10.0 * 30.01) == 6100  # rounded up to a hundred
    assert bench_num_prompts(Load(1.0, 100, 100), 1.0 * 2.0) == 1000  # never under vLLM's default 1,000
    assert bench_num_prompts(Load(None, 100, 100, concurrency=64), 0.0) == 1300  # 20 x 64 clients


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_prompts": 0}, "num_prompts"),
        ({"num_prompts": 10, "metrics": ("ttft", "goodput")}, "metrics"),
        ({"num_prompts": 10, "percentiles": (100,)}, "percentiles"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        vllm_bench_serve_command(LLAMA, Load(1.0, 10, 10), **kwargs)


def test_a_load_with_shared_prefixes_is_replayed_by_the_prefix_repetition_dataset():
    load = Load(2.5, 320, 16, shared_prefix_len=256, num_prefixes=3, seed=4)
    args = parse(vllm_bench_serve_command(LLAMA, load, 1000))
    assert args.dataset_name == "prefix_repetition"
    assert (args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len) == (256, 64)  # prompt = 320
    assert (args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len) == (3, 16)
    # vLLM gives each prefix num_prompts // num_prefixes prompts: rounded up, none are dropped
    assert args.num_prompts == 1002 and args.num_prompts // 3 * 3 == args.num_prompts
    assert (args.request_rate, args.seed, args.ignore_eos) == (2.5, 4, True)


@pytest.mark.parametrize(
    "levers, why",
    [
        ({"prefix_zipf": 1.1}, "no Zipf-weighted prefixes"),
        ({"length_spread": 0.1}, "no length spread"),
        ({"turns": 3}, "no multi-turn chats"),
        ({"shared_prefix_len": 100}, "prompts that are all prefix"),
    ],
)
def test_a_shared_prefix_load_that_dataset_cannot_replay_is_refused_saying_why(levers, why):
    load = Load(1.0, 100, 10, **({"shared_prefix_len": 50} | levers))
    with pytest.raises(InvalidArgumentError, match=f"prefix_repetition .*{why}"):
        vllm_bench_serve_command(LLAMA, load, 1000)
