"""Block manager playground: drive a real BlockManager + KVCache one action at a time, or replay a scenario."""

import time

import pandas as pd
import streamlit as st

from core.device import format_bytes
from core.errors import LabError
from core.kv.host_tier import OFFLOAD_POLICIES
from core.page_models.playground import Playground, PlaygroundConfig
from core.page_models.scenarios import SCENARIOS, Scenario, cpp_status_lines, replay
from ui.playground.figures import (
    block_heatmap,
    free_blocks_over_actions,
    hbm_marks,
    host_tier_heatmap,
    waste_over_actions,
)
from ui.playground.url import (
    FREE_PLAY,
    HOST_FIELDS,
    URL_FIELDS,
    host_from_params,
    host_params,
    params_for,
    position_from_params,
)

PLAY_DELAY_S = 1.2  # pause between two steps while playing
SCENARIO, STEP, PLAYING = "_pg_scenario", "_pg_step", "_pg_playing"  # the position (not widget keys)
WRITTEN, URL_ERRORS, ACTION_ERROR, REPLAYED = "_pg_url", "_pg_url_errors", "_pg_action_error", "_pg_replayed"
TITLES = {FREE_PLAY: "Free play (your own actions)"} | {key: s.title for key, s in SCENARIOS.items()}


def sync_from_url() -> None:
    """Take the position (and the free-play pool's host tier) from the URL on the first run and whenever the
    URL no longer matches what we wrote."""
    fields = (*URL_FIELDS, *HOST_FIELDS)
    current = {field.key: st.query_params[field.key] for field in fields if field.key in st.query_params}
    if SCENARIO in st.session_state and (st.session_state.get(WRITTEN) == current or not current):
        return  # ours, or back from another page (navigation drops the query): keep this session's place
    key, step, errors = position_from_params(current)
    st.session_state[SCENARIO], st.session_state[STEP], st.session_state[PLAYING] = key, step, False
    host, host_errors = host_from_params(current)
    errors += host_errors
    if host["host_blocks"]:  # the free-play pool with that tier behind it (prefix caching on)
        try:
            config = PlaygroundConfig(enable_prefix_caching=True, **host)
            st.session_state.playground = Playground.demo(config)
        except LabError as error:
            errors.append(f"Host tier not applied: {error}")
    elif getattr(st.session_state.get("playground"), "host_tier", None) is not None:
        st.session_state.playground = Playground.demo()  # the URL asks for no tier: back to the plain pool
    st.session_state[URL_ERRORS] = errors


def write_url() -> None:
    wanted = params_for(st.session_state[SCENARIO], st.session_state[STEP])
    if st.session_state[SCENARIO] == FREE_PLAY:
        config = st.session_state.playground.config
        wanted |= host_params(config.host_blocks, config.host_block_tokens, config.offload_policy)
    for field in (*URL_FIELDS, *HOST_FIELDS):
        if field.key in wanted and st.query_params.get(field.key) != wanted[field.key]:
            st.query_params[field.key] = wanted[field.key]
        elif field.key not in wanted and field.key in st.query_params:
            del st.query_params[field.key]
    st.session_state[WRITTEN] = wanted


def current_scenario() -> Scenario | None:
    key = st.session_state[SCENARIO]
    return None if key == FREE_PLAY else SCENARIOS[key]


def shown_playground() -> Playground:
    """The scenario replayed to its step (memoised for this session), or the live free-play pool."""
    scenario = current_scenario()
    if scenario is None:
        if "playground" not in st.session_state:
            st.session_state.playground = Playground.demo()
        return st.session_state.playground
    position = (scenario.key, st.session_state[STEP])
    memo = st.session_state.get(REPLAYED)
    if memo is None or memo[0] != position:
        memo = (position, replay(scenario, position[1]))
        st.session_state[REPLAYED] = memo
    return memo[1]


# ---- callbacks: they run before the rerun, so they may move the picker and the slider ---------------------------


def on_pick() -> None:
    st.session_state[SCENARIO], st.session_state[STEP] = st.session_state.pg_scenario, 0
    st.session_state[PLAYING] = False


def on_slide() -> None:
    st.session_state[STEP], st.session_state[PLAYING] = st.session_state.pg_step, False


def on_move(delta: int) -> None:
    last = current_scenario().num_steps
    st.session_state[STEP] = min(max(st.session_state[STEP] + delta, 0), last)
    st.session_state[PLAYING] = False


def on_play() -> None:
    if st.session_state[PLAYING]:
        st.session_state[PLAYING] = False
        return
    if st.session_state[STEP] >= current_scenario().num_steps:
        st.session_state[STEP] = 0  # play again from the start
    st.session_state[PLAYING] = True


