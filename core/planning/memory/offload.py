"""The host-memory KV tier of a capacity plan: what `--kv-offloading-size GiB --kv-offloading-backend native`
adds to one replica, by vLLM's arithmetic (`core.kv.host_tier.host_tier_num_blocks`).

vLLM reads `--kv-offloading-size` as GiB of pinned host memory for one data-parallel engine, summed over its
TP (and PP) ranks, and cuts it into host blocks of one GPU block's bytes on every rank (all layers, K and V),
each rounded up to a 4,096 B page: `blocks = size x 2**30 // round_up(block bytes per GPU x world size, 4096)`,
`tokens = blocks x block size`. Worked example: Qwen3-32B bf16 (262,144 B a token) on TP2 with 16-token blocks
is 2 MiB a block a GPU, 4 MiB a block over the two; 200 GiB holds 51,200 blocks = 819,200 tokens. (A published
guide's "1.31M tokens" for the same 200 GiB is not vLLM's arithmetic: 200 x 2**30 / 1,310,720 is 163,840 B
= 160 KiB a token, while Qwen3-32B's KV is 256 KiB a token.)

The tier is inclusive (it also holds copies of what HBM holds), so the tokens it adds to the replica's reach are
`max(0, host_kv_tokens - kv_tokens)`; `host_memory_bytes_total` is the pod memory the deployment pins
(the size x replicas).
"""

from dataclasses import asdict, dataclass

from core.common import check_float
from core.kv.host_tier import host_tier_num_blocks

GIB = 1 << 30
MAX_OFFLOAD_GIB = 1024.0**2  # 1 PiB per replica: far beyond any host


def check_offload_gib(value: object, name: str = "--kv-offload-gib") -> float:
    """`value` as GiB of host memory for the tier: a finite number >= 0 (0: no tier). Raises
    InvalidArgumentError for a negative size, nan, infinity or a non-number, one plain message each."""
    return check_float(value, name, minimum=0, maximum=MAX_OFFLOAD_GIB)


def offload_flags(kv_offload_gib: float) -> str:
    """The `vllm serve` flags that turn the tier on (empty for no tier)."""
    if not kv_offload_gib:
        return ""
    return f"--kv-offloading-size {kv_offload_gib:g} --kv-offloading-backend native"


@dataclass(frozen=True)
class HostKVTier:
    """One replica's host tier. `host_block_bytes` is one host block over every rank, page-aligned."""

    kv_offload_gib: float
    world_size: int
    host_block_bytes: int
    host_kv_blocks: int
    host_kv_tokens: int
    host_extra_tokens: int  # beyond what HBM holds (the tier is inclusive)
    host_memory_bytes_total: int  # pinned host memory over all replicas
    vllm_flags: str

    def to_dict(self) -> dict:
        return asdict(self)


def host_kv_tier(capacity, kv_offload_gib: float) -> HostKVTier:
    """The host tier `kv_offload_gib` GiB adds to each replica of `capacity` (a `CapacityPlan`, or the
    `ReplicaMemory` a prediction sizes a replica with: both have the fields read here): its blocks
    from the plan's block bytes per GPU and world size tp x pp. Raises InvalidArgumentError for a bad size."""
    gib = check_offload_gib(kv_offload_gib)
    world = capacity.tensor_parallel * capacity.pipeline_parallel
    per_worker = max(1, capacity.block_bytes)
    blocks = host_tier_num_blocks(gib * GIB, per_worker, world_size=world)
    tokens = blocks * capacity.block_size
    aligned = -(-per_worker * world // 4096) * 4096
    return HostKVTier(
        kv_offload_gib=gib,
        world_size=world,
        host_block_bytes=aligned,
        host_kv_blocks=blocks,
        host_kv_tokens=tokens,
        host_extra_tokens=max(0, tokens - capacity.kv_tokens),
        host_memory_bytes_total=int(gib * GIB) * capacity.replicas,
        vllm_flags=offload_flags(gib),
    )
