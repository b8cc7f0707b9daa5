"""A `KVCacheManager`'s side of its host tier (vLLM's offloading connector, its scheduler side): `check_host_tier`,
whether a tier can serve the manager, and `HostLoads`, composed into the manager: the host-to-GPU copies a prompt's
host hits take (`list_loads`), handed to the executor (`take`, the manager's `take_host_loads`), and what the tier
is told when a request ends (`request_finished`). The tier itself (capacity, stores, eviction) is
`core.kv.host_tier`; the lookup of a prompt's host hits is the pool's (`BlockPool.lookup_external`).
"""

from collections.abc import Hashable, Sequence

from core.errors import InvalidArgumentError
from core.kv.block_pool import PoolHook
from core.kv.host_tier import HostLoad
from core.kv.request import KVRequest
from core.kv.specs import KVCacheSpec


def check_host_tier(
    tier: PoolHook | None, groups: Sequence[KVCacheSpec], one_full_group: bool, enable_prefix_caching: bool
) -> PoolHook | None:
    """`tier` when a `KVCacheManager` of `groups` can serve it (one full-attention group, prefix caching on, the
    same GPU block size), None for None; else InvalidArgumentError."""
    if tier is None:
        return None
    if not isinstance(tier, PoolHook):
        raise InvalidArgumentError(
            f"host_tier must be a HostTier (or another PoolHook) or None, got {type(tier).__name__}"
        )
    if not (one_full_group and enable_prefix_caching):
        raise InvalidArgumentError(
            "a host tier needs prefix caching on and one full-attention KV cache group, "
            f"got {len(groups)} group(s), prefix caching {'on' if enable_prefix_caching else 'off'}"
        )
    if tier.block_size != groups[0].block_size:
        raise InvalidArgumentError(
            f"the host tier's GPU block size must be the pool's ({groups[0].block_size}), "
            f"got {tier.block_size}"
        )
    return tier


class HostLoads:
    """The loads and reused keys of a manager's host `tier` (a `core.kv.block_pool.PoolHook`, e.g. `HostTier`;
    None: the manager has none, and nothing is ever listed)."""

    def __init__(self, tier: PoolHook | None):
        self.tier = tier
        self._host_loads: list[HostLoad] = []
        self._host_reused: dict[Hashable, set[int]] = {}  # request -> host keys it loaded

    def take(self) -> list[HostLoad]:
        """Host-to-GPU copies listed by `allocate` since the last call (host tier hits), oldest first; the
        executor copies each before the request's first step. The list is emptied."""
        loads, self._host_loads = self._host_loads, []
        return loads

    def list_loads(self, request_id, table: list[int], gpu_hits: int, host_blocks: list[int], hashes) -> int:
        """Queue the copies of the host-hit GPU blocks after the `gpu_hits` pool hits into `table`'s new
        entries; returns the tokens they serve."""
        tier = self.tier
        per, bs = tier.blocks_per_host_block, tier.block_size
        first_chunk = gpu_hits // per
        end = (first_chunk + len(host_blocks)) * per
        for index in range(gpu_hits, end):
            self._host_loads.append(
                HostLoad(host_blocks[index // per - first_chunk], table[index], index % per)
            )
        keys = hashes[bs]
        self._host_reused[request_id] = {
            keys[(first_chunk + i + 1) * per - 1] for i in range(len(host_blocks))
        }
        return (end - gpu_hits) * bs

    def request_finished(self, request_id: Hashable, req: KVRequest, block_size: int) -> None:
        """Tell the tier the request ended: its computed full host blocks' keys (every `blocks_per_host_block`-th
        GPU block key of `block_size`), and the host keys it loaded (`list_loads`)."""
        per = self.tier.blocks_per_host_block
        keys = req.block_hashes.get(block_size, [])
        full = min(len(keys), req.num_computed // block_size)
        reused = self._host_reused.pop(request_id, set())
        self.tier.on_request_finished(keys[per - 1 : full : per], reused)