def leave_script() -> Playground:
    """The pool shown becomes the live free-play pool (a fresh replay, so the script's memo stays intact)."""
    scenario = current_scenario()
    if scenario is not None:
        st.session_state.playground = replay(scenario, st.session_state[STEP])
        st.session_state[SCENARIO], st.session_state[PLAYING] = FREE_PLAY, False
    return st.session_state.playground


def on_action(kind: str) -> None:
    playground = leave_script()
    state = st.session_state
    try:
        if kind == "add":
            playground.add_sequence(int(state.prompt_len))
        elif kind == "append":
            playground.append(state.target, int(state.append_count))
        elif kind == "fork":
            playground.fork(state.target)
        else:
            playground.free(state.target)
    except LabError as error:
        state[ACTION_ERROR] = str(error)


def on_apply_settings() -> None:
    state = st.session_state
    try:
        config = PlaygroundConfig(
            num_blocks=int(state.cfg_blocks),
            block_size=int(state.cfg_bs),
            head_dim=int(state.cfg_head_dim),
            enable_prefix_caching=bool(state.cfg_caching),
            contiguous_max_len=int(state.cfg_max_len),
            system_prompt_len=int(state.cfg_system_len),
            sliding_window=int(state.cfg_window) or None,
            host_blocks=int(state.cfg_host_blocks),
            host_block_tokens=int(state.cfg_host_block) or None,
            offload_policy=state.cfg_offload,
        )
        state.playground = Playground.demo(config) if state.cfg_demo else Playground(config)
    except LabError as error:
        state[ACTION_ERROR] = f"Settings not applied: {error}"
        return
    state[SCENARIO], state[PLAYING] = FREE_PLAY, False


# ---- screen parts -----------------------------------------------------------------------------------------------


def scenario_controls(scenario: Scenario, playground: Playground) -> None:
    step, last = st.session_state[STEP], scenario.num_steps
    b1, b2, b3 = st.columns(3)
    b1.button(
        "Back",
        key="pg_back",
        icon=":material/skip_previous:",
        on_click=on_move,
        args=(-1,),
        disabled=step == 0,
        width="stretch",
    )
    b2.button(
        "Next",
        key="pg_next",
        icon=":material/skip_next:",
        on_click=on_move,
        args=(1,),
        disabled=step == last,
        width="stretch",
    )
    playing = st.session_state[PLAYING]
    b3.button(
        "Pause" if playing else "Play",
        key="pg_play",
        icon=":material/pause:" if playing else ":material/play_arrow:",
        on_click=on_play,
        width="stretch",
    )
    st.session_state.pg_step = step
    st.slider("Step", 0, last, key="pg_step", on_change=on_slide)
    text = scenario.narration(step)
    st.info(f"**Step {step} of {last}.** {text}", icon=":material/school:")
    if step:
        done = playground.history[-len(scenario.steps[step - 1].actions) :]
        for entry in done:
            if entry.ok:
                st.caption(f"{entry.action}: done ({entry.message})")
            else:
                st.warning(f"{entry.action}: refused, as the script expects: {entry.message}")
    st.button(
        "Continue by hand from this step",
        key="pg_take_over",
        icon=":material/pan_tool:",
        on_click=leave_script,
        help="the pool at this step becomes yours: add, append, fork and free below",
        width="stretch",
    )


def action_panel(playground: Playground, scripted: bool) -> None:
    """Add / append / fork / free, stacked to fit the column beside the pool."""
    if scripted:
        st.caption("Acting here leaves the script at this step and goes on by hand from the pool shown.")
    with st.container(border=True):
        a1, a2 = st.columns([3, 2], vertical_alignment="bottom")
        a1.number_input("Prompt length (tokens)", 1, 1_048_576, 37, key="prompt_len")
        a2.button("Add sequence", key="add", on_click=on_action, args=("add",), width="stretch")
    with st.container(border=True):
        sequences = playground.manager.seq_ids()
        if sequences:
            b1, b2 = st.columns(2)
            b1.selectbox("Sequence", sequences, key="target")
            b2.number_input("Tokens to append", 1, 100_000, 1, key="append_count")
            d1, d2, d3 = st.columns(3)
            d1.button("Append", key="append", on_click=on_action, args=("append",), width="stretch")
            d2.button("Fork", key="fork", on_click=on_action, args=("fork",), width="stretch")
            d3.button("Free", key="free", on_click=on_action, args=("free",), width="stretch")
        else:
            st.info("No live sequence: add one above.")


