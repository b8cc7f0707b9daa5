"""The Capacity Planner page's views of a scenario's result (`core.page_models.planner_scenario.ScenarioResult`):
its verdict, its key figures (against scenario A's for B) and the plan in detail (KV cache groups, the formula with
these numbers, the host KV tier and the `vllm serve` flags). `app_pages/planner.py` draws them."""

import streamlit as st

from core.page_models.planner import formula_lines, hybrid_comparison, kv_group_rows
from ui.charts import cached_dataframe, cached_value
from ui.planner.state import SCENARIO_NAMES
from ui.theme import fmt_int


def show_metrics(result, baseline) -> None:
    """The scenario's key figures as metric cards, with deltas against `baseline` (scenario A's result) for B."""
    p, w = result.plan, result.what_if
    b = baseline.plan if baseline else None
    bw = baseline.what_if if baseline else None

    def delta(value, base_value) -> dict:
        """st.metric's delta arguments: none without a baseline; an unchanged figure reads "±0", grey, no arrow
        (Streamlit draws a green up arrow for "+0")."""
        if baseline is None or value is None or base_value is None:
            return {}
        change = f"{value - base_value:+,.0f}"
        if change in ("+0", "-0"):
            return {"delta": "±0", "delta_color": "off", "delta_arrow": "off"}
        return {"delta": change}

    c = st.columns(5)
    c[0].metric("KV tokens per replica", fmt_int(p.kv_tokens), **delta(p.kv_tokens, b and b.kv_tokens))
    c[1].metric("KV blocks", fmt_int(p.num_blocks), **delta(p.num_blocks, b and b.num_blocks))
    c[2].metric(
        "Full-length requests",
        fmt_int(p.max_concurrency_total),
        **delta(p.max_concurrency_total, b and b.max_concurrency_total),
        help=f"Requests of {p.context_len:,} tokens held at once, all replicas together; each holds "
        f"ceil({p.context_len:,} / {p.block_size}) blocks.",
    )
    c[3].metric(
        "Avg concurrent, paged",
        fmt_int(w.paged_concurrency) if w else "—",
        **delta(w.paged_concurrency if w else None, bw.paged_concurrency if bw else None),
        help="Per replica, capped at max_num_seqs; the chart below shows the memory-bound figure.",
    )
    c[4].metric(
        "Decode tokens/s (est.)",
        fmt_int(p.decode_tokens_per_s) if p.decode_tokens_per_s else "—",
        **delta(p.decode_tokens_per_s, b and b.decode_tokens_per_s),
        help="Roofline estimate: weights + KV read per step over memory bandwidth (or FLOPs over peak).",
    )
    if p.decode_tokens_per_s:
        st.caption(
            f"Decode tokens/s (est.): a batch of {p.decode_batch:,} requests per replica (the smaller of the full-"
            f"length requests that fit and max_num_seqs) at a context of {p.context_len:,} tokens, "
            f"{p.replicas:,} replica{'s' * (p.replicas > 1)}: a roofline upper bound."
        )


def show_verdict(prefix: str, result) -> None:
    """The scenario's heading (model on GPUs) and its verdict (green when the plan fits)."""
    st.markdown(
        f"#### {SCENARIO_NAMES[prefix]}: {result.model.name} on {result.plan.num_gpus} × {result.gpu.name}"
    )
    (st.success if result.plan.fits else st.error)(result.plan.verdict)


def show_plan(prefix: str, result, workload_error: str | None) -> None:
    """The plan in detail: KV cache groups, the formula with these numbers, the host tier, `vllm serve`'s flags."""
    st.markdown(f"**{SCENARIO_NAMES[prefix]}**")
    if result.model.is_hybrid or len(result.plan.kv_layout.groups) > 1:
        st.markdown("KV cache groups, as vLLM V1 lays them out:")
        cached_dataframe(st, cached_value(kv_group_rows, result.plan), width="stretch")
        comparison = hybrid_comparison(result)
        if comparison:
            st.caption(comparison)
    if result.workload_error and result.workload_error != workload_error:
        st.warning(f"Workload what-if: {result.workload_error}")
    with st.expander("Formula, with these numbers", expanded=prefix == "a_"):
        for line in formula_lines(result):
            st.markdown(f"- {line}")
        for note in result.plan.notes:
            st.caption(note)
    tier = result.host_tier
    if tier is not None:
        st.markdown(
            f"Host KV tier: {tier.kv_offload_gib:g} GiB per replica holds **{tier.host_kv_tokens:,} tokens** "
            f"({tier.host_kv_blocks:,} host blocks of {tier.host_block_bytes:,} B over {tier.world_size} GPU(s); "
            f"{tier.host_extra_tokens:,} beyond HBM, the tier being inclusive); "
            f"{tier.host_memory_bytes_total / 1024**3:,.0f} GiB of pinned host memory over all replicas."
        )
    st.markdown("`vllm serve` flags for this plan:")
    flags = f" \\\n  {tier.vllm_flags}" if tier is not None else ""
    st.code(result.plan.vllm_command + flags, language="bash", wrap_lines=True)
