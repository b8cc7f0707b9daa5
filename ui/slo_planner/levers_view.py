"""The SLO planner's predict mode: the levers' inputs (shared prefixes and chats, speculative decoding,
disaggregated prefill / decode) and the answer's figures that depend on them (the prefix-hit rate beside TTFT,
the mean accepted length, how a disaggregated deployment's GPUs split, tokens/s per GPU, what a larger KV cache
does). Streamlit rendering only: every value comes from `core.page_models.slo_predict.DeploymentAnswer`."""

from collections.abc import Callable
from typing import Any

import streamlit as st

from core.planning.catalog.models import MODELS
from core.planning.cost.fits.profile_checks import check_words
from core.planning.cost.speculative import SPECULATION_FIELDS
from core.planning.predict.deployment_fields import OFFLOAD_FIELDS
from core.planning.predict.disagg import DISAGG_FIELDS
from core.planning.predict.load import LEVER_FIELDS as LOAD_LEVERS
from core.serving.steady_state import SteadyStateSettings
from ui.charts import cached_dataframe
from ui.input_fields import input_widget
from ui.metric_cards import Card, metric_cards

STEADY = SteadyStateSettings()  # predict's own settings: the tolerance and cap its `converged` refers to


def latency_text(seconds: float | None) -> str:
    """ "—", "850 ms" or "1.2 s"."""
    if seconds is None:
        return "—"
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def lever_inputs(w: Callable[..., Any]) -> None:
    """The levers' inputs (`w`: the page's `UrlState.widget`, so each is in the URL): shared prefixes and chats,
    speculative decoding, disaggregated prefill / decode."""
    c1, c2, c3 = st.columns(3)
    with c1:
        st.markdown("**Shared prefixes and chats**")
        for field in LOAD_LEVERS:
            extra = {"placeholder": "uniform"} if field.optional else {}
            input_widget(w, st.number_input, field, **extra)
        input_widget(w, st.number_input, OFFLOAD_FIELDS[0])
        input_widget(w, st.selectbox, OFFLOAD_FIELDS[1])
    with c2:
        st.markdown("**Speculative decoding**")
        for field in SPECULATION_FIELDS:
            if field.name == "spec_acceptance":
                help_ = (
                    "the probability that draft token i is accepted given the ones before it, each in [0, 1]"
                )
                input_widget(w, st.text_input, field, help=help_)
            elif field.name == "draft_model":
                input_widget(w, st.selectbox, field, format_func=lambda m: MODELS[m].name)
            else:
                input_widget(w, st.number_input if field.kind == "int" else st.selectbox, field)
    with c3:
        st.markdown("**Disaggregated prefill / decode**")
        disagg, p_workers, p_tp, d_workers, d_tp, kv_link = DISAGG_FIELDS
        input_widget(w, st.checkbox, disagg)
        a, b = st.columns(2)
        with a:
            input_widget(w, st.number_input, p_workers)
            input_widget(w, st.number_input, d_workers)
        with b:
            input_widget(w, st.number_input, p_tp)
            input_widget(w, st.number_input, d_tp)
        input_widget(w, st.selectbox, kv_link)


def agg_cards(p: dict, params) -> list[Card]:
    """An aggregated deployment: its layout, throughput, mean batch, KV-limited, converged."""
    throughput = p["throughput_tokens_per_s"]
    return [
        Card("Deployment", f"{p['deployment']['num_gpus']} × {p['deployment']['gpu']}"),
        Card("TP × PP × replicas", f"{params.tp} × {params.pp} × {params.replicas}"),
        Card("Output throughput", "—" if throughput is None else f"{throughput:,.0f} tok/s"),
        Card("Mean running batch", f"{p['mean_running_batch']:.3g}", "per replica"),
        Card(
            "KV-limited",
            "yes" if p["kv_limited"] else "no",
            "the KV cache, not compute, held requests back: queueing for blocks or preemption",
        ),
        Card(
            "Converged",
            "yes" if p["converged"] else "no",
            f"every percentile's 95% interval within {STEADY.tolerance:.0%} of its value",
        ),
    ]


def disagg_cards(p: dict) -> list[Card]:
    """A disaggregated deployment: how its GPUs split, the KV transfer and its link's load."""
    d, throughput = p["deployment"], p["throughput_tokens_per_s"]
    return [
        Card("Mode", p["mode"]),
        Card(
            "Prefill / decode GPUs",
            f"{p['prefill_gpus']} + {p['decode_gpus']}",
            f"prefill: {d['prefill_workers']} worker(s) of tp {d['prefill_tp']}; "
            f"decode: {d['decode_workers']} of tp {d['decode_tp']}",
        ),
        Card(
            "KV transfer per request",
            latency_text(p["kv_transfer_s"]),
            f"{p['kv_bytes_per_request']:,} bytes over {p['kv_link']}",
        ),
        Card("KV link utilization", f"{p['kv_link_utilization']:.3g}", "1 or more: no steady state"),
        Card("Output throughput", "—" if throughput is None else f"{throughput:,.0f} tok/s"),
    ]


