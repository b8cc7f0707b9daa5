"""Stateful property test: random programs drive a `KVCacheManager` with a full-attention, a sliding-window and
a chunked-local group (prefix caching and events on) against a brute-force model.

The model keeps every request's true tokens and computed count, a fake KV store (block id -> the token written
in each slot) that the test writes the way an engine would (fresh blocks start empty, copy on `cow`, write the
tokens being computed just before `mark_computed`), and the set of cached (group, hash) rebuilt only from the
published events (encoded and decoded in vLLM's wire format). After every step:
- free + held == total, a block id is in at most one group's tables, ref counts == table occurrences;
- each table has ceil(n / B) entries, exactly the leading blocks no uncomputed token reads are -1 (window W:
  (c - W + 1) // B; chunk C: (c // C * C) // B, for c computed tokens), and every computed token reads back
  through the tables;
- every cached block holds, in the store, exactly the tokens its BlockStored announced (so nothing entered the
  cache before it was computed), prefix-cache hits read back their tokens, and the replayed hash set equals
  the manager's cached set;
- refused calls (out of blocks, unknown or duplicate ids, bad counts) change nothing and emit nothing.
"""

import itertools
from collections import Counter

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.errors import DuplicateSequenceError, InvalidArgumentError, OutOfBlocksError, UnknownSequenceError
from core.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, decode_event_batch, encode_event_batch
from core.kv.kv_cache_manager import KVCacheManager
from core.kv.specs import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

KINDS = ("full_attention", "sliding_window", "chunked_local_attention")


