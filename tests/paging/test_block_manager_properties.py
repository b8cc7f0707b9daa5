"""Stateful property test: random programs against a brute-force model of a paged KV cache.

The model keeps the true tokens of every sequence and a physical store of slots that it writes the way an
engine would (copy on `cow`, then write the slot). After every step the manager must satisfy the invariants in
core/block_manager.py, and reading each sequence through its block table must give back exactly its tokens:
so forked sequences never see each other's writes, and prefix-cache hits only reuse blocks with the right data.
With a sliding window W the model also knows which blocks must be released: before the token at position n,
every logical block i < (n - W + 1) // block_size; their entries read -1 and only held blocks are read back.
"""

import itertools

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.errors import DuplicateSequenceError, OutOfBlocksError, UnknownSequenceError
from core.paging.block_manager import BlockManager


class PagedCacheMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 12),
        block_size=st.integers(1, 4),
        caching=st.booleans(),
        window=st.none() | st.integers(1, 7),
    )
    def setup(self, num_blocks, block_size, caching, window):
        self.m = BlockManager(num_blocks, block_size, enable_prefix_caching=caching, sliding_window=window)
        self.bs = block_size
        self.window = window
        self.tokens: dict[int, list[int]] = {}  # the truth: every live sequence's tokens
        self.released: dict[int, int] = {}  # the truth: logical blocks [0, released[s]) are released
        self.store: dict[int, int] = {}  # slot -> token, written as an engine would
        self.ids = itertools.count()
        self.unique_tokens = itertools.count(1000)

    # ---- brute-force views ----------------------------------------------------------------------------------

    def tables(self):
        return {s: self.m.block_table(s) for s in self.tokens}

    def owned(self):
        return {b for table in self.tables().values() for b in table if b >= 0}

    def released_before(self, seq, position):
        """Logical blocks released once the token at `position` takes room (the model's rule)."""
        if self.window is None:
            return 0
        return max(self.released[seq], (position - self.window + 1) // self.bs)

    def frozen_state(self):
        snap = self.m.snapshot()
        return (
            snap.ref_count.tolist(),
            snap.free_order.tolist(),
            snap.is_cached.tolist(),
            self.tables(),
            {s: self.m.num_tokens(s) for s in self.tokens},
            self.m.prefix_cache_stats,
        )

    def write_sequence(self, seq, first_position):
        table = self.m.block_table(seq)
        for position in range(first_position, len(self.tokens[seq])):
            slot = table[position // self.bs] * self.bs + position % self.bs
            self.store[slot] = self.tokens[seq][position]

    # ---- rules ------------------------------------------------------------------------------------------------

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=14))
    def allocate(self, prompt):
        seq = next(self.ids)
        before = self.frozen_state()
        free_before = self.m.num_blocks - len(self.owned())
        needed = -(-len(prompt) // self.bs)
        try:
            hits = self.m.allocate(seq, prompt)
        except OutOfBlocksError:
            # hits only lower the need, and a revived block counts as free: so it fits whenever needed <= free
            assert needed > free_before
            assert self.frozen_state() == before
            return
        assert needed <= free_before or hits > 0
        if not self.m.enable_prefix_caching:
            assert hits == 0
        assert hits <= (len(prompt) - 1) // self.bs
        self.tokens[seq] = list(prompt)
        self.released[seq] = 0  # a prompt is allocated whole
        assert self.m.block_table(seq) and -1 not in self.m.block_table(seq)
        # the engine prefills only what the cache did not hold; hit blocks must already hold the right tokens
        self.write_sequence(seq, hits * self.bs)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), count=st.integers(1, 6))
    def append(self, data, count):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        for _ in range(count):
            table = self.m.block_table(seq)
            n = len(self.tokens[seq])
            last_shared = n % self.bs != 0 and sum(table[-1] in t for t in self.tables().values()) > 1
            needs_block = n % self.bs == 0 or last_shared
            released = self.released_before(seq, n)
            expected = [-1] * released + table[released:]  # the window's releases come first
            others = {b for s, t in self.tables().items() if s != seq for b in t}
            freed = {b for b in table[:released] if b >= 0} - others
            free_before = self.m.num_blocks - len(self.owned())
            before = self.frozen_state()
            token = next(self.unique_tokens)
            try:
                result = self.m.append_token(seq, token)
            except OutOfBlocksError:
                assert needs_block and free_before + len(freed) == 0
                assert self.frozen_state() == before
                return
            self.released[seq] = released
            owned_before = {b for t in before[3].values() for b in t if b >= 0} - freed
            table = expected
            if result.cow is not None:
                src, dst = result.cow
                assert last_shared and src == table[-1] and dst not in owned_before
                for offset in range(self.bs):
                    if src * self.bs + offset in self.store:
                        self.store[dst * self.bs + offset] = self.store[src * self.bs + offset]
            else:
                assert not last_shared
            new_table = self.m.block_table(seq)
            if needs_block:
                assert new_table[-1] not in owned_before
            else:
                assert new_table == table
            assert result.slot == new_table[n // self.bs] * self.bs + n % self.bs
            self.store[result.slot] = token
            self.tokens[seq].append(token)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        child = next(self.ids)
        free_before = self.m.num_free_blocks
        self.m.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.released[child] = self.released[parent]
        assert self.m.block_table(child) == self.m.block_table(parent)
        assert self.m.num_free_blocks == free_before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        others = {b for s, t in self.tables().items() if s != seq for b in t}
        released = {b for b in self.m.block_table(seq) if b >= 0} - others
        free_before = self.m.num_free_blocks
        self.m.free(seq)
        del self.tokens[seq], self.released[seq]
        assert self.m.num_free_blocks == free_before + len(released)

    @rule()
    def misuse(self):
        before = self.frozen_state()
        for call, error in (
            (lambda: self.m.append_token(-1, 0), UnknownSequenceError),
            (lambda: self.m.free(-1), UnknownSequenceError),
            (lambda: self.m.fork(-1, -2), UnknownSequenceError),
        ):
            try:
                call()
            except error:
                pass
            else:
                raise AssertionError("expected an error")
        if self.tokens:
            live = min(self.tokens)
            try:
                self.m.allocate(live, [0])
            except DuplicateSequenceError:
                pass
            else:
                raise AssertionError("duplicate id accepted")
        assert self.frozen_state() == before

    # ---- invariants -------------------------------------------------------------------------------------------

    @invariant()
    def pool_accounting(self):
        if not hasattr(self, "m"):
            return
        snap = self.m.snapshot()
        tables = self.tables()
        owned = self.owned()
        assert set(snap.free_order.tolist()).isdisjoint(owned)
        assert self.m.num_free_blocks + len(owned) == self.m.num_blocks
        assert len(set(snap.free_order.tolist())) == snap.free_order.size
        for block in range(self.m.num_blocks):
            holders = sum(table.count(block) for table in tables.values())
            assert self.m.ref_count(block) == holders
            assert bool(snap.is_free[block]) == (holders == 0)
        if not self.m.enable_prefix_caching:
            assert not snap.is_cached.any()

    @invariant()
    def tables_hold_the_true_tokens(self):
        if not hasattr(self, "m"):
            return
        for seq, tokens in self.tokens.items():
            table = self.m.block_table(seq)
            assert self.m.num_tokens(seq) == len(tokens)
            assert len(table) == -(-len(tokens) // self.bs)
            released = self.released[seq]
            assert table[:released] == [-1] * released and -1 not in table[released:]
            held = table[released:]
            assert len(set(held)) == len(held)
            first = released * self.bs  # positions before it are no longer readable
            read = [
                self.store.get(table[p // self.bs] * self.bs + p % self.bs) for p in range(first, len(tokens))
            ]
            assert read == tokens[first:], f"sequence {seq} reads {read}, wrote {tokens[first:]}"
            assert self.m.num_held_blocks(seq) == len(held)


PagedCacheMachine.TestCase.settings = settings(
    max_examples=500,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPagedCache = PagedCacheMachine.TestCase
