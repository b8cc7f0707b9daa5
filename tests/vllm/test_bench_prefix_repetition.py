"""The `vllm bench serve` command the lab prints for a shared-prefix load (its prefix_repetition dataset), run as
printed by vLLM's own CLI against the real vLLM: vLLM parses every flag, and the hit rate its counters measure
(/metrics prefix_cache_hits / queries, before and after) is the lab's predicted `prefix_hit_rate` for that load.

Why the tolerance: `predict` reports the steady state (warm-up dropped), where every prefix is cached and a prompt
hits its whole prefix (here 8 full blocks of 32 of its 320 tokens: 0.8). A run of M requests from an empty cache
also pays each of the N prefixes' first sighting, which hits nothing: the run's rate is predicted x (M - N) / M
exactly when nothing else differs. What else can: two requests of one prefix in the same prefill step (vLLM
registers a block's hash when its step is scheduled, so the second still hits), the text prompt re-tokenized by the
server (vLLM's dataset builds each prompt as text; a merge across the prefix / suffix seam would cost the prefix's
last block), and a suffix block that repeats by chance (none: random tokens). The cache (64 blocks) holds the
prefixes (16 blocks) and every request in flight (2 blocks of its own each), so nothing the prediction keeps is evicted. The run's rate must
lie within one block per request of the first-sighting figure (32 / 320 = 0.1 would be a whole block lost on
every request; it is held to 0.02, a fifth of that), and the counters must count exactly the prompts' tokens.
"""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from core.live.metrics import parse_vllm_metrics
from core.planning.catalog.models import ModelSpec
from core.planning.predict.bench_report import (
    METRIC_BLOCKS,
    against_result,
    bench_report,
    bench_values,
    check_same_load,
    read_bench_result,
)
from core.planning.predict.deployment import Deployment
from core.planning.predict.prediction import Load, predict
from core.planning.predict.vllm_bench import vllm_bench_serve_command
from core.serve.vllm_env import find_vllm

PREFIX, SUFFIX, PREFIXES, REQUESTS, OUTPUT = 256, 64, 2, 16, 4
TOLERANCE = 0.02


def _counters(server) -> tuple[float, float, float]:
    parsed = parse_vllm_metrics(server.get("/metrics").decode())
    return parsed.prefix_cache_hits, parsed.prefix_cache_queries, parsed.prompt_tokens


def test_the_printed_prefix_repetition_command_measures_the_predicted_hit_rate(real_vllm, tmp_path):
    config = json.loads((Path(real_vllm.model_dir) / "config.json").read_text())
    model = ModelSpec.from_hf_config(config, name=real_vllm.model)
    load = Load(
        rate=8.0,
        prompt_len=PREFIX + SUFFIX,
        output_len=OUTPUT,
        shared_prefix_len=PREFIX,
        num_prefixes=PREFIXES,
        seed=3,
    )
    predicted = predict(Deployment(model, "h100-80gb", block_size=real_vllm.block_size), load).to_dict()
    assert predicted["prefix_hit_rate"] == pytest.approx(PREFIX / (PREFIX + SUFFIX), abs=0.01)

    command = vllm_bench_serve_command(model, load, REQUESTS)  # every metric and percentile the lab predicts
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:3] == ["vllm", "bench", "serve"] and "--model" in words
    argv = [
        str(find_vllm().command),
        *words[1:],
        "--base-url",
        real_vllm.url,
        "--tokenizer",
        real_vllm.model_dir,
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "run.json",
        "--disable-tqdm",
    ]

    hits0, queries0, prompt0 = _counters(real_vllm)
    run = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    hits1, queries1, prompt1 = _counters(real_vllm)
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["completed"] == REQUESTS and not re.search(r"tokenizer mismatch", run.stdout)

    _the_lab_prints_vllms_block_as_vllm_does(result, run.stdout)
    # `predict --against run.json` reads vLLM's real file: the same load, and every predicted figure is in it
    check_same_load(read_bench_result(tmp_path / "run.json"), load)
    assert len(against_result(bench_values(predicted, load), result)) == 3 + 4 * 6

    prompt_tokens = REQUESTS * (PREFIX + SUFFIX)
    assert prompt1 - prompt0 == prompt_tokens == result["total_input_tokens"]
    assert queries1 - queries0 == prompt_tokens
    measured = (hits1 - hits0) / (queries1 - queries0)
    first_sightings = predicted["prefix_hit_rate"] * (REQUESTS - PREFIXES) / REQUESTS
    print(
        f"predicted {predicted['prefix_hit_rate']:.4f} (steady), {first_sightings:.4f} with the first "
        f"sightings; vLLM measured {measured:.4f}"
    )
    assert measured == pytest.approx(first_sightings, abs=TOLERANCE)


def _the_lab_prints_vllms_block_as_vllm_does(result: dict, stdout: str) -> None:
    """`bench_report` of vLLM's own saved result (`predict --format vllm-bench`'s formatter) is what vLLM printed:
    its title, throughput lines and closing line among vLLM's lines in order, and each metric's block (header,
    mean, median, every percentile) vLLM's block line for line (vLLM prints more lines between them: the run's
    counts, duration and peaks, which a steady state has not)."""
    ours, printed = bench_report(result).splitlines(), stdout.splitlines()
    at = [printed.index(line) for line in ours]  # each of ours is one of vLLM's lines
    assert at == sorted(at), (ours, printed)
    for _, _, _, header in METRIC_BLOCKS:
        start = next(i for i, line in enumerate(ours) if line.strip("-") == header)
        block = ours[start : start + 3 + 4]  # header, mean, median, p50 / p90 / p95 / p99
        assert printed[at[start] : at[start] + len(block)] == block