def lever_cards(p: dict) -> list[Card]:
    """TTFT with the prefix-hit rate beside it (prompts sharing tokens), the mean accepted length
    (speculation), and output tokens/s per GPU."""
    per_gpu = p.get("tokens_per_s_per_gpu")
    cards = [
        Card("TTFT p50 (predicted)", latency_text(p["ttft_p50_s"])),
        Card("TTFT p99 (predicted)", latency_text(p["ttft_p99_s"])),
        Card("Output tokens/s per GPU", "—" if per_gpu is None else f"{per_gpu:,.0f}"),
    ]
    hit = p["prefix_hit_rate"] if p["mode"] == "agg" else p["prefill"]["prefix_hit_rate"]
    if hit is not None:
        host = (
            p.get("host_hit_rate") if p["mode"] == "agg" and p["deployment"].get("kv_offload_gib") else None
        )
        cards.append(
            Card(
                "Prefix-hit rate",
                f"{hit:.3f}"
                if host is None
                else f"{hit:.3f} = {p['gpu_hit_rate']:.3f} HBM + {host:.3f} host",
                "prompt tokens served from the prefix cache (HBM, then the host tier) / prompt tokens",
            )
        )
    if p.get("mean_accepted_len") is not None:
        accepted = f"{p['mean_accepted_len']:.3g} tokens/step"
        meaning = "tokens one speculative step emits per sequence: 1 + a1 + a1 a2 + ..."
        cards.append(Card("Mean accepted length", accepted, meaning))
    return cards


def show_prediction_figures(p: dict, params) -> None:
    """The prediction's metric cards: the deployment's (aggregated or disaggregated), then the levers'."""
    own = disagg_cards(p) if p["mode"] == "disagg" else agg_cards(p, params)
    metric_cards([*own, *lever_cards(p)])


def wide_intervals(p: dict) -> list[str]:
    """The percentiles whose 95% interval is wider than predict's tolerance (half-width over the value), as
    "ITL p90: 8.16-73.4 ms around 8.32 ms", widest first."""
    wide = []
    for key, (low, high) in p.get("intervals", {}).items():
        value = p.get(key)
        if value and (high - low) / 2 / value > STEADY.tolerance:
            metric, quantile, _ = key.split("_")
            text = f"{metric.upper()} {quantile}: {_span(low, high)} around {latency_text(value)}"
            wide.append(((high - low) / value, text))
    return [text for _, text in sorted(wide, reverse=True)]


def _span(low: float, high: float) -> str:
    """ "8.16-73.4 ms", or "0.98-1.2 s" when the interval reaches a second."""
    if high >= 1:
        return f"{low:.3g}-{high:.3g} s"
    return f"{low * 1e3:.3g}-{high * 1e3:.3g} ms"


def _why_not_converged(p: dict) -> str:
    if not p.get("stable", True):
        return "past capacity there is no steady state to converge to (the warning above)"
    wide = wide_intervals(p)
    if not wide:  # every interval narrow enough, but the batches were shorter than the settings ask
        return "the measured requests' batches are shorter than the request lifetimes they must span"
    return f"a half-width over {STEADY.tolerance:.0%} of the value, " + "; ".join(wide)


def percentiles_caption(p: dict) -> str:
    """What the percentile chart and table hold: one replica's simulation, or a disaggregated sum of parts."""
    if p["mode"] == "disagg":
        return (
            "Steady-state percentiles of a disaggregated deployment: TTFT and e2e add the prefill pool's TTFT, "
            "the KV transfer and the decode pool's (an upper bound of the sum's percentile); TPOT and ITL are "
            "the decode pool's; open bars: the targets (docs/levers.md)."
        )
    converged = (
        f"Converged: every interval is within {STEADY.tolerance:.0%} of its value."
        if p["converged"]
        else f"Not converged at the {STEADY.max_requests:,}-request cap: {_why_not_converged(p)}."
    )
    checked = check_words(p.get("profile_check"), p["deployment"]["model"], p["deployment"]["gpu"])
    return (
        f"Steady-state percentiles of one replica's simulation ({p['simulated_requests']:,} requests, "
        f"{p['warmup_requests']:,} of warm-up dropped, {p['measured_requests']:,} measured); error bars: 95% "
        f"batch-means intervals; open bars: the targets. {converged}" + (f" {checked}" if checked else "")
    )


def show_larger_kv(rows) -> None:
    """`slo_predict.larger_kv_rows`: the same load with fp8 KV and with twice the GPUs, side by side."""
    st.markdown("**What a larger KV cache does to the prefix-hit rate and TTFT** (the same load)")
    formats = {k: st.column_config.NumberColumn(format="%.4g") for k in ("TTFT p50 (s)", "TTFT p99 (s)")}
    cached_dataframe(st, list(rows), width="stretch", column_config=formats)
    st.caption(
        "Each row is its own steady-state prediction: fp8 KV halves the bytes per token, so the same memory holds "
        "twice the blocks; twice the GPUs as tensor parallel splits the weights over twice the GPUs (replicas "
        "when the model's heads do not allow it: the same cache per replica at half the load). Cached prefixes "
        "compete with running requests for the blocks, and evictions are LRU, as in vLLM."
    )
