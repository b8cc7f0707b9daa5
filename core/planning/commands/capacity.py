"""The capacity command: `python -m core.planning --model llama-3.1-70b --gpu h100-80gb --tp 4 --kv-dtype fp8
[--json]` (`capacity_main`; `core.planning.commands.dispatch` sends every argv without a subcommand here). With
`--cpu-kv-cache-space-gib G` it plans vLLM's CPU backend instead (`core.planning.memory.cpu_kv`): the blocks and
tokens `VLLM_CPU_KVCACHE_SPACE=G` holds for the model, and that `vllm serve` command.

Prints the plan as an aligned table (or JSON) and the matching `vllm serve` flags; exit status 2 with the
reason on stderr for bad input.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from core.common import check_float
from core.errors import InvalidArgumentError, LabError
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import ModelSpec, get_model, model_from_config_file
from core.planning.catalog.weights import with_checkpoint_bytes
from core.planning.commands.flags import add_flags, flag_kwargs
from core.planning.memory.cpu_kv import (
    CPU_DEFAULT_BLOCK_SIZE,
    CPU_MODEL_DTYPES,
    CpuKVInputs,
    CpuKVPlan,
    plan_cpu_kv,
)
from core.planning.memory.kv_accounting import (
    BLOCK_SIZES,
)
from core.planning.memory.offload import HostKVTier, host_kv_tier
from core.planning.memory.plan import CapacityPlan, plan
from core.planning.predict.deployment_fields import (
    GPU_FIELD,
    GPU_MEMORY_FIELD,
    MODEL_FIELD,
    MOE_FIELDS,
    OFFLOAD_FIELDS,
    PARALLEL_FIELDS,
    SETTING_FIELDS,
)


def plan_table(capacity: CapacityPlan) -> str:
    """The plan as an aligned text table (GiB are binary, 1 GiB = 1,073,741,824 bytes)."""
    gib = 1024**3

    def size(value: float) -> str:
        return f"{value / gib:,.2f} GiB ({value:,.0f} B)"

    rows = [
        ("model", capacity.model),
        (
            "GPUs",
            f"{capacity.num_gpus} x {capacity.gpu} (tp {capacity.tensor_parallel}, pp "
            f"{capacity.pipeline_parallel}, "
            + (f"dp {capacity.data_parallel}, " if capacity.data_parallel > 1 else "")
            + ("expert parallel, " if capacity.expert_parallel else "")
            + f"{capacity.replicas} replica(s))",
        ),
        ("dtypes", f"weights {capacity.weight_dtype}, KV cache {capacity.kv_dtype}"),
        ("GPU memory", size(capacity.gpu_memory_bytes)),
        (f"usable (x {capacity.gpu_memory_utilization:g})", size(capacity.usable_bytes)),
        ("weights per GPU", size(capacity.weights_bytes)),
        (
            "activations per GPU" + (" (estimate)" if capacity.activation_estimated else ""),
            size(capacity.activation_bytes),
        ),
        ("KV budget per GPU", size(capacity.kv_budget_bytes)),
        ("KV bytes per token per GPU", f"{capacity.kv_bytes_per_token:,} B"),
        (f"block bytes ({capacity.block_size} tokens)", f"{capacity.block_bytes:,} B"),
        ("KV blocks", f"{capacity.num_blocks:,}"),
        ("KV tokens", f"{capacity.kv_tokens:,}"),
        (f"bytes per {capacity.context_len:,}-token request", size(capacity.per_request_bytes)),
        (
            f"max concurrency at {capacity.context_len:,} tokens",
            f"{capacity.max_concurrency:,} per {'DP rank' if capacity.data_parallel > 1 else 'replica'}, "
            f"{capacity.max_concurrency_total:,} total",
        ),
        (
            "decode estimate (roofline upper bound)",
            f"{capacity.decode_tokens_per_s:,.0f} tokens/s at batch {capacity.decode_batch:,} ({capacity.decode_bound}-bound)"
            if capacity.decode_tokens_per_s
            else "n/a",
        ),
        ("verdict", capacity.verdict),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"note: {note}" for note in capacity.notes]
    return "\n".join(lines)


def add_moe_parallel_flags(parser: argparse.ArgumentParser) -> None:
    """`--data-parallel-size D` and `--enable-expert-parallel`, vLLM's flags, as `plan`, `predict` and `max-rate`
    take them (`core.planning.predict.deployment_fields.MOE_FIELDS`; a MoE model's DP ranks and EP)."""
    add_flags(parser, MOE_FIELDS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m core.planning",
        description="KV cache capacity plan for vLLM-style paged serving.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(MODEL_FIELD.flag, **flag_kwargs(MODEL_FIELD) | {"default": "llama-3.1-70b"})
    source.add_argument("--config", help="path of a Hugging Face config.json (instead of --model)")
    parser.add_argument("--num-params", type=float, help="parameter count for --config (default: estimated)")
    add_flags(parser, (GPU_FIELD,), {"gpu": "h100-80gb"})
    parser.add_argument("--gpu-memory-gib", type=float, help="custom GPU memory in GiB (overrides --gpu)")
    parser.add_argument("--gpu-bandwidth-gbps", type=float, help="custom GPU bandwidth in GB/s")
    parser.add_argument("--num-gpus", type=int)
    add_flags(parser, (*PARALLEL_FIELDS[:2], *MOE_FIELDS, *SETTING_FIELDS[2:4], GPU_MEMORY_FIELD))
    parser.add_argument(
        "--block-size",
        type=int,
        choices=BLOCK_SIZES,
        help="tokens per block (default 16; 128 on a CPU, as vLLM's)",
    )
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--context-len", type=int, help="request length for the concurrency figure")
    parser.add_argument("--activation-reserve-gib", type=float, help="measured activation peak, GiB per GPU")
    add_flags(parser, SETTING_FIELDS[:2])
    parser.add_argument(
        "--disable-hybrid-kv-cache-manager",
        action="store_true",
        help="count sliding-window and chunked layers as full attention, as vLLM does with this flag",
    )
    parser.add_argument(
        "--safetensors-index", help="path of the model's model.safetensors.index.json: exact weight bytes"
    )
    add_flags(parser, OFFLOAD_FIELDS[:1], {"kv_offload_gib": None})  # None: no host tier
    parser.add_argument(
        "--cpu-kv-cache-space-gib",
        type=int,
        metavar="G",
        help="plan vLLM's CPU backend with VLLM_CPU_KVCACHE_SPACE=G (whole GiB) instead of a GPU",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=CPU_MODEL_DTYPES,
        help="vllm serve --dtype (the CPU plan's KV dtype auto)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def _model_and_gpu(args: argparse.Namespace) -> tuple[ModelSpec, GPUSpec]:
    """The model (a preset or a config.json file) and the GPU (a preset or custom figures) the flags name."""
    model = model_from_config_file(args.config, args.num_params) if args.config else get_model(args.model)
    if args.safetensors_index:
        try:
            index = Path(args.safetensors_index).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidArgumentError(f"cannot read {args.safetensors_index}: {error}") from None
        model = with_checkpoint_bytes(model, index)
    if args.gpu_memory_gib is None:
        return model, get_gpu(args.gpu)
    if args.gpu_bandwidth_gbps is None:
        raise InvalidArgumentError("--gpu-memory-gib needs --gpu-bandwidth-gbps too")
    return model, GPUSpec.custom("custom GPU", args.gpu_memory_gib, args.gpu_bandwidth_gbps)


def capacity_main(argv: Sequence[str]) -> int:
    """The capacity plan of `argv` (the flags of `build_parser`), printed. Exit status 0, or 2 with the reason on
    stderr."""
    args = build_parser().parse_args(list(argv))
    if args.cpu_kv_cache_space_gib is not None:
        return _cpu_main(args)
    try:
        model, gpu = _model_and_gpu(args)
        reserve = None
        if args.activation_reserve_gib is not None:
            gib = check_float(
                args.activation_reserve_gib, "--activation-reserve-gib", minimum=0, maximum=1024**2
            )
            reserve = int(gib * 1024**3)
        capacity = plan(
            model,
            gpu,
            num_gpus=args.num_gpus,
            tensor_parallel=args.tp,
            pipeline_parallel=args.pp,
            weight_dtype=args.weight_dtype,
            kv_dtype=args.kv_dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            block_size=16 if args.block_size is None else args.block_size,
            max_model_len=args.max_model_len,
            activation_reserve=reserve,
            context_len=args.context_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
            data_parallel=args.data_parallel,
            expert_parallel=args.expert_parallel,
        )
        tier = None if args.kv_offload_gib is None else host_kv_tier(capacity, args.kv_offload_gib)
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = capacity.to_dict()
        if tier is not None:
            out.update(tier.to_dict())
        print(json.dumps(out, indent=2))
        return 0
    print(plan_table(capacity))
    if tier is not None:
        print(host_tier_table(tier))
    print()
    if not capacity.fits:
        print("# does not fit as planned; with the largest fitting settings:")
    print(
        capacity.vllm_command + (f" \\\n  {tier.vllm_flags}" if tier is not None and tier.vllm_flags else "")
    )
    return 0


def host_tier_table(tier: HostKVTier) -> str:
    """The host tier's rows (`--kv-offload-gib`), aligned like the plan's."""
    rows = [
        ("host KV tier per replica", f"{tier.kv_offload_gib:g} GiB over {tier.world_size} rank(s)"),
        ("host block bytes (all ranks, page-aligned)", f"{tier.host_block_bytes:,} B"),
        (
            "host_kv_tokens",
            f"{tier.host_kv_tokens:,} ({tier.host_kv_blocks:,} blocks; {tier.host_extra_tokens:,} beyond HBM)",
        ),
        ("host memory pinned, all replicas", f"{tier.host_memory_bytes_total / 1024**3:,.2f} GiB"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def cpu_table(capacity: CpuKVPlan) -> str:
    """The CPU plan as an aligned text table."""
    rows = [
        ("model", capacity.model),
        ("KV cache space", f"{capacity.kv_cache_space_gib:g} GiB ({capacity.kv_cache_memory_bytes:,} B)"),
        ("dtypes", f"model {capacity.dtype}, KV cache {capacity.kv_dtype}"),
        ("KV bytes per token", f"{capacity.kv_bytes_per_token:,} B (all layers)"),
        (f"block bytes ({capacity.block_size} tokens)", f"{capacity.block_bytes:,} B"),
        ("num_blocks", f"{capacity.num_blocks:,}"),
        ("kv_tokens", f"{capacity.kv_tokens:,}"),
        (f"max concurrency at {capacity.max_model_len:,} tokens", f"{capacity.max_concurrency:,.2f}"),
        ("verdict", capacity.verdict),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines + [f"note: {note}" for note in capacity.notes])


def _cpu_main(args: argparse.Namespace) -> int:
    """The CPU plan of `--cpu-kv-cache-space-gib` (exit status 0, or 2 with the reason on stderr)."""
    try:
        model, _ = _model_and_gpu(args)
        capacity = plan_cpu_kv(
            CpuKVInputs.from_space_gib(
                model,
                args.cpu_kv_cache_space_gib,
                block_size=CPU_DEFAULT_BLOCK_SIZE if args.block_size is None else args.block_size,
                dtype=args.dtype,
                kv_cache_dtype=args.kv_dtype,
                max_model_len=args.max_model_len,
                max_num_batched_tokens=args.max_num_batched_tokens,
                hybrid_kv_cache_manager=not args.disable_hybrid_kv_cache_manager,
                model_path=str(Path(args.config).resolve().parent) if args.config else None,
            )
        )
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(capacity.to_dict(), indent=2))
        return 0
    print(cpu_table(capacity))
    print()
    if not capacity.fits:
        print("# vLLM refuses to start with this max_model_len (see the verdict)")
    print(capacity.vllm_command)
    return 0
