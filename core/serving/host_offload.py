"""`HostOffload`: a host-memory KV tier for the serving simulator (vLLM's native CPU offloading,
`--kv-offloading-size GiB --kv-offloading-backend native`; the tier itself is `core.kv.host_tier.HostTier`).

What the simulator does with it (`SimulatorConfig.offload`, paged policy with prefix caching only):
- the pool's `KVCacheManager` gets a `HostTier` of `host_capacity_tokens // block_size` blocks, evicting by
  `policy` ("lru" or "arc"), storing every block as it is computed (after `store_threshold` offers when >= 2);
- a prompt's hit runs from HBM into the tier; the host-hit tokens are not prefilled but loaded: the request
  holds its blocks and waits (no prefill chunk) while its bytes, host tokens x `kv_bytes_per_token` of the
  step-time model (one GPU's share: every GPU loads its own over its own link), cross the link at
  `bandwidth_bytes_per_s`. Loads queue on the link one after another, and the other requests' steps run
  meanwhile (vLLM overlaps them: the request sits in WAITING_FOR_REMOTE_KVS while the DMA runs);
- stores (device to host) are not priced: they run on the other direction of the link, asynchronously, as
  vLLM's do (the published H100 figure is ~50 GB/s each way, 83 GB/s both).
"""

from dataclasses import dataclass

from core.common import check_float, check_int
from core.errors import InvalidArgumentError
from core.kv.host_tier import OFFLOAD_POLICIES

DEFAULT_OFFLOAD_BANDWIDTH = 50e9  # bytes/s one way per GPU: vLLM's offloading blog, H100 DMA over PCIe Gen5


@dataclass(frozen=True)
class HostOffload:
    """A host tier of `host_capacity_tokens` token slots (whole host blocks), `policy` "lru" | "arc", loads at
    `bandwidth_bytes_per_s` per GPU, `store_threshold` offers before a store (< 2: every block).
    Raises InvalidArgumentError for a negative or non-integer capacity, an unknown policy, or a bandwidth that
    is not a finite positive number."""

    host_capacity_tokens: int
    policy: str = "lru"
    bandwidth_bytes_per_s: float = DEFAULT_OFFLOAD_BANDWIDTH
    store_threshold: int = 0

    def __post_init__(self):
        check_int(self.host_capacity_tokens, "host_capacity_tokens", minimum=0)
        if self.policy not in OFFLOAD_POLICIES:
            raise InvalidArgumentError(
                f"offload policy must be one of {', '.join(OFFLOAD_POLICIES)}, got {self.policy!r}"
            )
        check_float(
            self.bandwidth_bytes_per_s, "offload bandwidth (bytes/s)", minimum=0, exclusive_minimum=True
        )
        check_int(self.store_threshold, "store_threshold", minimum=0)
