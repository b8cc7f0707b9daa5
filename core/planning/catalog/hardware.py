"""GPU presets for capacity planning: memory capacity, memory bandwidth and peak dense bf16 throughput.

Units, and the GB / GiB trap:
- `memory_bytes` is the total memory the driver reports (`nvidia-smi`'s "Total", the total of
  `torch.cuda.mem_get_info()`), in bytes: vLLM multiplies exactly that figure by gpu_memory_utilization, so a
  plan made from the printed "80GB" overstates the KV cache. The figures are public logs' MiB (see
  docs/figures.md): HBM cards report about their printed size in GiB (an A100 40GB exactly 40,960 MiB; an H100
  80GB 81,559 MiB, 0.4% under 80 GiB); GDDR6 data-centre cards with ECC on lose 1/16 of their chips (an L4's
  24 GiB x 15/16 = 22.5 GiB; nvidia-smi says 23,034 MiB), the L40S 45 of 48. Presets without a public driver figure
  (A100 80GB, MI300X, B200) follow the HBM rule: the printed GB taken as GiB, at most ~0.5% high (the H100's
  gap). `source` says which.
  (The PagedAttention paper's "12 GB" of KV on an A100-40GB gives 15.7K slots of 800 KiB, i.e. 12 GiB.)
- `memory_bandwidth` is in bytes per second, decimal as vendors print it (3,350 GB/s = 3.35e12 B/s).
- `peak_bf16_flops` is dense (no 2:4 sparsity) bf16 tensor-core FLOP/s from the same datasheet; NVIDIA often
  prints the sparse figure, twice as large.
- `interconnect_bandwidth` is the GPU-to-GPU bandwidth of one GPU in bytes/s as the datasheet prints it: the
  bidirectional total of all its links (NVLink, Infinity Fabric), or of its PCIe x16 slot for cards without
  NVLink (L4, L40S, A10G, RTX 4090). One direction carries half of it; the step-time model
  (`core.planning.cost.step_time`) sends tensor-parallel all-reduces and pipeline hand-offs at that half.
- `network_bandwidth` is one GPU's share of the scale-out network in bytes/s, one direction: the line rate of the
  NIC the vendor's 8-GPU system gives each GPU (DGX A100: ConnectX-6 200 Gb/s; DGX H100 / H200 / B200:
  ConnectX-7 400 Gb/s), None where no reference system fixes it (PCIe cards, MI300X). Disaggregated serving
  (`core.planning.predict.disagg`) moves the KV cache over it between nodes, over NVLink (half of
  interconnect_bandwidth) within one.
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
    peak_bf16_flops: dense bf16 FLOP/s (None when unknown, e.g. a custom GPU without it);
    interconnect_bandwidth: GPU-to-GPU bytes/s, bidirectional, as the datasheet prints it (None when unknown);
    interconnect: what carries it ("NVLink 4", "PCIe Gen4 x16", ...); peak_fp8_flops: dense FP8 tensor-core
    FLOP/s (None when the GPU has no FP8 tensor cores or the figure is unknown); network_bandwidth: one GPU's
    NIC bytes/s, one direction, in the vendor's reference system (None when unknown)."""

    name: str
    memory_bytes: int
    memory_bandwidth: float
    peak_bf16_flops: float | None
    memory_type: str = ""
    source: str = ""
    interconnect_bandwidth: float | None = None
    interconnect: str = ""
    peak_fp8_flops: float | None = None
    network_bandwidth: float | None = None

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


MiB = 1024**2
DRIVER = "memory: driver-reported total {mib:,} MiB (nvidia-smi / torch.cuda.mem_get_info, public logs)"
HBM_RULE = "memory: printed {gb} GB taken as GiB ({mib:,} MiB; HBM rule, no public driver figure)"


def _memory(mib: int, rule: str = DRIVER, printed_gb: int | None = None) -> tuple[int, str]:
    """(bytes, the source of the figure) for a total of `mib` MiB."""
    return mib * MiB, rule.format(mib=mib, gb=printed_gb)


