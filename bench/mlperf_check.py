"""Issue 40's outside check: an audited MLPerf v5.1 Server run of vLLM (Red Hat, Llama-3.1-8B FP8 on one H100,
vLLM 0.10.0, 39.5 queries/s), never fitted on, beside each step-time profile's time for one full step of that
server; prints one JSON object.

    python -m bench.mlperf_check

`core.planning.cost.fits.mlperf_server` says what is checked and why only this: the prompts' lengths are not
published with the run, so the run's TPOT is set against the profile's longest step at the server's 1,024-token
budget (an upper bound on the profile's TPOT there, for prompts up to 1,024 or 2,048 tokens), not replayed.
Printed: the run's measured TTFT and TPOT percentiles (ms) and Little's-law running count; per profile and prompt
bound, full_step_ms and vs_measured_tpot_p50 (full step / measured TPOT p50 - 1: below 0, the profile prices this
server's steps faster than they ran, whatever the prompts); elapsed_s.
"""

import json
import time

from core.planning.cost.fits.mlperf_server import outside_check


def main() -> None:
    start = time.perf_counter()
    result = outside_check()
    print(json.dumps(result | {"elapsed_s": round(time.perf_counter() - start, 2)}, indent=2))


if __name__ == "__main__":
    main()