def settings_form() -> None:
    """Pool settings, two to a row so every label fits the column beside the picture."""
    with st.expander("Pool settings (applying them starts a new pool)", expanded=False), st.form("pool"):
        c1, c2 = st.columns(2)
        c1.number_input("Physical blocks", 1, 4096, PlaygroundConfig.num_blocks, key="cfg_blocks")
        c2.number_input("Block size (tokens)", 1, 256, PlaygroundConfig.block_size, key="cfg_bs")
        c3, c4 = st.columns(2)
        c3.number_input("Head dim", 1, 512, PlaygroundConfig.head_dim, key="cfg_head_dim")
        c4.number_input(
            "Sliding window (tokens)",
            0,
            1_048_576,
            0,
            key="cfg_window",
            help="0 = full attention. Each token attends to the last W positions; blocks behind every future "
            "window are released",
        )
        c5, c6 = st.columns(2)
        c5.number_input(
            "Contiguous reserve (tokens)",
            1,
            1_048_576,
            PlaygroundConfig.contiguous_max_len,
            key="cfg_max_len",
            help="what a contiguous cache would reserve per sequence: the waste metrics compare against it",
        )
        c6.number_input(
            "System prompt (tokens)",
            0,
            1_048_576,
            PlaygroundConfig.system_prompt_len,
            key="cfg_system_len",
            help="a prompt prefix every new sequence shares (what prefix caching can reuse)",
        )
        h1, h2 = st.columns(2)
        h1.number_input(
            "Host tier (host blocks)",
            0,
            4096,
            0,
            key="cfg_host_blocks",
            help="a host-memory KV tier behind the pool (vLLM's native CPU offloading), 0 = none; needs "
            "prefix caching",
        )
        h2.number_input(
            "Host block (tokens)",
            0,
            4096,
            0,
            key="cfg_host_block",
            help="tokens per host block, a multiple of the block size; 0 = one GPU block",
        )
        st.selectbox("Host tier eviction", OFFLOAD_POLICIES, key="cfg_offload", format_func=str.upper)
        st.toggle("Prefix caching", value=False, key="cfg_caching")
        st.checkbox("Start from the demo scene", value=True, key="cfg_demo")  # full width: the label fits
        st.form_submit_button("Apply and reset pool", on_click=on_apply_settings, width="stretch")


def pool_overview(playground: Playground, scenario: Scenario | None) -> None:
    """The answer: the pool as a picture, its metrics and its free list."""
    config = playground.config
    last = playground.history[-1]
    if scenario is None:
        st.caption(f"Last action: {last.action}: {'done' if last.ok else 'refused'} ({last.message})")
    snapshot = playground.snapshot()
    tier = playground.host_tier
    if tier is None:
        st.plotly_chart(block_heatmap(snapshot, playground.color_index), width="stretch", key="heatmap")
    else:
        moves = playground.host_moves
        st.markdown(
            "**HBM (left) and the host tier (right).** Every block a sequence completes is copied down to the "
            "host tier (↓); a prompt whose prefix left HBM but is still in the host tier loads it back up (↑) "
            "instead of recomputing it. The marks show what the last action moved: "
            f"{len(moves.stored):,} host blocks stored, {len(moves.loaded):,} GPU blocks loaded, "
            f"{moves.evicted:,} host blocks evicted."
        )
        hbm, host = st.columns(2)
        hbm.plotly_chart(
            block_heatmap(snapshot, playground.color_index, title="HBM blocks", marks=hbm_marks(moves)),
            width="stretch",
            key="heatmap",
        )
        host.plotly_chart(host_tier_heatmap(tier, moves), width="stretch", key="host_heatmap")
    waste = playground.waste()
    if scenario is not None and scenario.seed_status:
        metrics, seed = st.columns([2, 1])  # room for the longest status line
        seed.markdown("**The C++ `print_status()`**, from our state")
        seed.code("\n".join(cpp_status_lines(playground.manager)), language=None)
    else:
        metrics = st.container()
    m = [*metrics.columns(3), *metrics.columns(3)]
    m[0].metric("Free blocks", f"{snapshot.num_free_blocks:,} / {config.num_blocks:,}")
    m[1].metric("Sequences", f"{len(snapshot.seq_ids):,}")
    m[2].metric(
        "Tokens stored", f"{waste.stored_tokens:,}", help="distinct slots holding K/V (shared blocks once)"
    )
    m[3].metric("Empty: paged", f"{waste.paged:,}", help="unfilled slots of the blocks sequences own")
    m[4].metric(
        "Empty: contiguous",
        f"{waste.contiguous:,}",
        help=f"a contiguous cache reserving {config.contiguous_max_len:,} tokens per sequence",
    )
    m[5].metric("KV read-back error", f"{playground.verify():.1e}", help="max |gathered K/V - written K/V|")
    if config.enable_prefix_caching:
        stats = playground.manager.prefix_cache_stats
        st.caption(
            f"Prefix cache: {stats.hits_tokens:,} of {stats.queries_tokens:,} prompt tokens hit in HBM "
            f"({stats.hit_rate:.0%}); {playground.manager.num_cached_free_blocks:,} free blocks still cached; "
            f"{stats.evictions_blocks:,} evictions."
        )
    if tier is not None:
        st.caption(
            f"Host tier: {playground.host_hit_tokens:,} prompt tokens loaded from it; "
            f"{tier.num_used_blocks:,} of {tier.num_blocks:,} host blocks hold KV; {tier.num_stored_blocks:,} "
            f"stored and {tier.num_evicted_blocks:,} evicted ({tier.policy.upper()}) so far."
        )
    order = snapshot.free_order.tolist()
    shown = ", ".join(f"{b}{' (cached)' if snapshot.is_cached[b] else ''}" for b in order[:64])
    st.markdown(
        f"**Free list** ({len(order):,} blocks, taken first to last): "
        + (shown + (f", … {len(order) - 64:,} more" if len(order) > 64 else "") if order else "empty")
    )


