"""nano-vllm's block manager algorithm, re-implemented here as the baseline of `bench.block_manager`.

Written from the published description of nano-vllm (GitHub GeeeekExplorer/nano-vllm,
`nanovllm/engine/block_manager.py` and `sequence.py`); none of its code is copied. The algorithm:

- Each physical block has a ref count, a hash (-1 when none) and the token ids it was hashed over. The manager
  keeps a hash -> block id map, a deque of free block ids (taken from the left, returned on the right) and a
  set of used block ids.
- `allocate(seq)`: for each logical block of the prompt, a full block's key chains the previous key; a block
  is a hit while the map names a block holding the same tokens (after the first miss every block is a miss).
  A hit on a used block adds a reference; a hit on a free block takes it back out of the free deque by value
  (`deque.remove`, a scan: this is why reviving a cached free block costs O(free blocks) there). Every full
  block's key is (re)registered in the map, pointing at its block.
- `deallocate(seq)`: the table last to first, one reference fewer each; a block reaching 0 goes back to the
  free deque (keeping its hash and tokens, so a later allocate can still hit it).
- Decode, once per step per sequence, after the sequence already holds the token whose K/V this step writes
  (nano-vllm's postprocess appended it): `can_append` (a free block exists when the token starts a new block)
  then `may_append`: the token starts a new block -> take the leftmost free block; the token fills its block ->
  hash the block chained with the previous block's hash and register it; otherwise nothing.
- The model runner reads the token's slot as `block_table[-1] * block_size + last_block_num_tokens - 1`.

Differences, stated: nano-vllm hashes with xxhash64 over the parent key's 8 bytes and a numpy array's bytes;
xxhash is not a dependency here, so both sides of the benchmark use the project's key, `core.kv.block_hash.
hash_block_tokens` (Python's tuple hash), with None for "no parent" where nano-vllm uses -1. nano-vllm's
`assert`s are kept (they are part of its per-token cost under a normal `python`). The plain classes have no
`__slots__`, as in nano-vllm. Prefix-cache eviction differs by design: nano-vllm never evicts a key from its
map (a re-used block simply loses its old hash on reset), vLLM and this lab evict LRU.
"""

from collections import deque


class NanoSequence:
    """A sequence as nano-vllm's engine holds it: its token ids, their count and its block table."""

    def __init__(self, token_ids: list[int], block_size: int):
        self.block_size = block_size
        self.token_ids = list(token_ids)
        self.num_tokens = len(self.token_ids)
        self.num_cached_tokens = 0
        self.block_table: list[int] = []

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_blocks(self) -> int:
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        return self.num_tokens - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """The token ids of logical block i (the last one may be partial)."""
        assert 0 <= i < self.num_blocks
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1


class NanoBlock:
    """One physical block: ref count, key (-1: none) and the tokens it was keyed over."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def set_key(self, key: int, token_ids: list[int]) -> None:
        self.hash = key
        self.token_ids = token_ids

    def clear(self) -> None:
        """Taken for a new use: one reference, no key."""
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class NanoBlockManager:
    """nano-vllm's block manager algorithm (see the module docstring), with the project's block key."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.blocks = [NanoBlock(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @staticmethod
    def key(token_ids: list[int], parent: int = -1) -> int:
        """The block key: `hash_block_tokens(parent or None, tuple(token_ids))`, inlined (one frame, as
        nano-vllm's own hash function is one)."""
        return hash((None if parent == -1 else parent, tuple(token_ids)))

    def _take(self, block_id: int) -> NanoBlock:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.clear()
        self.free_block_ids.remove(block_id)  # by value: O(position) in the deque
        self.used_block_ids.add(block_id)
        return block

    def _give_back(self, block_id: int) -> None:
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def can_allocate(self, seq: NanoSequence) -> bool:
        return len(self.free_block_ids) >= seq.num_blocks

    def allocate(self, seq: NanoSequence) -> None:
        assert not seq.block_table
        key = -1
        missed = False
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            key = self.key(token_ids, key) if len(token_ids) == self.block_size else -1
            block_id = self.hash_to_block_id.get(key, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                missed = True
            if missed:
                block = self._take(self.free_block_ids[0])
                block_id = block.block_id
            else:
                seq.num_cached_tokens += self.block_size
                if block_id in self.used_block_ids:
                    block = self.blocks[block_id]
                    block.ref_count += 1
                else:
                    block = self._take(block_id)
            if key != -1:
                block.set_key(key, token_ids)
                self.hash_to_block_id[key] = block_id
            seq.block_table.append(block_id)

    def deallocate(self, seq: NanoSequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._give_back(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def can_append(self, seq: NanoSequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: NanoSequence) -> None:
        table = seq.block_table
        last = self.blocks[table[-1]]
        if len(seq) % self.block_size == 1:  # the token starts a new block
            assert last.hash != -1
            block_id = self.free_block_ids[0]
            self._take(block_id)
            table.append(block_id)
        elif len(seq) % self.block_size == 0:  # the token fills its block: key it
            assert last.hash == -1
            token_ids = seq.block(seq.num_blocks - 1)
            parent = self.blocks[table[-2]].hash if len(table) > 1 else -1
            key = self.key(token_ids, parent)
            last.set_key(key, token_ids)
            self.hash_to_block_id[key] = last.block_id
        else:
            assert last.hash == -1
