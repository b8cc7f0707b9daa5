"""Were the published rows' prompts all prefilled? Print one JSON object per model: what the rows imply and what a
benchmark reusing a pool of prompts would have measured.

    python -m bench.published_prompt_pool [--fitted bench/results/slo-published.json] [--stride 1] [--routed-experts]

For every row of `core.planning.cost.fits.published_vllm_rows.ROWS` outside the KV-limited set: `prefill_fraction_of_peak` (the
dense FLOP/s its measured throughput implies for prefilling its prompts alone, over the GPUs' datasheet peak:
above ~0.5 no vLLM step computes that, so its prompts were partly served from the prefix cache), and the mean
TTFT / TPOT predicted twice with the cross-model profile (`fitted` of the saved `bench.slo_published` run, not
refitted): every prompt unique (the fit's assumption) and every prompt drawn from AIPERF_DATASET_ENTRIES distinct
ones with vLLM's prefix caching (`predict_row(..., prompt_pool=...)`: aiperf's default dataset size, which the
benchmark script aiconfigurator generates leaves as it is). Per model: rows, the largest and median implied
fraction of peak, and the RMS relative error (TTFT and TPOT together) both ways. A what-if found by examining the
held-out Llama-3.1-8B rows (docs/slo.md 2c): it is not used by any fit. --routed-experts prices every row's experts
as routed (`pv.ROUTED_EXPERTS`), as the saved result (bench/results/published-prompt-pool.json, the seventh stage)
was computed; without it vLLM 0.12's padded MoE kernel is priced where the rows ran it (the eighth stage).
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from core.kernels.cpu_isa import cpu_description
from core.planning.cost.fits import published_vllm as pv
from core.planning.cost.fits import published_vllm_rows as pvr

SAVED_FIT = Path(__file__).parent / "results" / "slo-published.json"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.published_prompt_pool", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--fitted", type=Path, default=SAVED_FIT, help="a bench.slo_published JSON (its 'fitted')"
    )
    parser.add_argument("--stride", type=int, default=1, help="every Nth row of each model (1: all)")
    parser.add_argument(
        "--routed-experts",
        action="store_true",
        help="every row's experts priced as routed, as the saved result was (default: the eighth stage's kernels)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    fitted = json.loads(args.fitted.read_text())["fitted"]
    priced = fitted | (pv.ROUTED_EXPERTS if args.routed_experts else {})
    models: dict[str, dict] = {}
    for model in dict.fromkeys(r.model for r in pvr.ROWS):
        rows = [r for r in pvr.ROWS if r.model == model and pvr.row_set(r) != "kv-limited"][:: args.stride]
        fractions = [pv.prefill_fraction_of_peak(r) for r in rows]
        unique, pooled = [], []
        for row in rows:
            for errors, pool in ((unique, None), (pooled, pv.AIPERF_DATASET_ENTRIES)):
                ttft, tpot = pv.predict_row(row, priced, prompt_pool=pool)
                errors += [ttft / row.ttft_s - 1.0, tpot / row.tpot_s - 1.0]
        models[model] = {
            "set": pvr.row_set(rows[0]) if rows else None,
            "rows": len(rows),
            "max_prefill_fraction_of_peak": max(fractions),
            "median_prefill_fraction_of_peak": float(np.median(fractions)),
            "unique_prompts_rms_rel_err": float(np.sqrt(np.mean(np.square(unique)))),
            "prompt_pool_rms_rel_err": float(np.sqrt(np.mean(np.square(pooled)))),
        }
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                },
                "source": pvr.VLLM_SOURCE,
                "fitted": fitted,
                "prompt_pool": pv.AIPERF_DATASET_ENTRIES,
                "stride": args.stride,
                "models": models,
                "elapsed_s": time.perf_counter() - started,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
