"""Block manager playground: drive a real BlockManager + KVCache one action at a time."""

import pandas as pd
import streamlit as st

from core.device import format_bytes
from core.errors import LabError
from core.paging.playground import Playground, PlaygroundConfig
from ui.playground_figures import block_heatmap, free_blocks_over_actions, waste_over_actions

st.title("Block manager playground")
st.markdown(
    "PagedAttention stores each sequence's KV cache in fixed-size blocks found through a block table, so memory "
    "is taken one block at a time and shared between forks instead of reserved up front. Every button below runs "
    "the real `BlockManager` and writes real K/V tensors into a paged `KVCache`."
)

with st.expander("Pool settings (applying them starts a new pool)", expanded=False), st.form("pool"):
    c1, c2, c3 = st.columns(3)
    num_blocks = c1.number_input("Physical blocks", 1, 4096, PlaygroundConfig.num_blocks, key="cfg_blocks")
    block_size = c2.number_input("Block size (tokens)", 1, 256, PlaygroundConfig.block_size, key="cfg_bs")
    head_dim = c3.number_input("Head dim", 1, 512, PlaygroundConfig.head_dim, key="cfg_head_dim")
    c4, c5, c6 = st.columns(3)
    max_len = c4.number_input(
        "Contiguous reservation per sequence (tokens)", 1, 1_048_576, PlaygroundConfig.contiguous_max_len
    )
    system_len = c5.number_input(
        "Shared system prompt (tokens)", 0, 1_048_576, PlaygroundConfig.system_prompt_len
    )
    caching = c6.toggle("Prefix caching", value=False, key="cfg_caching")
    demo = st.checkbox("Start from the demo scene", value=True)
    if st.form_submit_button("Apply and reset pool"):
        config = PlaygroundConfig(
            num_blocks=int(num_blocks),
            block_size=int(block_size),
            head_dim=int(head_dim),
            enable_prefix_caching=caching,
            contiguous_max_len=int(max_len),
            system_prompt_len=int(system_len),
        )
        try:
            st.session_state.playground = Playground.demo(config) if demo else Playground(config)
        except LabError as error:
            st.error(f"Settings not applied: {error}")

if "playground" not in st.session_state:
    st.session_state.playground = Playground.demo()
playground: Playground = st.session_state.playground
config = playground.config

a1, a2 = st.columns([1, 2])
with a1, st.container(border=True):
    st.markdown("**New sequence**")
    prompt_len = st.number_input("Prompt length (tokens)", 1, 1_048_576, 37, key="prompt_len")
    if st.button("Add sequence", key="add"):
        try:
            playground.add_sequence(int(prompt_len))
        except LabError as error:
            st.error(str(error))
with a2, st.container(border=True):
    st.markdown("**Act on a sequence**")
    sequences = playground.manager.seq_ids()
    if sequences:
        b1, b2 = st.columns(2)
        target = b1.selectbox("Sequence", sequences, key="target")
        count = b2.number_input("Tokens to append", 1, 100_000, 1, key="append_count")
        d1, d2, d3 = st.columns(3)
        action = None
        if d1.button("Append", key="append"):
            action = lambda: playground.append(target, int(count))  # noqa: E731
        if d2.button("Fork", key="fork"):
            action = lambda: playground.fork(target)  # noqa: E731
        if d3.button("Free", key="free"):
            action = lambda: playground.free(target)  # noqa: E731
        if action is not None:
            try:
                action()
            except LabError as error:
                st.error(str(error))
    else:
        st.info("No live sequence: add one on the left.")

last = playground.history[-1]
st.caption(f"Last action: {last.action}: {'done' if last.ok else 'refused'} ({last.message})")
snapshot = playground.snapshot()
waste = playground.waste()
m1, m2, m3, m4, m5, m6 = st.columns(6)
m1.metric("Free blocks", f"{snapshot.num_free_blocks:,} / {config.num_blocks:,}")
m2.metric("Sequences", f"{len(snapshot.seq_ids):,}")
m3.metric("Tokens stored", f"{waste.stored_tokens:,}", help="distinct slots holding K/V (shared blocks once)")
m4.metric("Empty: paged", f"{waste.paged:,}", help="unfilled slots of the blocks sequences own")
m5.metric(
    "Empty: contiguous",
    f"{waste.contiguous:,}",
    help=f"a contiguous cache reserving {config.contiguous_max_len:,} tokens per sequence",
)
m6.metric("KV read-back error", f"{playground.verify():.1e}", help="max |gathered K/V - written K/V|")
if config.enable_prefix_caching:
    stats = playground.manager.prefix_cache_stats
    st.caption(
        f"Prefix cache: {stats.hits_tokens:,} of {stats.queries_tokens:,} prompt tokens hit "
        f"({stats.hit_rate:.0%}); {playground.manager.num_cached_free_blocks:,} free blocks still cached; "
        f"{stats.evictions_blocks:,} evictions."
    )

st.plotly_chart(block_heatmap(snapshot, playground.color_index), width="stretch", key="heatmap")
left, right = st.columns(2)
left.plotly_chart(free_blocks_over_actions(playground.history, config.num_blocks), width="stretch")
right.plotly_chart(waste_over_actions(playground.history, config.bytes_per_token), width="stretch")

st.subheader("Block tables (logical → physical)")
rows = [
    {
        "sequence": seq,
        "tokens": snapshot.num_tokens[seq],
        "blocks": len(table),
        "last block fill": f"{snapshot.num_tokens[seq] - (len(table) - 1) * config.block_size}/{config.block_size}",
        "block table": " ".join(f"{i}→{b}" for i, b in enumerate(table)),
    }
    for seq, table in snapshot.block_tables.items()
]
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
st.caption(
    f"One token of K and V here is {format_bytes(config.bytes_per_token)} (1 layer, {config.num_kv_heads} KV heads "
    f"× {config.head_dim} dims, float32); the paged pool holds {config.num_blocks * config.block_size:,} tokens."
)
with st.expander("Action history"):
    st.dataframe(pd.DataFrame([h.__dict__ for h in playground.history]), hide_index=True, width="stretch")
