"""The SLO search skips a wider KV cache where the narrower one of the same deployment missed: the order that makes
it possible, the row it writes, and the skipped candidate simulated anyway to check that it misses too."""

import pytest

from core.errors import SloInfeasibleError
from core.planning.catalog.models import MODELS
from core.planning.search.slo import Slo, SloCandidates, SloWorkload, plan_slo
from core.planning.search.slo_candidates import enumerate_candidates

# Llama-3.1-70B at 4 req/s on 2 x 2 H200 at TP 2 misses TPOT p95 <= 50 ms with either KV dtype (fp8: TPOT p95 at
# 3.8x the target on the default profile); one replica of TP 2 is pruned by its rate bound, nothing else is
# searched, so the search raises
WORKLOAD = SloWorkload(rate=4, prompt_len=2000, output_len=300)
SLO = Slo(ttft_p95_s=1.0, tpot_p95_s=0.05)


def _search(kv_dtypes: tuple[str, ...]):
    cands = SloCandidates(
        gpus=("h200-141gb",),
        max_gpus=4,
        tensor_parallel=(2,),
        pipeline_parallel=(1,),
        max_num_seqs=(256,),
        kv_dtypes=kv_dtypes,
    )
    with pytest.raises(SloInfeasibleError) as err:
        plan_slo("llama-3.1-70b", WORKLOAD, SLO, cands)
    return err.value


def test_the_narrower_kv_dtype_is_visited_first_at_each_layout_and_cap():
    cands = SloCandidates(gpus=("h100-80gb",), max_gpus=2, max_num_seqs=(128, 64), kv_dtypes=("auto", "fp8"))
    order = [
        (c.tp, c.pp, c.replicas, c.max_num_seqs, c.kv_dtype)
        for c in enumerate_candidates(MODELS["llama-3.1-8b"], cands)
    ]
    for i, (tp, pp, replicas, seqs, kv) in enumerate(order):
        if kv == "auto":
            assert order[i - 1] == (tp, pp, replicas, seqs, "fp8"), order


def test_a_wider_kv_cache_is_not_simulated_where_the_narrower_one_missed():
    err = _search(("auto", "fp8"))
    rows = {c.kv_dtype: c for c in err.plan.configs if c.replicas == 2}
    fp8, auto = rows["fp8"], rows["auto"]
    assert fp8.simulated and not fp8.meets_slo and fp8.dominated_by is None
    assert fp8.limiting_metric == "tpot_p95_s" and fp8.slo_ratio > 1.0
    assert not auto.simulated and not auto.meets_slo and auto.simulated_requests == 0
    assert auto.dominated_by == "fp8" and auto.slo_ratio is None
    assert auto.limiting_metric == fp8.limiting_metric and auto.binding == fp8.binding
    assert auto.reason.startswith("misses the SLO, not simulated: with KV cache dtype fp8")
    assert "TPOT p95 at" in auto.reason
    assert auto.kv_tokens < fp8.kv_tokens  # half the bytes a token: twice the slots, less the rounding
    assert err.plan.num_simulated == 1
    # the error's closest configuration is chosen among rows with a ratio (min over a None would raise)
    assert err.shortfall is not None and err.shortfall <= fp8.slo_ratio


def test_the_skipped_wider_kv_cache_misses_when_simulated():
    """The check of the rule: the auto row simulated on its own misses the same target, by no less."""
    fp8 = {c.kv_dtype: c for c in _search(("auto", "fp8")).plan.configs if c.replicas == 2}["fp8"]
    alone = next(c for c in _search(("auto",)).plan.configs if c.replicas == 2)
    assert alone.simulated and not alone.meets_slo and alone.dominated_by is None
    assert alone.limiting_metric == fp8.limiting_metric
    assert alone.slo_ratio >= fp8.slo_ratio
