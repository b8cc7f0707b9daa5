"""GPU presets for capacity planning: memory capacity, memory bandwidth and peak dense bf16 throughput.

Units, and the GB / GiB trap:
- `memory_bytes` is in bytes. Vendors print "80GB" for a card with 80 GiB (85.9e9 bytes) of HBM: DRAM
  capacity is binary (an H100 80GB has five 16 GiB HBM3 stacks). So "80GB" is stored as 80 x 2**30 bytes and
  shown as "80.0 GiB". The driver keeps a little for itself: `torch.cuda.mem_get_info()` (which vLLM
  multiplies by gpu_memory_utilization) reports about 79.1 GiB on an H100 80GB and 39.4-39.6 GiB on an
  A100 40GB. Enter a custom GPU with the exact `nvidia-smi` figure when that last 1% matters.
  (The PagedAttention paper does the same: its "12 GB" of KV on an A100-40GB gives 15.7K slots of 800 KiB,
  i.e. 12 GiB.)
- `memory_bandwidth` is in bytes per second, decimal as vendors print it (3,350 GB/s = 3.35e12 B/s).
- `peak_bf16_flops` is dense (no 2:4 sparsity) bf16 tensor-core FLOP/s from the same datasheet; NVIDIA often
  prints the sparse figure, twice as large.
"""

from dataclasses import asdict, dataclass
from typing import Any

from core.errors import InvalidArgumentError

GiB = 1024**3
GB = 10**9
TB_PER_S = 10**12
TFLOPS = 10**12