def cdiv(a, b):
    return -(-a // b)


def chain(parent, tokens):
    """The chained block key, written independently of core: Python's hash of (parent key, tokens)."""
    return hash((parent, tuple(tokens)))


class KVCacheManagerMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 30),
        full_bs=st.integers(1, 4),
        window=st.integers(1, 9),
        window_bs=st.sampled_from([1, 2, 4]),
        chunk=st.integers(1, 9),
        chunk_bs=st.sampled_from([1, 2, 4]),
    )
    def setup(self, num_blocks, full_bs, window, window_bs, chunk, chunk_bs):
        specs = [
            FullAttentionSpec(block_size=full_bs, num_kv_heads=1, head_size=8),
            SlidingWindowSpec(block_size=window_bs, num_kv_heads=1, head_size=8, sliding_window=window),
            ChunkedLocalAttentionSpec(
                block_size=chunk_bs, num_kv_heads=1, head_size=8, attention_chunk_size=chunk
            ),
        ]
        self.m = KVCacheManager(specs, num_blocks, enable_prefix_caching=True, enable_kv_cache_events=True)
        self.bs = [s.block_size for s in specs]
        self.window, self.chunk = window, chunk
        self.tokens: dict[int, list[int]] = {}
        self.computed: dict[int, int] = {}
        self.store: dict[int, list] = {}  # block id -> token per slot (None: never written)
        self.cached: dict[tuple[int, int], tuple] = {}  # (group, hash) -> tokens, from events only
        self.ids = itertools.count()
        self.fresh_tokens = itertools.count(100)
        self.queries = self.hits = 0

    # ---- the model --------------------------------------------------------------------------------------

    def skipped(self, group, computed):
        """Leading blocks of `group` no uncomputed token reads after `computed` tokens (the model's rule)."""
        bs = self.bs[group]
        if group == 1:
            return max(0, (computed - self.window + 1) // bs)
        if group == 2:
            return (computed // self.chunk * self.chunk) // bs
        return 0

    def tables(self):
        return {r: self.m.block_ids(r) for r in self.tokens}

    def occurrences(self):
        """block id -> (group, number of table entries naming it)."""
        seen: dict[int, tuple[int, int]] = {}
        for tables in self.tables().values():
            for g, table in enumerate(tables):
                for b in table:
                    if b >= 0:
                        group, count = seen.get(b, (g, 0))
                        assert group == g, f"block {b} is in the tables of groups {group} and {g}"
                        seen[b] = (g, count + 1)
        return seen

    def frozen(self):
        snap = self.m.snapshot()
        return (
            snap.ref_count.tolist(),
            snap.free_order.tolist(),
            snap.is_cached.tolist(),
            self.tables(),
            {r: (self.m.num_tokens(r), self.m.num_computed_tokens(r)) for r in self.tokens},
            self.m.cached_block_hashes(),
            (self.m.prefix_cache_queries, self.m.prefix_cache_hits),
        )

    def drain(self):
        """Replay the pending events (through the wire format) into the model's cached set."""
        events = self.m.take_events()
        if not events:
            return
        batch = decode_event_batch(encode_event_batch(events, ts=1.0))
        assert batch.events == events
        for event in batch.events:
            if isinstance(event, BlockStored):
                g = event.group_idx
                bs = self.bs[g]
                assert event.block_size == bs and event.kv_cache_spec_kind == KINDS[g]
                assert event.kv_cache_spec_sliding_window == (self.window if g == 1 else None)
                assert len(event.token_ids) == bs * len(event.block_hashes)
                parent = event.parent_block_hash
                for i, h in enumerate(event.block_hashes):
                    block_tokens = tuple(event.token_ids[i * bs : (i + 1) * bs])
                    assert h == chain(parent, block_tokens)
                    assert (g, h) not in self.cached
                    self.cached[(g, h)] = block_tokens
                    parent = h
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    del self.cached[(event.group_idx, h)]
            else:
                assert isinstance(event, AllBlocksCleared)
                self.cached.clear()

    def refused(self, call, error):
        self.drain()
        before = self.frozen()
        try:
            call()
        except error:
            pass
        else:
            raise AssertionError(f"expected {error.__name__}")
        assert self.frozen() == before
        assert self.m.take_events() == []

    # ---- rules ------------------------------------------------------------------------------------------

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=14))
    def allocate(self, prompt):
        self.drain()
        r = next(self.ids)
        held_before = set(self.occurrences())
        free_before = self.m.num_free_blocks
        needed = sum(cdiv(len(prompt), bs) for bs in self.bs)
        before = self.frozen()
        try:
            hits = self.m.allocate(r, prompt)
        except OutOfBlocksError:
            assert needed > free_before  # hits only lower the need: it fits whenever needed <= free
            assert self.frozen() == before and self.m.take_events() == []
            return
        assert 0 <= hits <= len(prompt) - 1 and all(hits % bs == 0 for bs in self.bs)
        self.queries += len(prompt)
        self.hits += hits
        self.tokens[r], self.computed[r] = list(prompt), hits
        for g, table in enumerate(self.m.block_ids(r)):
            bs = self.bs[g]
            skipped = self.skipped(g, hits)  # hit blocks no uncomputed token reads are not held
            assert len(table) == cdiv(len(prompt), bs) and table[:skipped] == [-1] * skipped
            parent = None
            for i, b in enumerate(table):
                if i < hits // bs:  # a hit: cached (per the events) and, when held, holding these tokens
                    parent = chain(parent, prompt[i * bs : (i + 1) * bs])
                    assert self.cached.get((g, parent)) == tuple(prompt[i * bs : (i + 1) * bs])
                    if i >= skipped:
                        assert self.store[b] == prompt[i * bs : (i + 1) * bs]
                else:
                    assert b not in held_before
                    self.store[b] = [None] * bs

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), count=st.integers(1, 8))
    def compute(self, data, count):
        r = data.draw(st.sampled_from(sorted(self.tokens)))
        old = self.computed[r]
        new = min(old + count, len(self.tokens[r]))
        for g, table in enumerate(self.m.block_ids(r)):  # the engine writes K/V, then marks them computed
            bs = self.bs[g]
            for p in range(old, new):
                assert table[p // bs] >= 0, "a block of an uncomputed token was released"
                self.store[table[p // bs]][p % bs] = self.tokens[r][p]
        self.m.mark_computed(r, new)
        self.computed[r] = new

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), count=st.integers(1, 5))
    def append(self, data, count):
        r = data.draw(st.sampled_from(sorted(self.tokens)))
        for _ in range(count):
            self.drain()
            n = len(self.tokens[r])
            occurrences = self.occurrences()
            tables = self.m.block_ids(r)
            shared = [
                n % bs != 0 and occurrences[t[-1]][1] > 1 for t, bs in zip(tables, self.bs, strict=True)
            ]
            needed = sum(n % bs == 0 or s for bs, s in zip(self.bs, shared, strict=True))
            free_before = self.m.num_free_blocks
            before = self.frozen()
            token = next(self.fresh_tokens)
            try:
                cows = self.m.append_token(r, token)
            except OutOfBlocksError:
                assert needed > free_before
                assert self.frozen() == before and self.m.take_events() == []
                return
            assert needed <= free_before
            self.tokens[r].append(token)
            for g, (table, new_table) in enumerate(zip(tables, self.m.block_ids(r), strict=True)):
                bs = self.bs[g]
                if cows[g] is not None:
                    src, dst = cows[g]
                    assert shared[g] and src == table[-1] and new_table[-1] == dst and dst not in occurrences
                    self.store[dst] = list(self.store[src])
                else:
                    assert not shared[g]
                if n % bs == 0:
                    assert len(new_table) == len(table) + 1 and new_table[-1] not in occurrences
                    self.store[new_table[-1]] = [None] * bs

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = next(self.ids)
        free_before = self.m.num_free_blocks
        self.m.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.computed[child] = self.computed[parent]
        assert self.m.block_ids(child) == self.m.block_ids(parent)
        assert self.m.num_free_blocks == free_before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        r = data.draw(st.sampled_from(sorted(self.tokens)))
        self.drain()
        mine = Counter(b for table in self.m.block_ids(r) for b in table if b >= 0)
        occurrences = self.occurrences()
        only_mine = [b for b, count in mine.items() if occurrences[b][1] == count]
        free_before = self.m.num_free_blocks
        self.m.free(r)
        del self.tokens[r], self.computed[r]
        assert self.m.num_free_blocks == free_before + len(only_mine)
        assert self.m.take_events() == []  # freeing removes nothing from the cache

    @rule()
    def reset_prefix_cache(self):
        self.drain()
        dropped = self.m.reset_prefix_cache()
        assert dropped == len(self.cached)
        assert self.m.cached_block_hashes() == set()

    @rule(data=st.data())
    def misuse(self, data):
        m = self.m
        self.refused(lambda: m.append_token(-1, 0), UnknownSequenceError)
        self.refused(lambda: m.free(-1), UnknownSequenceError)
        self.refused(lambda: m.fork(-1, -2), UnknownSequenceError)
        self.refused(lambda: m.mark_computed(-1, 0), UnknownSequenceError)
        self.refused(lambda: m.allocate(-3, []), InvalidArgumentError)
        if self.tokens:
            r = data.draw(st.sampled_from(sorted(self.tokens)))
            other = data.draw(st.sampled_from(sorted(self.tokens)))
            self.refused(lambda: m.allocate(r, [0]), DuplicateSequenceError)
            self.refused(lambda: m.fork(r, other), DuplicateSequenceError)
            self.refused(lambda: m.mark_computed(r, len(self.tokens[r]) + 1), InvalidArgumentError)
            if self.computed[r]:
                self.refused(lambda: m.mark_computed(r, self.computed[r] - 1), InvalidArgumentError)
            self.refused(lambda: m.append_token(r, 1.5), InvalidArgumentError)

    # ---- invariants -------------------------------------------------------------------------------------

    @invariant()
    def pool_accounting(self):
        if not hasattr(self, "m"):
            return
        occurrences = self.occurrences()
        snap = self.m.snapshot()
        assert self.m.num_free_blocks + len(occurrences) == self.m.num_blocks
        assert set(snap.free_order.tolist()).isdisjoint(occurrences)
        assert len(set(snap.free_order.tolist())) == snap.free_order.size
        for b in range(self.m.num_blocks):
            count = occurrences.get(b, (-1, 0))[1]
            assert snap.ref_count[b] == count
            assert bool(snap.is_free[b]) == (count == 0)
        assert self.m.usage == 1 - self.m.num_free_blocks / self.m.num_blocks
        assert (self.m.prefix_cache_queries, self.m.prefix_cache_hits) == (self.queries, self.hits)

    @invariant()
    def tables_read_back_their_tokens(self):
        if not hasattr(self, "m"):
            return
        for r, tokens in self.tokens.items():
            c = self.computed[r]
            assert self.m.num_tokens(r) == len(tokens) and self.m.num_computed_tokens(r) == c
            for g, table in enumerate(self.m.block_ids(r)):
                bs = self.bs[g]
                skipped = self.skipped(g, c)
                assert len(table) == cdiv(len(tokens), bs)
                assert table[:skipped] == [-1] * skipped and -1 not in table[skipped:]
                assert len(set(table[skipped:])) == len(table) - skipped
                read = [self.store[table[p // bs]][p % bs] for p in range(skipped * bs, c)]
                assert read == tokens[skipped * bs : c], f"request {r} group {g} reads {read}"
            assert self.m.num_held_blocks(r) == tuple(
                len(t) - self.skipped(g, c) for g, t in enumerate(self.m.block_ids(r))
            )

    @invariant()
    def events_rebuild_the_cache(self):
        if not hasattr(self, "m"):
            return
        self.drain()
        assert set(self.cached) == self.m.cached_block_hashes()
        snap = self.m.snapshot()
        for b in range(self.m.num_blocks):
            h = self.m.pool.block_hash(b)
            assert bool(snap.is_cached[b]) == (h is not None)
            if h is not None:  # a cached block holds exactly the tokens its BlockStored announced
                group = int(snap.group[b])
                assert list(self.cached[(group, h)]) == self.store[b]


KVCacheManagerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKVCacheManagerStateful = KVCacheManagerMachine.TestCase
