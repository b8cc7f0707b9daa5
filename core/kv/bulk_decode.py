"""The bulk decode path of `KVCacheManager` (`decode_steps`: many decode steps of many requests in O(blocks)),
kept apart from the per-token path: `BulkDecode` is composed into the manager (`KVCacheManager.decode_steps`
calls it) and uses the manager's public members only: `records` (requests' `KVRequest`s), `managers`, `pool`,
`enable_prefix_caching`, `all_full_attention`, `block_hasher`, `check_room` and the one blocks-per-step question
`num_blocks_to_append_records`. It changes block tables only through the same pool and single-type managers.
"""

from bisect import bisect_right
from collections.abc import Hashable, Mapping, Sequence
from operator import attrgetter, itemgetter

import numpy as np

from core.kv.block_hash import extend_block_hashes
from core.kv.request import KVRequest, check_kv_token_ids
from core.kv.single_type_manager import BlockCopy, SingleTypeKVCacheManager


class BulkDecode:
    """`decode_steps` and its helpers over one `KVCacheManager` (`kv`)."""

    __slots__ = ("kv",)

    def __init__(self, kv):
        self.kv = kv

    def decode_steps(
        self,
        token_ids: Mapping[Hashable, Sequence[int]],
        *,
        trusted: bool = False,
        copies: list | None = None,
    ) -> None:
        """Several decode steps of several requests at once: for each request r and each of its new tokens t,
        in order, as `mark_computed(r, n); append_token(r, t)` with n the tokens before t (so afterwards all
        but each request's newest token are computed). O(blocks), not O(tokens).

        The end state has the same tables (lengths, -1 entries), ref counts, free count, computed counts and
        prefix cache as those calls one by one; only which free ids are taken may differ (and so, when cached
        free blocks must be evicted, which of them are). Order: first every
        request's computed full blocks enter the cache and every group releases what its newest token no longer
        reads, then room is made (copy-on-write of a shared last block, new blocks). A block that lies behind
        the window by the end is taken only to be cached (with prefix caching, while a block is free) and
        released at once. So the call needs no more free blocks than the end state holds: it raises
        OutOfBlocksError (or UnknownSequenceError, InvalidArgumentError) with nothing changed otherwise.

        trusted: every value of `token_ids` is a non-empty list or tuple of ints made or checked where the
        request was made (the serving simulator's groups make them): not checked again. copies: a list that gets
        (request id, `BlockCopy(src, dst)`) for each copy-on-write, whose K/V the caller copies before the step
        writes (None: not listed).
        """
        kv = self.kv
        plan = self._decode_plan(token_ids, trusted)
        kv.check_room(
            kv.num_blocks_to_append_records(
                [req for req, *_ in plan], [new - old for _, _, old, new, _ in plan]
            ),
            f"{len(plan):,} requests' decode steps",
        )
        if kv.all_full_attention:
            return self._decode_steps_full(plan, copies)
        managers, caching = kv.managers, kv.enable_prefix_caching
        no_copies = (-1,) * len(managers)
        # per request: per group, (blocks skipped once all but the newest token are computed (the window rule,
        # asked once for both phases), the index of a shared written last block or -1)
        marks = []
        for req, tokens, old, new, _ in plan:
            req.token_ids.extend(tokens)
            req.num_tokens = new
            copied = no_copies
            if caching:
                copied = [
                    self._cache_computed(req, m, rec, old, new - 1)
                    for m, rec in zip(managers, req.blocks, strict=True)
                ]
            skips = []
            for manager, rec in zip(managers, req.blocks, strict=True):
                skip = manager.num_skipped_blocks(new - 1) if manager.skips_tokens else 0
                if skip > rec.first_held:  # what `remove_skipped_blocks(rec, new - 1)` releases
                    manager.release_leading(rec, skip)
                skips.append(skip)
            marks.append((skips, copied))
        for (req, _, old, new, rid), (skips, copied) in zip(plan, marks, strict=True):
            for manager, rec, skip, index in zip(managers, req.blocks, skips, copied, strict=True):
                if (
                    0 <= index < rec.first_held
                ):  # the shared last block fell behind the window: cache its copy
                    self._cache_in_passing(req, manager, index)
                copy = self._grow_table(req, manager, rec, old, new, skip)
                if copy is not None and copies is not None:
                    copies.append((rid, copy))
            req.num_computed = new - 1

    def _decode_plan(self, token_ids: Mapping[Hashable, Sequence[int]], trusted: bool) -> list:
        """(request, checked new tokens, tokens before, tokens after, request id) per request; raises UnknownSequenceError
        or InvalidArgumentError."""
        plan = []
        reqs = self.kv.records(token_ids)
        for (request_id, new_tokens), req in zip(token_ids.items(), reqs, strict=True):
            tokens = new_tokens if trusted else check_kv_token_ids(request_id, new_tokens)
            old = req.num_tokens
            plan.append((req, tokens, old, old + len(tokens), request_id))
        return plan

    def _decode_steps_full(self, plan, copies: list | None) -> None:
        """`decode_steps` when every group is full attention (nothing is ever released), room checked."""
        kv = self.kv
        pool, caching = kv.pool, kv.enable_prefix_caching
        ref_counts = pool.ref_counts
        for req, tokens, old, new, rid in plan:
            req.token_ids.extend(tokens)
            req.num_tokens = new
            for manager, rec in zip(kv.managers, req.blocks, strict=True):
                if caching:
                    self._cache_computed(req, manager, rec, old, new - 1)
                table, bs = rec.table, manager.block_size
                if ref_counts[table[-1]] > 1:  # a shared last block: copied if this step writes it
                    copy = manager.copy_on_write(rec, old)
                    if copy is not None and copies is not None:
                        copies.append((rid, copy))
                for _ in range(-(-new // bs) - len(table)):
                    table.append(pool.take_one())
                if caching and len(req.block_hashes.get(bs, ())) > rec.num_cached:  # else nothing to offer
                    self._cache_held(req, manager, rec)
            req.num_computed = new - 1

    def _cache_computed(
        self, req: KVRequest, manager: SingleTypeKVCacheManager, rec, old: int, computed: int
    ) -> int:
        """`decode_steps`' first phase for one group (caching on): hash the request's full blocks up to
        `computed` tokens and offer the held ones to the prefix cache, except a shared last block that is
        written (copy-on-write gives this request its own copy, cached later). Returns that block's index, or
        -1."""
        kv = self.kv
        if not (kv.enable_prefix_caching and manager.caches_blocks):
            return -1
        bs, table = manager.block_size, rec.table
        keys = req.block_hashes.setdefault(bs, [])
        extend_block_hashes(keys, req.token_ids, bs, computed // bs, kv.block_hasher)
        shared = -1
        if len(table) > rec.first_held and kv.pool.ref_counts[table[-1]] > 1 and manager.tail_is_written(old):
            shared = len(table) - 1
            computed = min(computed, old - old % bs)
        manager.cache_blocks(rec, keys, req.token_ids, min(computed, len(table) * bs))
        return shared

    def _cache_in_passing(self, req: KVRequest, manager: SingleTypeKVCacheManager, index: int) -> None:
        """A computed full block that a window released within `decode_steps`: take a free block, cache it as
        logical block `index` of the request, release it (nothing when it is not full and computed, or no block
        is free)."""
        bs, pool = manager.block_size, self.kv.pool
        keys = req.block_hashes.get(bs, [])
        if index >= len(keys) or not pool.num_free_blocks:
            return
        block = pool.take_one()
        parent = keys[index - 1] if index else None
        tokens = tuple(req.token_ids[index * bs : (index + 1) * bs])
        pool.cache_block(manager.group_idx, block, keys[index], parent, tokens)
        pool.release(block)

    def _grow_table(
        self, req: KVRequest, manager: SingleTypeKVCacheManager, rec, old: int, new: int, skip: int
    ) -> BlockCopy | None:
        """`decode_steps`' second phase for one group, `skip` = `num_skipped_blocks(new - 1)`: copy a shared
        written last block, then append entries up to `num_required_blocks(new)`, -1 for those already behind
        the window (cached on the way). Returns the copy-on-write made, or None."""
        pool, table = self.kv.pool, rec.table
        if table and table[-1] >= 0 and pool.ref_counts[table[-1]] > 1:  # else nothing to copy
            copy = manager.copy_on_write(rec, old, skip)
        else:
            copy = None
        caching = self.kv.enable_prefix_caching and manager.caches_blocks
        for index in range(len(table), manager.num_required_blocks(new)):
            if index >= skip:
                table.append(pool.take_one())
                continue
            table.append(-1)
            if caching:  # computed and full: cached on the way
                self._cache_in_passing(req, manager, index)
        if skip > rec.first_held:
            rec.first_held = skip if skip < len(table) else len(table)
        if caching:
            self._cache_held(req, manager, rec)
        return copy

    def _cache_held(self, req: KVRequest, manager: SingleTypeKVCacheManager, rec) -> None:
        """Offer the held blocks whose chained keys are known (full and computed) and not yet offered to the
        prefix cache: after `decode_steps` copied a shared last block, its copy is cached here."""
        pool, table, bs = self.kv.pool, rec.table, manager.block_size
        keys = req.block_hashes.get(bs, [])
        full = min(len(keys), len(table))
        for index in range(rec.num_cached, full):
            if table[index] >= 0:
                parent = keys[index - 1] if index else None
                pool.cache_block(
                    manager.group_idx,
                    table[index],
                    keys[index],
                    parent,
                    tuple(req.token_ids[index * bs : (index + 1) * bs]),
                )
        rec.num_cached = max(rec.num_cached, full)

    # ---- the k-step decode prediction ------------------------------------------------------------------------

    def num_free_blocks_after(
        self, request_groups: Sequence[Sequence[Hashable]], steps: int, lengths: np.ndarray | None = None
    ) -> np.ndarray:
        """`KVCacheManager.num_free_blocks_after_decode`: int64 [steps], free blocks after steps 1..t. Step t
        computes the token at position L - 1 + t of a request of L tokens (its group's length). Per group of the
        pool: every table grows to `num_required_blocks(L + t)` entries (elementwise over requests and steps);
        forks sharing a written last block copy it at the first step (all but the last holder); window groups
        give blocks back as `_releases` says."""
        kv = self.kv
        records = kv.records
        sizes = list(map(len, request_groups))
        n = len(sizes)
        firsts = None
        if lengths is None:
            firsts = records(list(map(itemgetter(0), request_groups)))  # one per group: its lengths are equal
            lengths = np.fromiter(map(attrgetter("num_tokens"), firsts), np.int64, n)
        forked = []
        if n and max(sizes) > 1:
            forked = [(row, records(ids)) for row, ids in enumerate(request_groups) if sizes[row] > 1]
        ns = np.fromiter(sizes, np.int64, n)
        after = lengths[:, None] + np.arange(steps + 1)  # [groups, steps + 1]: lengths after 0..steps steps
        ref_counts = kv.pool.ref_counts
        taken = np.zeros(steps, dtype=np.int64)
        shared = []  # per pool group: the rows whose forks share a written last block
        for g, manager in enumerate(kv.managers):
            entries = ns @ manager.num_required_blocks(after)  # [steps + 1]: table entries over all requests
            taken += entries[1:] - entries[0]
            rows = set()
            for row, recs in forked:
                tail = manager.written_tail(recs[0].blocks[g], recs[0].num_tokens, 0)
                if tail >= 0 and ref_counts[tail] > 1:
                    holders = sum(1 for rec in recs if rec.blocks[g].table[-1] == tail)
                    taken += min(holders, ref_counts[tail] - 1)
                    rows.add(row)
            shared.append(rows)
        free = kv.num_free_blocks - taken
        if not any(manager.skips_tokens for manager in kv.managers):
            return free  # full attention releases nothing before a request ends
        groups = list(map(records, request_groups))
        return free + self._releases(groups, steps, lengths, shared)

    def _releases(self, groups: list, steps: int, lengths: np.ndarray, shared: list[set]) -> np.ndarray:
        """int64 [steps]: the blocks decode steps 1..t give back to the pool (cumulative). After step t a
        request of length L (`lengths`, per group) has computed L - 1 + t tokens and its group's manager skips
        `num_skipped_blocks(L - 1 + t)` leading blocks (the window rule): logical block i goes at the first step
        that skips more than i blocks, found by bisection over the run's positions (the rule never decreases).
        A block shared by several requests is freed when the last of them releases it; a shared written tail's
        copy and blocks taken within the run count too."""
        ref_counts = self.kv.pool.ref_counts
        released: dict[int, list[int]] = {}  # existing block -> [releases, last step]
        bumps: dict[int, int] = {}  # step -> blocks it frees (added up once, at the end)
        for g, manager in enumerate(self.kv.managers):
            if not manager.skips_tokens:
                continue  # never skips anything (full attention)
            skipped_blocks = manager.num_skipped_blocks
            # per request group: the last block the run releases (the rule, elementwise, at the last position)
            last_index = (skipped_blocks(lengths + (steps - 1)) - 1).tolist()
            for row, recs in enumerate(groups):
                blocks = [req.blocks[g] for req in recs]
                low = blocks[0].first_held if len(blocks) == 1 else min([rec.first_held for rec in blocks])
                last = last_index[row]
                if last < low:
                    continue  # releases nothing in the run
                length = int(lengths[row])
                positions = range(length, length + steps)  # computed by steps 1..steps
                step_of = [bisect_right(positions, i, key=skipped_blocks) + 1 for i in range(low, last + 1)]
                shared_tail, final = row in shared[g], len(blocks) - 1
                for k, rec in enumerate(blocks):
                    table = rec.table
                    first_new = len(table)
                    for index in range(rec.first_held, min(first_new, last + 1)):
                        entry = released.setdefault(table[index], [0, 0])
                        entry[0] += 1
                        step = step_of[index - low]
                        if step > entry[1]:
                            entry[1] = step
                    if shared_tail and first_new - 1 <= last and k != final:
                        step = step_of[first_new - 1 - low]  # its copy of the shared tail
                        bumps[step] = bumps.get(step, 0) + 1
                    for index in range(first_new, last + 1):  # taken and released within the run
                        step = step_of[index - low]
                        bumps[step] = bumps.get(step, 0) + 1
        for block, (count, step) in released.items():
            if count == ref_counts[block]:
                bumps[step] = bumps.get(step, 0) + 1
        frees = np.zeros(steps + 1, dtype=np.int64)
        for step, count in bumps.items():
            frees[step] += count
        return np.cumsum(frees[1:])