def _preset(
    name, memory, bandwidth, flops, memory_type, datasheet, link, fp8_tflops=None, nic_gbit=None
) -> GPUSpec:
    """A preset; `link` is (interconnect, its bidirectional GB/s as printed); fp8_tflops: dense FP8 TFLOP/s;
    nic_gbit: the line rate of the GPU's NIC in its vendor's 8-GPU system, Gb/s."""
    memory_bytes, memory_source = memory
    interconnect, link_gb_per_s = link
    fp8 = None if fp8_tflops is None else fp8_tflops * TFLOPS
    network = None if nic_gbit is None else nic_gbit * GB / 8
    return GPUSpec(
        name,
        memory_bytes,
        bandwidth,
        flops,
        memory_type,
        f"{memory_source}; {datasheet}",
        link_gb_per_s * GB,
        interconnect,
        fp8,
        network,
    )


# One NIC per GPU in the vendor's 8-GPU systems (datasheets' networking rows): DGX A100 "8x Single-Port
# Mellanox ConnectX-6 VPI 200Gb/s HDR InfiniBand"; DGX H100 / DGX H200 / DGX B200 "8x single-port NVIDIA
# ConnectX-7 VPI, up to 400Gb/s InfiniBand/Ethernet".
NIC_DGX_A100_GBIT = 200
NIC_DGX_H100_GBIT = 400


NVLINK3 = ("NVLink 3", 600)  # A100 datasheet: "NVIDIA NVLink 600GB/s" (PCIe Gen4 64GB/s)
NVLINK4 = ("NVLink 4", 900)  # H100 / H200 datasheets (SXM): "NVIDIA NVLink: 900GB/s" (PCIe Gen5 128GB/s)
NVLINK5 = ("NVLink 5", 1800)  # DGX B200 datasheet: 5th-generation NVLink, 1.8TB/s GPU-to-GPU
PCIE4 = ("PCIe Gen4 x16", 64)  # L4, L40S, A10 datasheets: "PCIe Gen4 x16: 64GB/s bidirectional"; no NVLink
INFINITY_FABRIC = ("Infinity Fabric", 896)  # AMD MI300X data sheet: 7 links x 128 GB/s


