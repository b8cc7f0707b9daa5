"""The torch tensors that hold the paged K/V, and a facade that keeps them in step with a `BlockManager`.

Layout (vLLM's, one tensor per layer for K and one for V):
    key_cache[layer], value_cache[layer]: [num_blocks, block_size, num_kv_heads, head_dim]
A *slot* is `block_id * block_size + offset`; viewing a layer as [num_blocks * block_size, heads, dim] makes
the slot the row index.
"""

from collections.abc import Hashable, Sequence

import torch

from core.common import check_budget, check_int
from core.device import default_device
from core.errors import InvalidArgumentError
from core.paging.block_manager import AppendResult, BlockManager

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kv_cache_bytes(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K and V for the whole pool: 2 x layers x blocks x block_size x kv_heads x head_dim x itemsize."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * num_blocks * block_size * num_kv_heads * head_dim * itemsize


class KVCache:
    """Paged K/V tensors for `num_layers` layers on `device` (CUDA when available, else CPU by default).

    The whole pool is allocated at construction, zero-filled. `max_bytes` (default: `memory_budget_bytes()`,
    4 GiB unless the operator set PAGED_LAB_MAX_BYTES) is checked before anything is allocated.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        max_bytes: int | None = None,
    ):
        num_layers = check_int(num_layers, "num_layers", minimum=1)
        num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
        block_size = check_int(block_size, "block_size", minimum=1)
        num_kv_heads = check_int(num_kv_heads, "num_kv_heads", minimum=1)
        head_dim = check_int(head_dim, "head_dim", minimum=1)
        if dtype not in SUPPORTED_DTYPES:
            allowed = ", ".join(str(d) for d in SUPPORTED_DTYPES)
            raise InvalidArgumentError(f"dtype {dtype} is not supported; allowed: {allowed}")
        check_budget(
            kv_cache_bytes(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype),
            f"a KV cache of {num_layers} layers x {num_blocks:,} blocks x {block_size} tokens x "
            f"{num_kv_heads} KV heads x {head_dim} dims ({dtype})",
            max_bytes,
        )
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else default_device()
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.value_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return kv_cache_bytes(
            self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim, self.dtype
        )

    def _check_layer(self, layer: int) -> int:
        return check_int(layer, "layer", minimum=0, maximum=self.num_layers - 1)

    def _as_slots(self, slot_mapping: torch.Tensor | Sequence[int]) -> torch.Tensor:
        slots = torch.as_tensor(slot_mapping, dtype=torch.long, device=self.device).reshape(-1)
        capacity = self.num_blocks * self.block_size
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
            raise InvalidArgumentError(
                f"slot ids must be in [0, {capacity:,}) (num_blocks x block_size), "
                f"got min {int(slots.min())}, max {int(slots.max())}"
            )
        return slots

    def write(
        self, layer: int, slot_mapping: torch.Tensor | Sequence[int], key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """Scatter tokens to their slots (vLLM's reshape_and_cache).

        slot_mapping: [num_tokens] slot ids. key, value: [num_tokens, num_kv_heads, head_dim].
        """
        layer = self._check_layer(layer)
        slots = self._as_slots(slot_mapping)
        expected = (slots.numel(), self.num_kv_heads, self.head_dim)
        for name, tensor in (("key", key), ("value", value)):
            if tuple(tensor.shape) != expected:
                raise InvalidArgumentError(
                    f"{name} must have shape [num_tokens, num_kv_heads, head_dim] = {list(expected)}, "
                    f"got {list(tensor.shape)}"
                )
        flat_shape = (self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim)
        self.key_cache[layer].view(flat_shape)[slots] = key.to(device=self.device, dtype=self.dtype)
        self.value_cache[layer].view(flat_shape)[slots] = value.to(device=self.device, dtype=self.dtype)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: for each (src, dst), copy block src into block dst in every layer, K and V."""
        if not pairs:
            return
        ids = torch.as_tensor(list(pairs), dtype=torch.long).reshape(-1, 2)
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks:
            raise InvalidArgumentError(f"block ids must be in [0, {self.num_blocks:,}), got {list(pairs)}")
        src, dst = ids[:, 0].to(self.device), ids[:, 1].to(self.device)
        for cache in (*self.key_cache, *self.value_cache):
            cache[dst] = cache[src]

    def gather(
        self, layer: int, block_table: Sequence[int] | torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The contiguous K and V of one sequence, each [num_tokens, num_kv_heads, head_dim] (a copy).

        A reference for tests and plots; attention kernels read the blocks in place instead.
        """
        layer = self._check_layer(layer)
        table = torch.as_tensor(block_table, dtype=torch.long).reshape(-1)
        num_tokens = check_int(num_tokens, "num_tokens", minimum=0)
        if num_tokens > table.numel() * self.block_size:
            raise InvalidArgumentError(
                f"num_tokens {num_tokens} does not fit a block table of {table.numel()} blocks x "
                f"{self.block_size} tokens"
            )
        if table.numel() and (int(table.min()) < 0 or int(table.max()) >= self.num_blocks):
            raise InvalidArgumentError(f"block ids must be in [0, {self.num_blocks:,})")
        table = table.to(self.device)
        shape = (-1, self.num_kv_heads, self.head_dim)
        key = self.key_cache[layer][table].reshape(shape)[:num_tokens]
        value = self.value_cache[layer][table].reshape(shape)[:num_tokens]
        return key, value


class PagedKVCache:
    """A `BlockManager` and a `KVCache` kept in step: block allocation, copy-on-write and K/V writes in one call.

    The manager stays usable alone; this facade only sequences the two (copy before write).
    """

    def __init__(self, manager: BlockManager, cache: KVCache):
        if manager.num_blocks != cache.num_blocks or manager.block_size != cache.block_size:
            raise InvalidArgumentError(
                f"manager ({manager.num_blocks} blocks x {manager.block_size}) and cache "
                f"({cache.num_blocks} blocks x {cache.block_size}) must have the same geometry"
            )
        self.manager = manager
        self.cache = cache

    def append(
        self, seq_id: Hashable, token_id: int, keys: torch.Tensor, values: torch.Tensor
    ) -> AppendResult:
        """Append one token whose per-layer K and V are keys[layer], values[layer]: [num_kv_heads, head_dim]."""
        expected = (self.cache.num_layers, self.cache.num_kv_heads, self.cache.head_dim)
        if tuple(keys.shape) != expected or tuple(values.shape) != expected:
            raise InvalidArgumentError(
                f"keys and values must have shape [num_layers, num_kv_heads, head_dim] = {list(expected)}, "
                f"got {list(keys.shape)} and {list(values.shape)}"
            )
        result = self.manager.append_token(seq_id, token_id)
        if result.cow is not None:
            self.cache.copy_blocks([result.cow])
        for layer in range(self.cache.num_layers):
            self.cache.write(layer, [result.slot], keys[layer : layer + 1], values[layer : layer + 1])
        return result
