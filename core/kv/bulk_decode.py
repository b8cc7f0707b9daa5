"""The serving simulator's bulk decode path of `KVCacheManager` (`decode_steps`: many decode steps of many
requests in O(blocks)), kept apart from the per-token path the engine uses. A mixin: it reads the manager's
`_requests`, `managers`, `pool`, `enable_prefix_caching`, `_all_full`, `_request`, `_check_room` and the one
blocks-per-step question `_blocks_to_append`, and changes block tables only through the same pool and managers.
"""

from collections.abc import Hashable, Mapping, Sequence

from core.kv.block_hash import extend_block_hashes
from core.kv.request import KVRequest, check_kv_token_ids
from core.kv.single_type_manager import SingleTypeKVCacheManager


class BulkDecode:
    """`decode_steps` and its helpers, mixed into `KVCacheManager`."""

    def decode_steps(self, token_ids: Mapping[Hashable, Sequence[int]], *, trusted: bool = False) -> None:
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
        request was made (the serving simulator's groups make them): not checked again.
        """
        plan = self._decode_plan(token_ids, trusted)
        self._check_room(
            self._blocks_to_append([req for req, *_ in plan], [new - old for _, _, old, new in plan]),
            f"{len(plan):,} requests' decode steps",
        )
        if self._all_full:
            return self._decode_steps_full(plan)
        managers, caching = self.managers, self.enable_prefix_caching
        no_copies = (-1,) * len(managers)
        # per request: per group, (blocks skipped once all but the newest token are computed (the window rule,
        # asked once for both phases), the index of a shared written last block or -1)
        marks = []
        for req, tokens, old, new in plan:
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
        for (req, _, old, new), (skips, copied) in zip(plan, marks, strict=True):
            for manager, rec, skip, index in zip(managers, req.blocks, skips, copied, strict=True):
                if (
                    0 <= index < rec.first_held
                ):  # the shared last block fell behind the window: cache its copy
                    self._cache_in_passing(req, manager, index)
                self._grow_table(req, manager, rec, old, new, skip)
            req.num_computed = new - 1

    def _decode_plan(self, token_ids: Mapping[Hashable, Sequence[int]], trusted: bool) -> list:
        """(request, checked new tokens, tokens before, tokens after) per request; raises UnknownSequenceError
        or InvalidArgumentError."""
        plan = []
        requests = self._requests
        for request_id, new_tokens in token_ids.items():
            req = requests.get(request_id) or self._request(request_id)
            tokens = new_tokens if trusted else check_kv_token_ids(request_id, new_tokens)
            old = req.num_tokens
            plan.append((req, tokens, old, old + len(tokens)))
        return plan

    def _decode_steps_full(self, plan) -> None:
        """`decode_steps` when every group is full attention (nothing is ever released), room checked."""
        ref_counts = self.pool.ref_counts
        pool, caching = self.pool, self.enable_prefix_caching
        for req, tokens, old, new in plan:
            req.token_ids.extend(tokens)
            req.num_tokens = new
            for manager, rec in zip(self.managers, req.blocks, strict=True):
                if caching:
                    self._cache_computed(req, manager, rec, old, new - 1)
                table, bs = rec.table, manager.block_size
                if ref_counts[table[-1]] > 1:  # a shared last block: copied if this step writes it
                    manager.copy_on_write(rec, old)
                for _ in range(-(-new // bs) - len(table)):
                    table.append(pool.take_one())
                if caching:
                    self._cache_held(req, manager, rec)
            req.num_computed = new - 1

    def _cache_computed(
        self, req: KVRequest, manager: SingleTypeKVCacheManager, rec, old: int, computed: int
    ) -> int:
        """`decode_steps`' first phase for one group (caching on): hash the request's full blocks up to
        `computed` tokens and offer the held ones to the prefix cache, except a shared last block that is
        written (copy-on-write gives this request its own copy, cached later). Returns that block's index, or
        -1."""
        if not (self.enable_prefix_caching and manager.caches_blocks):
            return -1
        bs, table = manager.block_size, rec.table
        keys = req.block_hashes.setdefault(bs, [])
        extend_block_hashes(keys, req.token_ids, bs, computed // bs, self.block_hasher)
        shared = -1
        if (
            len(table) > rec.first_held
            and self.pool.ref_counts[table[-1]] > 1
            and manager._tail_is_written(old)
        ):
            shared = len(table) - 1
            computed = min(computed, old - old % bs)
        manager.cache_blocks(rec, keys, req.token_ids, min(computed, len(table) * bs))
        return shared

    def _cache_in_passing(self, req: KVRequest, manager: SingleTypeKVCacheManager, index: int) -> None:
        """A computed full block that a window released within `decode_steps`: take a free block, cache it as
        logical block `index` of the request, release it (nothing when it is not full and computed, or no block
        is free)."""
        bs, pool = manager.block_size, self.pool
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
    ) -> None:
        """`decode_steps`' second phase for one group, `skip` = `num_skipped_blocks(new - 1)`: copy a shared
        written last block, then append entries up to `num_required_blocks(new)`, -1 for those already behind
        the window (cached on the way)."""
        pool, table = self.pool, rec.table
        if table and table[-1] >= 0 and pool.ref_counts[table[-1]] > 1:  # else nothing to copy
            manager.copy_on_write(rec, old, skip)
        caching = self.enable_prefix_caching and manager.caches_blocks
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

    def _cache_held(self, req: KVRequest, manager: SingleTypeKVCacheManager, rec) -> None:
        """Offer the held blocks whose chained keys are known (full and computed) and not yet offered to the
        prefix cache: after `decode_steps` copied a shared last block, its copy is cached here."""
        pool, table, bs = self.pool, rec.table, manager.block_size
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
