"""Planned vs observed for a real vLLM (its CPU build serving SmolLM2 as "smollm2", a name no planner preset
has): the Live page's plan reads the model's config.json from the folder the server names in /v1/models and fits
the window's histograms on this machine's CPU roofs, with no preset refusal."""

import time
from concurrent.futures import ThreadPoolExecutor

from core.limits import Limits
from core.live.addresses import check_metrics_url
from core.live.fetch import fetch_metrics_text
from core.live.history import LiveHistory
from core.live.metrics import parse_vllm_metrics
from core.live.served_model import fetch_served_models
from core.page_models.live_planned import VLLM_CPU_DEFAULTS, live_plan, served_config
from core.planning.cost.cpu_roofline import measure_roofs

VALUES = {"pvo_window": 600.0, "pvo_seqs": 0, "pvo_tokens": 0, "model": "none", "gpu": "h100-80gb", "tp": 1}
REQUESTS = 24


def test_planned_vs_observed_for_the_real_smollm2_server(real_vllm):
    url = check_metrics_url(real_vllm.url + "/metrics", Limits(live_hosts="127.0.0.1"))
    (served,) = fetch_served_models(url)
    config = served_config(url.host, served, gpu_here=False)
    assert config is not None and config.on_this_cpu and config.max_model_len == real_vllm.max_model_len

    before = parse_vllm_metrics(fetch_metrics_text(url))
    start = time.monotonic()
    prompts = [[100 + 7 * i + j for j in range(24 + 4 * (i % 5))] for i in range(REQUESTS)]
    # 2-6 output tokens: every request has an inter-token latency to observe and plan, fewer decode steps to wait on
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: real_vllm.complete(p, max_tokens=2 + 2 * (len(p) % 3)), prompts))
    after = parse_vllm_metrics(fetch_metrics_text(url))
    history = LiveHistory()
    history.record(0.0, {url.url: before})
    history.record(time.monotonic() - start, {url.url: after})

    values = VALUES | {"dtype": real_vllm.dtype}  # the server's --dtype: its /metrics do not say it
    plan = live_plan(history, url.url, values, lambda: measure_roofs(repeats=3), config)
    assert plan.result is not None, plan.reason
    assert plan.planned_with.startswith(f"smollm2 ({real_vllm.dtype},") and plan.planned_with.endswith(
        "on this machine's CPU"
    )
    result = plan.result
    assert result.window.requests == REQUESTS
    assert result.window.mean_prompt_tokens >= 24  # what the server counted (the prompts as given)
    for key, observed in result.observed.items():  # the window's own percentiles, beside the plan's
        assert observed is not None and observed > 0, key
        assert result.planned[key] is not None and result.planned[key] > 0, key
    assert result.prior is None  # no published engine profile prices a CPU
    assert VLLM_CPU_DEFAULTS == (128, 2048)