def pool_details(playground: Playground) -> None:
    """History charts, block tables and the action log of the pool shown."""
    config = playground.config
    snapshot = playground.snapshot()
    left, right = st.columns(2)
    left.plotly_chart(free_blocks_over_actions(playground.history, config.num_blocks), width="stretch")
    right.plotly_chart(waste_over_actions(playground.history, config.bytes_per_token), width="stretch")

    st.subheader("Block tables (logical → physical)")
    rows = [
        {
            "sequence": seq,
            "tokens": snapshot.num_tokens[seq],
            "blocks held": playground.manager.num_held_blocks(seq),
            "last block fill": f"{snapshot.num_tokens[seq] - (len(table) - 1) * config.block_size}/{config.block_size}",
            "block table": " ".join(f"{i}→{'·' if b < 0 else b}" for i, b in enumerate(table)),
        }
        for seq, table in ((s, snapshot.table(s)) for s in snapshot.seq_ids)
    ]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.caption("No sequence holds blocks yet: add one, or step the scenario on.")
    if config.sliding_window is not None:
        st.caption(
            f"Sliding window of {config.sliding_window:,} tokens: `·` marks a logical block released because no "
            "future token's window reaches it; its physical block is back in the pool."
        )
    st.caption(
        f"One token of K and V here is {format_bytes(config.bytes_per_token)} (1 layer, {config.num_kv_heads} KV "
        f"heads × {config.head_dim} dims, float32); the paged pool holds {config.num_blocks * config.block_size:,} "
        "tokens."
    )
    with st.expander("Action history"):
        st.dataframe(pd.DataFrame([h.__dict__ for h in playground.history]), hide_index=True, width="stretch")


# ---- the page ---------------------------------------------------------------------------------------------------

st.title("Block manager playground")
st.markdown(
    "PagedAttention keeps each sequence's KV cache in fixed-size blocks found through a block table: memory is "
    "taken a block at a time and shared between forks instead of reserved up front. Every button runs the real "
    "`BlockManager` and writes real K/V into a paged `KVCache`; a scenario replays a script of those actions."
)
sync_from_url()
for message in st.session_state.pop(URL_ERRORS, []):
    st.error(message)

picture, controls = st.columns([5, 3], gap="medium")
with controls:  # drawn first (callbacks move the position), shown beside the picture
    st.session_state.pg_scenario = st.session_state[SCENARIO]
    st.selectbox("Scenario", list(TITLES), format_func=TITLES.get, key="pg_scenario", on_change=on_pick)
    scenario = current_scenario()
    if scenario is not None and st.session_state[STEP]:
        st.caption(scenario.summary)
    playground = shown_playground()
    if scenario is not None:
        scenario_controls(scenario, playground)
    action_panel(playground, scripted=scenario is not None)
    if ACTION_ERROR in st.session_state:
        st.error(st.session_state.pop(ACTION_ERROR))
    if scenario is None:
        settings_form()
with picture:
    pool_overview(playground, scenario)
pool_details(playground)

write_url()
if scenario is not None and st.session_state[PLAYING]:
    if st.session_state[STEP] < scenario.num_steps:
        time.sleep(PLAY_DELAY_S)
        st.session_state[STEP] += 1
        st.session_state[PLAYING] = st.session_state[STEP] < scenario.num_steps
        st.rerun()
    st.session_state[PLAYING] = False
