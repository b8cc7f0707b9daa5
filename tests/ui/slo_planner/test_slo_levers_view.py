"""The SLO planner's prediction captions: which intervals keep a prediction from converging."""

from ui.slo_planner.levers_view import STEADY, percentiles_caption, wide_intervals


def _prediction(converged: bool, intervals: dict) -> dict:
    values = {key: (low + high) / 2 for key, (low, high) in intervals.items()}
    values["itl_p90_s"] = 0.00832 if "itl_p90_s" in intervals else None
    return {
        "mode": "agg",
        "converged": converged,
        "intervals": intervals,
        **values,
        "simulated_requests": 10_000,
        "warmup_requests": 143,
        "measured_requests": 9_694,
        "deployment": {"model": "llama-3.1-8b", "gpu": "h100-80gb"},
    }


def test_the_intervals_wider_than_the_tolerance_are_named_widest_first():
    # the SLO planner's default prediction (Llama-3.1-8B, 2 x H100, 12 req/s of 2,000 / 300): ITL p90 sits between
    # the decode-only steps (~8 ms) and the steps with a prefill chunk (~73 ms)
    p = _prediction(
        False,
        {
            "ttft_p50_s": (0.1037, 0.1042),  # half-width 0.2 %
            "e2e_p99_s": (0.8, 1.2),  # 20 %: named second
            "itl_p90_s": (0.00816, 0.0734),  # around 8.32 ms: 392 %
        },
    )
    assert STEADY.tolerance == 0.1
    assert wide_intervals(p) == ["ITL p90: 8.16-73.4 ms around 8.32 ms", "E2E p99: 0.8-1.2 s around 1 s"]
    caption = percentiles_caption(p)
    assert (
        "Not converged at the 10,000-request cap: a half-width over 10% of the value, ITL p90: 8.16-73.4 ms"
        in caption
    )


def test_a_prediction_whose_intervals_are_narrow_but_batches_short_says_so():
    p = _prediction(False, {"ttft_p50_s": (0.1037, 0.1042)})
    assert wide_intervals(p) == []
    assert "batches are shorter than the request lifetimes" in percentiles_caption(p)
    assert "Converged: every interval is within 10%" in percentiles_caption({**p, "converged": True})
    overloaded = percentiles_caption({**p, "stable": False})
    assert "no steady state to converge to" in overloaded and "batches" not in overloaded
