"""The SLO planner page under AppTest: the shown answer is `plan_slo`'s for the same inputs (called here, apart from
the page), the URL reproduces the inputs both ways, and bad or unmeetable SLOs are st.error with core's message,
never an exception, the closest configurations still shown."""

import pytest
from streamlit.testing.v1 import AppTest

from core.errors import InvalidArgumentError, SloInfeasibleError
from core.planning.catalog.models import get_model
from core.planning.cost import layer_kernels as lk
from core.planning.cost.fits.engine_profiles import DEFAULT_ENGINE, VLLM_CROSS_MODEL_PROFILE
from core.planning.search.slo import Slo, SloCandidates, SloWorkload, plan_slo
from tests.conftest import ROOT

PAGE = "app_pages/slo_planner.py"
DEFAULT_GPUS = ("h100-80gb", "h200-141gb", "l40s")


def open_page(params: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    for key, value in (params or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    at.switch_page(PAGE)
    at.run()
    assert not at.exception, at.exception
    return at


@pytest.fixture(scope="module")
def default_plan():
    """`plan_slo` of the page's default question, called here, apart from the page (computed once: ~9 s)."""
    return plan_slo(
        "llama-3.1-8b", SloWorkload(12, 2000, 300), Slo(1.0, 0.05), SloCandidates(gpus=DEFAULT_GPUS)
    )


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def query(at: AppTest) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in at.query_params.items()}


def expected_figures(best) -> dict[str, str]:
    """What the page must show for `best`, formatted as the page formats it."""
    return {
        "Deployment": f"{best.num_gpus} × {best.gpu_name}",
        "TP × PP × replicas": f"{best.tp} × {best.pp} × {best.replicas}",
        "max_num_seqs": f"{best.max_num_seqs:,}",
        "KV cache dtype": best.kv_dtype,
        "Binding constraint": best.binding,
        "TTFT p95 (predicted)": f"{best.ttft_p95_s:.3g} s",
        "TPOT p95 (predicted)": f"{best.tpot_p95_s * 1e3:.3g} ms",
        "Output throughput": f"{best.throughput_tokens_per_s:,.0f} tok/s",
        "GPUs per request/s": f"{best.gpus_per_request_per_s:.3g}",
    }


def test_defaults_show_the_best_configuration_of_plan_slo(default_plan):
    at = open_page()
    assert not at.error
    plan = default_plan
    best = plan.best
    assert metrics(at) == expected_figures(best)
    # 2 x H100 at tp 2 is the cheapest for 12 req/s of 2k/300 priced with the cross-model vLLM profile in steady
    # state: one GPU does not keep up (24,000 prompt tokens/s of prefill alone need ~0.4 of an H100's bf16 peak),
    # and of the 2-GPU deployments that meet the SLO tp 2 has the best TPOT p95 (docs/slo.md)
    assert (best.num_gpus, best.gpu, best.tp, best.meets_slo) == (2, "h100-80gb", 2, True)
    assert best.ttft_p95_s <= 1.0 and best.tpot_p95_s <= 0.05
    command, bench = (c.value for c in at.code)
    assert f"--tensor-parallel-size {best.tp}" in command and f"--max-num-seqs {best.max_num_seqs}" in command
    assert ("--kv-cache-dtype fp8" in command) == (
        best.kv_dtype == "fp8"
    ) and "--max-model-len 2300" in command
    assert "--request-rate 12 " in bench and "--random-input-len 2000 " in bench  # beside it, the replay
    assert len(at.get("plotly_chart")) == 1
    [table] = at.dataframe
    assert len(table.value) == plan.num_evaluated
    first = table.value[table.value["meets SLO"]].iloc[0]  # the ranked table's first row meeting the SLO
    assert first["rank"] == plan.configs.index(best) + 1
    assert (first["GPUs"], first["TP"], first["max_num_seqs"], first["KV dtype"]) == (
        best.num_gpus,
        best.tp,
        best.max_num_seqs,
        best.kv_dtype,
    )
    assert first["TTFT p95 (s)"] == pytest.approx(best.ttft_p95_s)
    # the highest rates are asked for, not computed by default (test_slo_search_choices_page computes them)
    assert table.value["highest rate (req/s)"].isna().all()
    assert query(at) == {
        "mode": "search",
        "model": "llama-3.1-8b",
        "rate": "12",
        "prompt_len": "2000",
        "output_len": "300",
        "spread": "0",
        "ttft": "1",
        "tpot_ms": "50",
        "itl_ms": "auto",
        "e2e": "auto",
        "ttft_q": "95",
        "tpot_q": "95",
        "itl_q": "99",
        "e2e_q": "99",
        "engine": DEFAULT_ENGINE,
        "vllm": "auto",
        "seed": "0",
        "gpus": "h100-80gb,h200-141gb,l40s",
        "max_gpus": "8",
        "kv": "auto,fp8",
        "weights": "auto",
        "rates": "0",
        "disagg_too": "0",
    }


# short requests (500 / 50 tokens): every input is still one the defaults do not have, and each search (the page's
# and the one here) simulates a few seconds, not ten (1000 / 200 tokens took 30 s for the whole test)
SHARED = {
    "mode": "search",
    "model": "qwen2.5-7b",
    "rate": "6",
    "prompt_len": "500",
    "output_len": "50",
    "spread": "0.2",
    "ttft": "0.5",
    "tpot_ms": "40",
    "itl_ms": "auto",
    "e2e": "auto",
    "ttft_q": "95",
    "tpot_q": "95",
    "itl_q": "99",
    "e2e_q": "99",
    "engine": DEFAULT_ENGINE,  # plan_slo's default engine: the reference below is called with it
    "vllm": "auto",  # today's vLLM
    "seed": "0",
    "gpus": "l40s,h100-80gb",
    "max_gpus": "4",
    "kv": "fp8",
    "weights": "auto",
    "rates": "0",
    "disagg_too": "0",
}


def test_a_shared_url_reproduces_its_inputs_and_answer():
    at = open_page(SHARED)
    assert not at.error
    assert at.selectbox(key="model").value == "qwen2.5-7b" and at.number_input(key="rate").value == 6.0
    assert at.multiselect(key="gpus").value == ["l40s", "h100-80gb"] and at.multiselect(key="kv").value == [
        "fp8"
    ]
    assert at.slider(key="spread").value == 0.2 and at.number_input(key="tpot_ms").value == 40.0
    assert query(at) == SHARED  # the page rewrote the URL with the same values
    assert at.dataframe[0].value["highest rate (req/s)"].isna().all()  # rates=0: no bisection asked
    plan = plan_slo(
        "qwen2.5-7b",
        SloWorkload(6, 500, 50, 0.2),
        Slo(0.5, 0.04),
        SloCandidates(gpus=("l40s", "h100-80gb"), max_gpus=4, kv_dtypes=("fp8",)),
    )
    assert metrics(at) == expected_figures(plan.best)
    # a changed input goes into the URL once the form is submitted, and the answer follows it
    at.number_input(key="rate").set_value(3.0)
    next(b for b in at.button if b.proto.label == "Search").click()
    at.run()
    assert not at.exception, at.exception
    assert query(at)["rate"] == "3"
    plan = plan_slo(
        "qwen2.5-7b",
        SloWorkload(3, 500, 50, 0.2),
        Slo(0.5, 0.04),
        SloCandidates(gpus=("l40s", "h100-80gb"), max_gpus=4, kv_dtypes=("fp8",)),
    )
    assert metrics(at) == expected_figures(plan.best)


@pytest.mark.parametrize("ttft", ["0", "-1"])
def test_a_non_positive_target_is_core_s_error_not_a_traceback(ttft):
    at = open_page({"ttft": ttft})
    with pytest.raises(InvalidArgumentError) as refused:
        Slo(float(ttft), 0.05)
    assert [e.value for e in at.error] == [f"Cannot plan: {refused.value}"]
    assert "must be greater than 0" in at.error[0].value
    assert not at.get("plotly_chart") and not at.metric


def test_an_unmeetable_slo_says_by_how_much_and_still_shows_the_closest():
    at = open_page({"tpot_ms": "0.1"})
    with pytest.raises(SloInfeasibleError) as infeasible:
        plan_slo(
            "llama-3.1-8b", SloWorkload(12, 2000, 300), Slo(1.0, 0.0001), SloCandidates(gpus=DEFAULT_GPUS)
        )
    assert [e.value for e in at.error] == [str(infeasible.value)]
    # what cannot be met and by how much: no decode step is faster than the fixed cost of the kernels it launches
    shortfall = infeasible.value.shortfall
    assert f"{shortfall:.2f}x the target" in str(infeasible.value)
    kernels = lk.kernels_per_step(get_model("llama-3.1-8b")) * VLLM_CROSS_MODEL_PROFILE["kernel_overhead_s"]
    assert shortfall >= kernels / 1e-4
    closest = min((c for c in infeasible.value.plan.configs if c.feasible), key=lambda c: c.slo_ratio)
    assert metrics(at)["Deployment"] == f"{closest.num_gpus} × {closest.gpu_name}"
    assert any("misses the SLO" in w.value for w in at.warning)
    assert len(at.dataframe[0].value) == infeasible.value.plan.num_evaluated
    # one decode step already takes longer than the target: no rate is simulated, and the page says why
    assert not at.get("plotly_chart")
    assert any(i.value.startswith("Nothing to draw") and closest.reason in i.value for i in at.info)


def test_a_rate_no_configuration_holds_still_draws_the_closest_curves():
    at = open_page({"model": "llama-3.1-70b"})
    with pytest.raises(SloInfeasibleError) as infeasible:
        plan_slo(
            "llama-3.1-70b", SloWorkload(12, 2000, 300), Slo(1.0, 0.05), SloCandidates(gpus=DEFAULT_GPUS)
        )
    assert infeasible.value.metric == "rate" and infeasible.value.shortfall > 1
    assert [e.value for e in at.error] == [str(infeasible.value)]
    assert "req/s" in at.error[0].value and "x short" in at.error[0].value
    closest = min((c for c in infeasible.value.plan.configs if c.feasible), key=lambda c: c.slo_ratio)
    assert metrics(at)["Deployment"] == f"{closest.num_gpus} × {closest.gpu_name}"
    assert len(at.get("plotly_chart")) == 1  # at lower rates the closest configurations are simulated
    assert any("closest to the SLO (none meets it)" in c.value for c in at.caption)


def test_no_gpu_type_chosen_is_an_error():
    at = open_page({"gpus": ""})
    assert [e.value for e in at.error] == ["Cannot plan: --gpus needs at least one value"]


def test_a_second_visit_with_the_same_inputs_computes_nothing(default_plan):
    """Both jobs are in the server's result cache after one visit: another session asking for the same inputs is
    answered at once, with the very objects the page drew from."""
    from core.page_models.slo_planner import DEFAULT_PARAMS, chart_configs
    from core.page_models.tasks import slo_curves, slo_search
    from ui.jobs import job_pool

    first = open_page()
    assert not first.error
    pool = job_pool()  # the process-wide pool the page used (st.cache_resource)
    searched = pool.submit("another-visitor", slo_search, DEFAULT_PARAMS)
    assert searched.finished and searched.result.error is None
    assert searched.result.plan.best == default_plan.best
    drawn = pool.submit("another-visitor", slo_curves, DEFAULT_PARAMS, chart_configs(searched.result.plan))
    assert drawn.finished and len(drawn.result) == 3
    again = pool.submit("a-third-visitor", slo_search, DEFAULT_PARAMS)
    assert again.finished and again.result is searched.result