# Guards for custom GPUs typed by a user: refuse values no real accelerator has.
MAX_MEMORY_BYTES = 4096 * GiB
MAX_BANDWIDTH = 100 * TB_PER_S
MAX_FLOPS = 100_000 * TFLOPS


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator. memory_bytes: bytes of device memory; memory_bandwidth: bytes/s;
    peak_bf16_flops: dense bf16 FLOP/s (None when unknown, e.g. a custom GPU without it)."""

    name: str
    memory_bytes: int
    memory_bandwidth: float
    peak_bf16_flops: float | None
    memory_type: str = ""
    source: str = ""

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / GB

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def custom(
        cls,
        name: str,
        memory_gib: float,
        bandwidth_gb_per_s: float,
        peak_bf16_tflops: float | None = None,
    ) -> "GPUSpec":
        """A user-defined GPU: memory in GiB, bandwidth in GB/s (decimal), dense bf16 TFLOP/s (optional).

        Raises `InvalidArgumentError` for non-positive, non-finite or absurd values (memory > 4 TiB,
        bandwidth > 100 TB/s, compute > 100 PFLOP/s).
        """
        memory = _positive(memory_gib, "GPU memory (GiB)") * GiB
        bandwidth = _positive(bandwidth_gb_per_s, "memory bandwidth (GB/s)") * GB
        flops = (
            None
            if peak_bf16_tflops in (None, 0)
            else _positive(peak_bf16_tflops, "peak bf16 TFLOP/s") * TFLOPS
        )
        if memory > MAX_MEMORY_BYTES:
            raise InvalidArgumentError(f"GPU memory {memory_gib:,} GiB is absurd; allowed up to 4,096 GiB")
        if bandwidth > MAX_BANDWIDTH:
            raise InvalidArgumentError(
                f"bandwidth {bandwidth_gb_per_s:,} GB/s is absurd; allowed up to 100,000 GB/s"
            )
        if flops is not None and flops > MAX_FLOPS:
            raise InvalidArgumentError(f"{peak_bf16_tflops:,} TFLOP/s is absurd; allowed up to 100,000")
        return cls(
            name=name or "custom GPU",
            memory_bytes=int(memory),
            memory_bandwidth=bandwidth,
            peak_bf16_flops=flops,
            memory_type="custom",
            source="entered by the user",
        )


def _positive(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise InvalidArgumentError(f"{what} must be a positive finite number, got {value!r}")
    return number


GPUS: dict[str, GPUSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: 40GB HBM2, 1,555 GB/s; BF16 312 TFLOPS
    # dense (624 with sparsity).
    "a100-40gb": GPUSpec(
        "A100 SXM 40GB", 40 * GiB, 1_555 * GB, 312 * TFLOPS, "HBM2", "NVIDIA A100 datasheet (SXM4 40GB)"
    ),
    # Same datasheet: 80GB HBM2e, 2,039 GB/s; BF16 312 TFLOPS dense.
    "a100-80gb": GPUSpec(
        "A100 SXM 80GB", 80 * GiB, 2_039 * GB, 312 * TFLOPS, "HBM2e", "NVIDIA A100 datasheet (SXM4 80GB)"
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS with sparsity,
    # 989 dense.
    "h100-80gb": GPUSpec(
        "H100 SXM 80GB", 80 * GiB, 3_350 * GB, 989 * TFLOPS, "HBM3", "NVIDIA H100 datasheet (SXM5)"
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141GB HBM3e, 4.8 TB/s; BF16 989 TFLOPS dense
    # (the same compute as H100). nvidia-smi reports 143,771 MiB (140.4 GiB).
    "h200-141gb": GPUSpec(
        "H200 SXM 141GB", 141 * GiB, 4_800 * GB, 989 * TFLOPS, "HBM3e", "NVIDIA H200 datasheet (SXM)"
    ),
    # NVIDIA L4 datasheet: 24GB GDDR6, 300 GB/s; BF16 242 TFLOPS with sparsity, 121 dense.
    "l4": GPUSpec("L4", 24 * GiB, 300 * GB, 121 * TFLOPS, "GDDR6", "NVIDIA L4 datasheet"),
    # NVIDIA L40S datasheet: 48GB GDDR6 with ECC, 864 GB/s; BF16 362.05 TFLOPS dense (733 with sparsity).
    "l40s": GPUSpec("L40S", 48 * GiB, 864 * GB, 362.05 * TFLOPS, "GDDR6", "NVIDIA L40S datasheet"),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 24GB GDDR6X, 1,008 GB/s; peak BF16
    # tensor TFLOPS with FP32 accumulate 165.2 dense (GeForce runs FP32-accumulate at half rate).
    "rtx-4090": GPUSpec(
        "GeForce RTX 4090", 24 * GiB, 1_008 * GB, 165.2 * TFLOPS, "GDDR6X", "NVIDIA Ada whitepaper (RTX 4090)"
    ),
    # AWS EC2 G5 (A10G): 24GB GDDR6, 600 GB/s (as the NVIDIA A10 datasheet). AWS does not publish A10G tensor
    # throughput; the A10 datasheet's BF16 125 TFLOPS dense is used, an upper bound for the A10G.
    "a10g": GPUSpec(
        "A10G",
        24 * GiB,
        600 * GB,
        125 * TFLOPS,
        "GDDR6",
        "AWS G5 instance page; NVIDIA A10 datasheet (compute)",
    ),
    # AMD Instinct MI300X data sheet: 192GB HBM3, 5.3 TB/s; BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity).
    "mi300x": GPUSpec(
        "Instinct MI300X", 192 * GiB, 5_300 * GB, 1307.4 * TFLOPS, "HBM3", "AMD MI300X data sheet"
    ),
    # NVIDIA DGX B200 datasheet: 1,440GB total GPU memory for 8 GPUs, i.e. 180GB usable per GPU (192GB of
    # HBM3e on the package), 8 TB/s; HGX B200 BF16 2.25 PFLOPS dense per GPU (4.5 with sparsity).
    "b200": GPUSpec("B200", 180 * GiB, 8_000 * GB, 2_250 * TFLOPS, "HBM3e", "NVIDIA DGX/HGX B200 datasheets"),
}


def get_gpu(slug: str) -> GPUSpec:
    """The preset named `slug`; raises `InvalidArgumentError` listing the known slugs."""
    try:
        return GPUS[slug]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"unknown GPU {slug!r}; known: {', '.join(GPUS)}") from None
