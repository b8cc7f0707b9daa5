"""A block-manager playground: a `BlockManager` and a real `KVCache` driven one action at a time, with history.

Every action runs core for real: blocks come from `BlockManager`, K/V tensors are written into `KVCache` slots,
copy-on-write copies real blocks. `verify()` reads each sequence back through its block table and compares it
with the K/V that were written for it, so the page can show that paging and forking lose nothing.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from core.common import check_int
from core.errors import InvalidArgumentError, LabError
from core.kv import KVCacheSnapshot
from core.kv.block_hash import extend_block_hashes, hash_block_tokens
from core.kv.host_tier import OFFLOAD_POLICIES, HostTier, host_block_size
from core.paging.block_manager import BlockManager
from core.paging.kv_cache import KVCache, PagedKVCache, kv_cache_bytes


@dataclass(frozen=True)
class PlaygroundConfig:
    """num_blocks, block_size (tokens), head_dim and num_kv_heads of one layer of K/V.

    contiguous_max_len: tokens a contiguous cache reserves per sequence (the comparison for waste).
    system_prompt_len: tokens of a system prompt shared by every prompt's start (prefix caching hits it).
    sliding_window: None (full attention) or W tokens: each token attends to the last W positions, and the
        block manager releases blocks wholly behind every future token's window (a sliding-window layer's pool).
    host_blocks: host blocks of a host-memory KV tier behind the pool (vLLM's native CPU offloading), 0: none.
        It needs prefix caching on and full attention (as `KVCacheManager`'s host tier does).
    host_block_tokens: tokens per host block, a multiple of `block_size` (None: one GPU block).
    offload_policy: the host tier's eviction, "lru" or "arc".
    """

    num_blocks: int = 48
    block_size: int = 16
    head_dim: int = 64
    num_kv_heads: int = 2
    enable_prefix_caching: bool = False
    contiguous_max_len: int = 256
    system_prompt_len: int = 32
    sliding_window: int | None = None
    host_blocks: int = 0
    host_block_tokens: int | None = None
    offload_policy: str = "lru"

    def validate(self) -> None:
        limits = {
            "num_blocks": (1, 4096),
            "block_size": (1, 256),
            "head_dim": (1, 512),
            "num_kv_heads": (1, 64),
            "contiguous_max_len": (1, 1_048_576),
            "system_prompt_len": (0, 1_048_576),
        }
        for name, (low, high) in limits.items():
            check_int(getattr(self, name), name, minimum=low, maximum=high)
        if self.sliding_window is not None:
            check_int(self.sliding_window, "sliding_window (tokens)", minimum=1, maximum=1_048_576)
        check_int(self.host_blocks, "host tier size (host blocks)", minimum=0, maximum=4096)
        if self.offload_policy not in OFFLOAD_POLICIES:
            raise InvalidArgumentError(
                f"offload policy must be one of {', '.join(OFFLOAD_POLICIES)}, got {self.offload_policy!r}"
            )
        self.blocks_per_host_block  # noqa: B018 (raises for a host block that is not a multiple of the GPU block)
        if self.host_blocks and (not self.enable_prefix_caching or self.sliding_window is not None):
            raise InvalidArgumentError(
                "a host tier needs prefix caching on and full attention (no sliding window), as vLLM's "
                "offloading does; turn prefix caching on or set the host tier to 0 blocks"
            )

    @property
    def blocks_per_host_block(self) -> int:
        """GPU blocks per host block (1 when `host_block_tokens` is None). Raises InvalidArgumentError."""
        if self.host_block_tokens is None:
            return 1
        return host_block_size(self.block_size, self.host_block_tokens)

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token in this one-layer float32 cache."""
        return kv_cache_bytes(1, 1, 1, self.num_kv_heads, self.head_dim, torch.float32)


@dataclass(frozen=True)
class HistoryEntry:
    """The pool after one action. Slots are token positions; waste counts reserved slots holding no token."""

    step: int
    action: str
    ok: bool
    message: str
    free_blocks: int
    used_blocks: int
    stored_tokens: int
    paged_waste_slots: int
    contiguous_waste_slots: int
    host_used_blocks: int = 0  # host tier blocks holding KV after the action
    host_stored_blocks: int = 0  # host blocks stored (gone down) by the action
    host_loaded_blocks: int = 0  # GPU blocks loaded from the host tier (come up) by the action


@dataclass(frozen=True)
class HostMoves:
    """What the last action moved between the tiers.

    stored: host block ids stored by it (KV gone down: copied from HBM as its blocks were completed).
    stored_from: the GPU blocks those copies came from.
    loaded: (host block, GPU block) pairs loaded by it (KV come up on a host hit).
    evicted: host blocks the tier evicted to make room (their ids may be stored again at once).
    """

    stored: tuple[int, ...] = ()
    stored_from: tuple[int, ...] = ()
    loaded: tuple[tuple[int, int], ...] = ()
    evicted: int = 0


@dataclass(frozen=True)
class Waste:
    """Reserved-but-empty slots now.

    paged: empty slots in the blocks that sequences own (each physical block counted once, shared or not).
    contiguous: for a cache reserving `contiguous_max_len` per sequence, the reserved slots holding no token
        (forks share nothing there: each holds its own copy of the prompt).
    stored_tokens: distinct token slots holding data in the paged cache.
    logical_tokens: the sum of every sequence's length (what a contiguous cache stores, duplicates included).
    """

    paged: int
    contiguous: int
    stored_tokens: int
    logical_tokens: int
    contiguous_overflow: int


@dataclass
class Playground:
    config: PlaygroundConfig = field(default_factory=PlaygroundConfig)
    seed: int = 0

    def __post_init__(self):
        self.config.validate()
        c = self.config
        self.manager = BlockManager(c.num_blocks, c.block_size, c.enable_prefix_caching, c.sliding_window)
        cache = KVCache(
            1, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim, torch.float32, device="cpu"
        )
        self.paged = PagedKVCache(self.manager, cache)
        self.host_tier: HostTier | None = None  # the host-memory tier behind the pool (config.host_blocks)
        self.host_kv: torch.Tensor | None = None  # its K/V: [host block, tokens, K/V, heads, dim]
        if c.host_blocks:
            per = c.blocks_per_host_block
            self.host_tier = HostTier(
                c.host_blocks, c.block_size, blocks_per_host_block=per, policy=c.offload_policy
            )
            self.manager.pool.offload = self.host_tier  # the pool offers every computed chain to it
            self.host_kv = torch.zeros(c.host_blocks, per * c.block_size, 2, c.num_kv_heads, c.head_dim)
        self.host_moves = HostMoves()  # what the last action moved between the tiers
        self.host_hit_tokens = 0  # prompt tokens loaded from the host tier, over all actions
        self._host_reused: dict[str, set[int]] = {}  # per sequence, the host keys it loaded (ARC's reuse)
        self.history: list[HistoryEntry] = []
        self.color_index: dict[str, int] = {}  # stable per sequence, in creation order
        self._truth: dict[str, list[torch.Tensor]] = {}  # per sequence, [tokens, 2 (K/V), heads, dim]
        self._next_id = 0  # automatic ids are s0, s1, ...: the next one tried; a refused action takes none
        self._generator = torch.Generator().manual_seed(self.seed)
        self._rng = np.random.default_rng(self.seed)
        self._system_prompt = self._rng.integers(0, 32_000, c.system_prompt_len).tolist()
        self._record("start", True, "empty pool")

    # ---- actions ------------------------------------------------------------------------------------------------

    def add_sequence(self, prompt_len: int, seq_id: str | None = None, shared_prefix: bool = True) -> str:
        """A new sequence of `prompt_len` tokens: the shared system prompt first (unless `shared_prefix` is
        False), then random tokens. `seq_id` names it (default: the next unused "s<n>")."""
        check_int(prompt_len, "prompt length (tokens)", minimum=1)
        seq = self._new_id(seq_id)
        prefix = self._system_prompt[: min(prompt_len, len(self._system_prompt))] if shared_prefix else []
        tokens = prefix + self._rng.integers(0, 32_000, prompt_len - len(prefix)).tolist()
        return self._run(f"add {seq} ({prompt_len} tokens)", lambda: self._add(seq, tokens))

    def append(self, seq: str, count: int = 1) -> str:
        """Decode `count` random tokens into `seq` (copy-on-write first when its last block is shared).
        An unknown `seq` is refused with the live sequences named."""
        check_int(count, "tokens to append", minimum=1)
        return self._run(f"append {count} to {seq}", lambda: self._append(seq, count))

    def fork(self, seq: str, child_id: str | None = None) -> str:
        """A child sharing every block of `seq` (default id: the next unused "s<n>")."""
        child = self._new_id(child_id)
        return self._run(f"fork {seq} → {child}", lambda: self._fork(seq, child))

    def free(self, seq: str) -> str:
        return self._run(f"free {seq}", lambda: self._free(seq))

    def _new_id(self, seq_id: str | None) -> str:
        if seq_id is not None:
            if not isinstance(seq_id, str) or not 1 <= len(seq_id) <= 40:
                raise InvalidArgumentError(
                    f"a sequence id must be a string of 1 to 40 characters, got {seq_id!r}"
                )
            return seq_id
        n = self._next_id
        while f"s{n}" in self.color_index:  # skip ids a scenario gave explicitly
            n += 1
        return f"s{n}"

    def _run(self, action: str, operation) -> str:
        self.host_moves = HostMoves()
        try:
            result = operation()
        except LabError as error:
            self._record(action, False, str(error))
            raise
        self._record(action, True, result)
        return result

    def _add(self, seq: str, tokens: list[int]) -> str:
        before = self._host_before()
        hits = self.manager.allocate(seq, tokens)
        table = self.manager.block_table(seq)
        bs = self.config.block_size
        kv = self._random_kv(len(tokens))
        if hits:  # the cached blocks already hold this prefix's K/V: reuse the stored values as the truth
            key, value = self.paged.cache.gather(0, table[:hits], hits * bs)
            kv[: hits * bs] = torch.stack([key, value], dim=1)
        loaded = self._load_host_hits(seq, tokens, hits, table, kv, before[0])
        fresh = range(hits * bs, len(tokens))  # host-hit tokens are written too: the load's copy into HBM
        slots = [table[p // bs] * bs + p % bs for p in fresh]
        self.paged.cache.write(0, slots, kv[hits * bs :, 0], kv[hits * bs :, 1])
        self._truth[seq] = list(kv)
        self._created(seq)
        self._store_down(seq, before, loaded)
        parts = [f"{hits} prefix blocks from cache"] if hits else []
        parts += [f"{len(loaded)} blocks loaded from the host tier"] if loaded else []
        return seq + (f" ({', '.join(parts)})" if parts else "")

    # ---- the host tier ------------------------------------------------------------------------------------------

    def _host_before(self) -> tuple[set[int], int]:
        tier = self.host_tier
        return (set(), 0) if tier is None else (tier.stored_keys(), tier.num_evicted_blocks)

    def _hashes(self, tokens: list[int]) -> list[int]:
        """The chain hash of each full block of `tokens` (the keys the pool and the host tier use)."""
        hashes: list[int] = []
        extend_block_hashes(
            hashes, tokens, self.config.block_size, len(tokens) // self.config.block_size, hash_block_tokens
        )
        return hashes

    def _load_host_hits(
        self, seq: str, tokens: list[int], hits: int, table: list[int], kv: torch.Tensor, stored: set[int]
    ) -> list[tuple[int, int]]:
        """A host hit after the `hits` HBM hits: the host tier's consecutive run (never the last prompt token,
        as `KVCacheManager` asks it) among the keys `stored` before the allocation (the allocation itself
        offered this prompt's blocks to the tier: those are stores, not hits); its K/V is copied into `kv` for
        the new GPU blocks. Returns the (host block, GPU block) loads."""
        tier = self.host_tier
        if tier is None:
            return []
        bs, per = self.config.block_size, tier.blocks_per_host_block
        hashes = self._hashes(tokens)
        host_blocks = tier.lookup(hashes, tokens, hits, (len(tokens) - 1) // bs)
        first_chunk = hits // per
        run = 0
        while run < len(host_blocks) and hashes[(first_chunk + run + 1) * per - 1] in stored:
            run += 1
        host_blocks = host_blocks[:run]
        if not host_blocks:
            return []
        loads = []
        for index in range(hits, (first_chunk + len(host_blocks)) * per):
            src, offset = host_blocks[index // per - first_chunk], index % per
            kv[index * bs : (index + 1) * bs] = self.host_kv[src, offset * bs : (offset + 1) * bs]
            loads.append((src, table[index]))
        self._host_reused[seq] = {hashes[(first_chunk + i + 1) * per - 1] for i in range(len(host_blocks))}
        self.host_hit_tokens += len(loads) * bs
        return loads

    def _offer_decoded(self, seq: str, count: int) -> None:
        """Offer the blocks that decoding `count` tokens filled to the host tier (vLLM stores decode blocks
        as they complete; the block manager's one-token append caches a block without the pool's offload
        seam, so the offer is made here, once per filled block: a key already stored is not stored again)."""
        tier = self.host_tier
        if tier is None:
            return
        bs = self.config.block_size
        tokens = self.manager.token_ids(seq)
        old, new = (len(tokens) - count) // bs, len(tokens) // bs
        if new > old:
            hashes = self._hashes(tokens)
            parent = hashes[old - 1] if old else None
            tier.offer(hashes[old:new], parent, tokens[old * bs : new * bs], old)

    def _store_down(self, seq: str, before: tuple[set[int], int], loaded: list[tuple[int, int]]) -> None:
        """Copy the K/V of every host block the action stored (its GPU blocks are written by now) and note the
        moves for the picture."""
        tier = self.host_tier
        if tier is None:
            return
        keys, evicted = before
        hashes = self._hashes(self.manager.token_ids(seq))
        table = self.manager.block_table(seq)
        per, bs = tier.blocks_per_host_block, self.config.block_size
        stored, stored_from = [], []
        for index, key in enumerate(hashes):
            if key in keys or (index + 1) % per:
                continue
            host = tier.host_block(key)
            if host is None:
                continue
            blocks = table[index - per + 1 : index + 1]
            k, v = self.paged.cache.gather(0, blocks, per * bs)
            self.host_kv[host] = torch.stack([k, v], dim=1)
            stored.append(host)
            stored_from.extend(blocks)
        self.host_moves = HostMoves(
            tuple(stored), tuple(stored_from), tuple(loaded), tier.num_evicted_blocks - evicted
        )

    def _append(self, seq: str, count: int) -> str:
        before = self._host_before()
        results = self.manager.append_tokens(seq, self._rng.integers(0, 32_000, count).tolist())
        kv = self._random_kv(count)
        copies = 0
        for result, token_kv in zip(results, kv, strict=True):
            if result.cow is not None:
                self.paged.cache.copy_blocks([result.cow])
                copies += 1
            self.paged.cache.write(0, [result.slot], token_kv[0:1], token_kv[1:2])
        self._truth[seq].extend(kv)
        self._offer_decoded(seq, count)
        self._store_down(seq, before, [])
        return seq + (f" (copy-on-write of block {results[0].cow[0]})" if copies else "")

    def _fork(self, seq: str, child: str) -> str:
        self.manager.fork(seq, child)
        self._truth[child] = list(self._truth[seq])
        self._created(child)
        return child

    def _free(self, seq: str) -> str:
        tokens = self.manager.token_ids(seq)
        self.manager.free(seq)
        del self._truth[seq]
        if self.host_tier is not None:  # refresh the tier's recency (LRU) / move reused keys to T2 (ARC)
            per = self.host_tier.blocks_per_host_block
            self.host_tier.on_request_finished(
                self._hashes(tokens)[per - 1 :: per], self._host_reused.pop(seq, set())
            )
        return seq

    def _created(self, seq: str) -> None:
        self.color_index[seq] = len(self.color_index)
        if seq == f"s{self._next_id}":
            self._next_id += 1

    def _random_kv(self, count: int) -> torch.Tensor:
        c = self.config
        return torch.randn(
            count, 2, c.num_kv_heads, c.head_dim, generator=self._generator
        )  # [tokens, K/V, h, d]

    # ---- views --------------------------------------------------------------------------------------------------

    def snapshot(self) -> KVCacheSnapshot:
        return self.manager.snapshot()

    def waste(self) -> Waste:
        snap = self.manager.snapshot()
        owned = snap.ref_count > 0
        stored = int(snap.fill[owned].sum())
        paged = int(owned.sum()) * self.config.block_size - stored
        lengths = np.fromiter(snap.num_tokens.values(), dtype=np.int64, count=len(snap.num_tokens))
        max_len = self.config.contiguous_max_len
        return Waste(
            paged=paged,
            contiguous=int(np.clip(max_len - lengths, 0, None).sum()),
            stored_tokens=stored,
            logical_tokens=int(lengths.sum()),
            contiguous_overflow=int((lengths > max_len).sum()),
        )

    def verify(self) -> float:
        """Max |gathered - written| over every live sequence's K and V (0.0 when paging lost nothing).

        With a sliding window only the blocks a sequence still holds are read back (from the first held block's
        first token); released blocks belong to the pool again."""
        worst = 0.0
        bs = self.config.block_size
        for seq, truth in self._truth.items():
            table = self.manager.block_table(seq)
            first = len(table) - self.manager.num_held_blocks(seq)
            num_tokens = self.manager.num_tokens(seq)
            if first == len(table):
                continue
            key, value = self.paged.cache.gather(0, table[first:], num_tokens - first * bs)
            expected = torch.stack(truth[first * bs :])  # [tokens held, 2, heads, dim]
            worst = max(worst, float((torch.stack([key, value], dim=1) - expected).abs().max()))
        return worst

    def _record(self, action: str, ok: bool, message: str) -> None:
        waste = self.waste()
        self.history.append(
            HistoryEntry(
                step=len(self.history),
                action=action,
                ok=ok,
                message=message,
                free_blocks=self.manager.num_free_blocks,
                used_blocks=self.manager.num_blocks - self.manager.num_free_blocks,
                stored_tokens=waste.stored_tokens,
                paged_waste_slots=waste.paged,
                contiguous_waste_slots=waste.contiguous,
                host_used_blocks=0 if self.host_tier is None else self.host_tier.num_used_blocks,
                host_stored_blocks=len(self.host_moves.stored),
                host_loaded_blocks=len(self.host_moves.loaded),
            )
        )

    @classmethod
    def demo(cls, config: PlaygroundConfig | None = None, seed: int = 0) -> "Playground":
        """A small scene that shows every mechanism at once: two prompts, a fork with copy-on-write, decode.
        With a host tier it goes on: every sequence freed, one that fills HBM (evicting the cached system
        prompt there, while the host tier keeps its copy), freed, and a new prompt whose system prompt comes
        back up from the host tier."""
        playground = cls(config or PlaygroundConfig(), seed)
        steps = [
            lambda p: p.add_sequence(70),
            lambda p: p.add_sequence(45),
            lambda p: p.fork("s0"),
            lambda p: p.append("s2", 5),
            lambda p: p.append("s1", 20),
            lambda p: p.append("s0", 3),
        ]
        if playground.host_tier is not None:  # then the prompt's blocks go down, leave HBM and come back up
            steps += [
                lambda p: p.free("s2"),
                lambda p: p.free("s1"),
                lambda p: p.free("s0"),
                lambda p: p.add_sequence(
                    p.manager.num_free_blocks * p.config.block_size, shared_prefix=False
                ),
                lambda p: p.free("s3"),
                lambda p: p.add_sequence(45),
            ]
        for step in steps:
            try:
                step(playground)
            except LabError:
                break  # a pool too small for the whole scene keeps what fitted
        return playground
