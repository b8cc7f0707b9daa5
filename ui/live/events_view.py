"""The Live page's KV-events views: each rank's cached blocks as prefix trees labelled with the server's text,
the blocks several replicas hold at once, and where a prompt's leading blocks are cached."""

import pandas as pd
import streamlit as st

from core.live.fleet_prefixes import fleet_prefixes
from core.live.prompt_lookup import PrefixLabels, detokenize
from core.live.watch import LiveWatch, PollResult, Sources
from core.page_models.live_lookup import LookupRequest, answer_lookup
from ui.live.figures import tree_figure
from ui.live.url import LiveInputs

LABELS_KEY = "_live_prefix_labels"
TREE_NOTE = (
    "**What the tree shows:** the blocks the server announced as cached (BlockStored) and not yet evicted "
    "(BlockRemoved), chained by parent hash, per KV cache group and medium: which prefixes are cached and how "
    "they branch. **What it cannot show:** which request holds which slot, ref counts, physical block ids, free "
    "or in-use blocks, or prefix-cache hits: events carry none of these (a hit is not announced again). Usage "
    "comes from the metrics above. Blocks cached before the page subscribed appear only if the server's replay "
    "buffer still holds them."
)


def draw_events(live: LiveInputs, result: PollResult) -> None:
    """The cached-block tables and tree of each rank's KV events, and why a silent socket is silent."""
    sources, watch, values = live.sources, live.watch, live.values
    if sources.events is None:
        st.caption(
            "Give a KV events endpoint (a server started with --kv-events-config) to see cached blocks."
        )
        return
    st.subheader("Cached blocks (KV cache events)")
    if result.events_error:
        st.warning(f"KV events: {result.events_error}")
    rows = []
    for rank, sub in enumerate(watch.subscribers):
        s = sub.stats
        rows.append(
            {
                "rank": rank,
                "endpoint": sub.endpoint.address + (" (bound here)" if sub.bind else ""),
                "cached blocks": sub.tree.num_blocks(),
                "pools (group · medium)": ", ".join(
                    f"{g} · {m}: {n:,}" for (g, m), n in sub.tree.counts().items()
                ),
                "batches": s.applied,
                "last seq": s.last_seq,
                "gaps": len(s.gaps),
                "replayed": s.replayed,
                "lost": s.lost,
                "restarts": s.restarts,
                "bad messages": s.bad_messages,
            }
        )
    if watch.pub_silent:
        if sources.bind:
            st.warning(
                "The replay endpoint answers with new batches but nothing arrives on the bound events socket: is "
                f"the server's KV events endpoint {sources.events.address} (its PUB socket connects there)?"
            )
        else:
            st.warning(
                "The PUB socket is silent while the replay answers with new batches: the server publishes, but "
                "not to this page. A vLLM whose events endpoint names a host (not tcp://*:PORT) connects its "
                "PUB socket instead of binding it: turn on **Bind the events socket here** (or start vLLM with "
                "a wildcard endpoint). Meanwhile the tree is kept from the replay."
            )
    if rows and all(sub.stats.received == 0 and sub.stats.replayed == 0 for sub in watch.subscribers):
        st.caption(
            f"No batch has arrived yet on topic {sources.topic!r}. An idle server sends none; vLLM's default topic "
            "is empty (clear the Topic field to receive every topic); a replay endpoint fills in the history."
        )
    if rows:
        table = pd.DataFrame(rows)
        st.dataframe(table, hide_index=True, width="stretch")
        if len(rows) > 1:
            st.caption(f"Fleet: {int(table['cached blocks'].sum()):,} cached blocks over {len(rows)} ranks.")
            draw_fleet_prefixes(watch)
        errors = [
            f"rank {r}: {sub.stats.last_error}"
            for r, sub in enumerate(watch.subscribers)
            if sub.stats.last_error
        ]
        if errors:
            st.caption("Last stream problem: " + "; ".join(errors))
        rank = values["tree_rank"]
        if rank < len(watch.subscribers):
            tree = watch.subscribers[rank].tree
            if tree.num_blocks():
                texts = prefix_texts(sources, tree)
                fig, drawn = tree_figure(tree, texts=texts)
                st.plotly_chart(fig, width="stretch")
                if drawn < tree.num_blocks():
                    st.caption(
                        f"{drawn:,} of {tree.num_blocks():,} blocks drawn (the shallowest, largest first)."
                    )
            else:
                st.info(f"Rank {rank} has announced no cached block yet.")
    st.markdown(TREE_NOTE)


def prefix_texts(sources: Sources, tree) -> dict:
    """The server's text of the drawn blocks' tokens (its /detokenize), fetched a few per poll, shallowest first."""
    if not sources.urls:
        return {}
    server = sources.urls[0]
    held = st.session_state.get(LABELS_KEY)
    if (
        held is None or held[0] != server.url
    ):  # a hash fixes the tokens; the text is this server's tokenizer's
        held = st.session_state[LABELS_KEY] = (server.url, PrefixLabels())
    labels: PrefixLabels = held[1]
    order = sorted(
        (p for pool in tree.pools() for p in tree.walk(pool)), key=lambda p: (p.depth, -p.blocks_below)
    )
    labels.fetch([p.block for p in order], lambda ids: detokenize(server, ids))
    if labels.error and not labels.texts:
        st.caption(
            f"The prefixes are labelled by hash: the server's /detokenize did not answer ({labels.error})."
        )
    return labels.texts


def draw_lookup(live: LiveInputs) -> None:
    """Where is my prompt cached: per server and medium, the prompt's leading blocks cached."""
    values, watch, sources = live.values, live.watch, live.sources
    st.subheader("Where is my prompt cached")
    if not values["lookup"].strip():
        st.caption(
            "Type a prompt sent to the server before (in the box above) to see where its prefix is cached."
        )
        return
    request = LookupRequest(
        values["lookup"], values["lookup_as"], values["hash_algo"], values["hash_seed"], values["cache_salt"]
    )
    trees = {f"rank {r}": sub.tree for r, sub in enumerate(watch.subscribers)}
    answer = answer_lookup(request, trees, sources.urls[0] if sources.urls else None)
    if answer.error:
        st.error(f"The prompt cannot be looked up: {answer.error}")
        return
    st.markdown(f"**{answer.sentence}**")
    if answer.rows:
        st.dataframe(pd.DataFrame(answer.rows), hide_index=True, width="stretch")
    st.caption(f"The prompt has {len(answer.token_ids):,} tokens; a partial last block is never cached.")


def draw_fleet_prefixes(watch: LiveWatch) -> None:
    """Which prefixes each replica (rank) holds and how many blocks several hold at once (group 0, GPU)."""
    fleet = fleet_prefixes({f"rank {r}": sub.tree for r, sub in enumerate(watch.subscribers)})
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "replica": r.name,
                    "cached blocks": r.blocks,
                    "prefixes (first blocks)": r.prefixes,
                    "also cached elsewhere": r.shared,
                    "chain unknown": r.orphans,
                }
                for r in fleet.replicas
            ]
        ),
        hide_index=True,
        width="stretch",
    )
    st.caption(
        f"{fleet.duplicated_blocks:,} of {fleet.distinct_blocks:,} distinct cached blocks are held by several "
        f"replicas at once ({fleet.extra_copies:,} blocks of memory spent twice or more), matched by their tokens. "
        "Round-robin routing spreads every prefix over every replica; prefix-aware routing keeps each on one."
    )