GPUS: dict[str, GPUSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column: 40GB HBM2, 1,555 GB/s; BF16 312 TFLOPS
    # dense (624 with sparsity). nvidia-smi: 40,960 MiB (exactly 40 GiB).
    "a100-40gb": _preset(
        "A100 SXM 40GB",
        _memory(40_960),
        1_555 * GB,
        312 * TFLOPS,
        "HBM2",
        "NVIDIA A100 datasheet (SXM4 40GB)",
        NVLINK3,
        None,
        NIC_DGX_A100_GBIT,
    ),
    # Same datasheet: 80GB HBM2e, 2,039 GB/s; BF16 312 TFLOPS dense. Memory by the HBM rule (its 40GB sibling
    # reports exactly 40 GiB).
    "a100-80gb": _preset(
        "A100 SXM 80GB",
        _memory(81_920, HBM_RULE, 80),
        2_039 * GB,
        312 * TFLOPS,
        "HBM2e",
        "NVIDIA A100 datasheet (SXM4 80GB)",
        NVLINK3,
        None,
        NIC_DGX_A100_GBIT,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS with sparsity,
    # 989 dense; FP8 3,958 with sparsity, 1,979 dense. nvidia-smi: 81,559 MiB (79.6 GiB).
    "h100-80gb": _preset(
        "H100 SXM 80GB",
        _memory(81_559),
        3_350 * GB,
        989 * TFLOPS,
        "HBM3",
        "NVIDIA H100 datasheet (SXM5)",
        NVLINK4,
        1_979,
        NIC_DGX_H100_GBIT,
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141GB HBM3e, 4.8 TB/s; BF16 989 TFLOPS dense
    # (the same compute as H100; FP8 1,979 dense, 3,958 with sparsity). nvidia-smi: 143,771 MiB (140.4 GiB).
    "h200-141gb": _preset(
        "H200 SXM 141GB",
        _memory(143_771),
        4_800 * GB,
        989 * TFLOPS,
        "HBM3e",
        "NVIDIA H200 datasheet (SXM)",
        NVLINK4,
        1_979,
        NIC_DGX_H100_GBIT,
    ),
    # NVIDIA L4 datasheet: 24GB GDDR6, 300 GB/s; BF16 242 TFLOPS with sparsity, 121 dense; FP8 485 with
    # sparsity, 242.5 dense. nvidia-smi with ECC on: 23,034 MiB (22.5 GiB).
    "l4": _preset(
        "L4", _memory(23_034), 300 * GB, 121 * TFLOPS, "GDDR6", "NVIDIA L4 datasheet", PCIE4, 242.5
    ),
    # NVIDIA L40S datasheet: 48GB GDDR6 with ECC, 864 GB/s; BF16 362.05 TFLOPS dense (733 with sparsity); FP8
    # 733 dense (1,466 with sparsity).
    # nvidia-smi with ECC on: 46,068 MiB (45.0 GiB; a vLLM startup log shows 44.42 GiB total).
    "l40s": _preset(
        "L40S", _memory(46_068), 864 * GB, 362.05 * TFLOPS, "GDDR6", "NVIDIA L40S datasheet", PCIE4, 733
    ),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: 24GB GDDR6X, 1,008 GB/s; peak BF16
    # tensor TFLOPS with FP32 accumulate 165.2 dense (GeForce runs FP32-accumulate at half rate). No ECC:
    # nvidia-smi 24,564 MiB.
    "rtx-4090": _preset(
        "GeForce RTX 4090",
        _memory(24_564),
        1_008 * GB,
        165.2 * TFLOPS,
        "GDDR6X",
        "NVIDIA Ada whitepaper (RTX 4090)",
        PCIE4,
    ),
    # AWS EC2 G5 (A10G): 24GB GDDR6, 600 GB/s (as the NVIDIA A10 datasheet). AWS does not publish A10G tensor
    # throughput; the A10 datasheet's BF16 125 TFLOPS dense is used, an upper bound for the A10G. nvidia-smi
    # with ECC on: 23,028 MiB.
    "a10g": _preset(
        "A10G",
        _memory(23_028),
        600 * GB,
        125 * TFLOPS,
        "GDDR6",
        "AWS G5 instance page; NVIDIA A10 datasheet (compute)",
        PCIE4,
    ),
    # AMD Instinct MI300X data sheet: 192GB HBM3, 5.3 TB/s; BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity);
    # FP8 2,614.9 dense.
    "mi300x": _preset(
        "Instinct MI300X",
        _memory(196_608, HBM_RULE, 192),
        5_300 * GB,
        1307.4 * TFLOPS,
        "HBM3",
        "AMD MI300X data sheet",
        INFINITY_FABRIC,
        2_614.9,
    ),
    # NVIDIA DGX B200 datasheet: 1,440GB total GPU memory for 8 GPUs, i.e. 180GB usable per GPU (192GB of
    # HBM3e on the package), 8 TB/s; HGX B200 BF16 2.25 PFLOPS dense per GPU (4.5 with sparsity); FP8 4.5 dense.
    "b200": _preset(
        "B200",
        _memory(184_320, HBM_RULE, 180),
        8_000 * GB,
        2_250 * TFLOPS,
        "HBM3e",
        "NVIDIA DGX/HGX B200 datasheets",
        NVLINK5,
        4_500,
        NIC_DGX_H100_GBIT,
    ),
}


def get_gpu(slug: str) -> GPUSpec:
    """The preset named `slug`; raises `InvalidArgumentError` listing the known slugs."""
    try:
        return GPUS[slug]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"unknown GPU {slug!r}; known: {', '.join(GPUS)}") from None
