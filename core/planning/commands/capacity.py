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

from core.errors import InvalidArgumentError, LabError
from core.fields import check_values
from core.planning.catalog.hardware import GPUSpec, get_gpu
from core.planning.catalog.models import ModelSpec, get_model, model_from_config_file
from core.planning.catalog.weights import with_checkpoint_bytes
from core.planning.commands.flags import add_flags, flag_kwargs
from core.planning.commands.subcommands import commands_epilog
from core.planning.memory.cpu_kv import CpuKVPlan, plan_cpu_kv
from core.planning.memory.offload import HostKVTier, host_kv_tier
from core.planning.memory.plan import CapacityPlan, plan_from
from core.planning.predict.deployment_fields import (
    GPU_FIELD,
    GPU_MEMORY_FIELD,
    MODEL_FIELD,
    MOE_FIELDS,
    PARALLEL_FIELDS,
    SETTING_FIELDS,
)
from core.planning.predict.inputs import cpu_inputs_from, custom_gpu_from, plan_inputs_from
from core.planning.predict.plan_fields import (
    ACTIVATION_FIELD,
    BLOCK_SIZE_FIELD,
    CONFIG_FIELDS,
    CONTEXT_LEN_FIELD,
    CPU_DTYPE_FIELD,
    CPU_SPACE_FIELD,
    CUSTOM_GPU_FIELDS,
    HYBRID_FIELD,
    MAX_MODEL_LEN_FIELD,
    NUM_GPUS_FIELD,
    OFFLOAD_FIELD,
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
        epilog=commands_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(MODEL_FIELD.flag, **flag_kwargs(MODEL_FIELD, "llama-3.1-70b"))
    source.add_argument(CONFIG_FIELDS[0].flag, **flag_kwargs(CONFIG_FIELDS[0]))
    add_flags(parser, CONFIG_FIELDS[1:])
    add_flags(parser, (GPU_FIELD,), {"gpu": "h100-80gb"})
    add_flags(parser, CUSTOM_GPU_FIELDS)
    add_flags(
        parser, (NUM_GPUS_FIELD, *PARALLEL_FIELDS[:2], *MOE_FIELDS, *SETTING_FIELDS[2:4], GPU_MEMORY_FIELD)
    )
    add_flags(parser, (BLOCK_SIZE_FIELD, MAX_MODEL_LEN_FIELD, CONTEXT_LEN_FIELD, ACTIVATION_FIELD))
    add_flags(parser, SETTING_FIELDS[:2])
    add_flags(parser, (HYBRID_FIELD,))  # --disable-hybrid-kv-cache-manager
    parser.add_argument(
        "--safetensors-index", help="path of the model's model.safetensors.index.json: exact weight bytes"
    )
    add_flags(parser, (OFFLOAD_FIELD,), {"kv_offload_gib": None})  # None: no host tier
    add_flags(parser, (CPU_SPACE_FIELD, CPU_DTYPE_FIELD))  # vLLM on a CPU: --cpu-kv-cache-space-gib, --dtype
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def _model_and_gpu(args: argparse.Namespace) -> tuple[ModelSpec, GPUSpec]:
    """The model (a preset or a config.json file) and the GPU (a preset or custom figures) the flags name."""
    if args.config:
        num_params = check_values(vars(args), CONFIG_FIELDS[1:])["num_params"]
        model = model_from_config_file(args.config, num_params)
    else:
        model = get_model(args.model)
    if args.safetensors_index:
        try:
            index = Path(args.safetensors_index).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidArgumentError(f"cannot read {args.safetensors_index}: {error}") from None
        model = with_checkpoint_bytes(model, index)
    if args.gpu_memory_gib is None:
        return model, get_gpu(args.gpu)
    return model, custom_gpu_from(vars(args))


def capacity_main(argv: Sequence[str]) -> int:
    """The capacity plan of `argv` (the flags of `build_parser`), printed. Exit status 0, or 2 with the reason on
    stderr."""
    args = build_parser().parse_args(list(argv))
    if args.cpu_kv_cache_space_gib is not None:
        return _cpu_main(args)
    try:
        CPU_DTYPE_FIELD.check(
            args.dtype
        )  # the CPU plan's --dtype, refused in a GPU plan too (as argparse did)
        model, gpu = _model_and_gpu(args)
        capacity = plan_from(plan_inputs_from(vars(args) | {"model": model, "gpu": gpu}))
        gib = args.kv_offload_gib  # None: no host tier
        tier = None if gib is None else host_kv_tier(capacity, OFFLOAD_FIELD.check(gib))
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
        path = str(Path(args.config).resolve().parent) if args.config else None
        capacity = plan_cpu_kv(cpu_inputs_from(vars(args) | {"model": model, "model_path": path}))
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
