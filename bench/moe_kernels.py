"""vLLM's fused-MoE kernels measured alone against the lab's pricing of the routed experts; prints one JSON object.

    python -m bench.moe_kernels

The rows (`core.planning.cost.fits.moe_kernels`, core/planning/cost/fits/data/vllm_moe_kernels.csv): aiconfigurator's
vLLM MoE tables on H100 / H200 SXM, balanced routing, no EP, FP8 block / int4 / MXFP4 experts, vLLM 0.14.0 / 0.18.0
/ 0.19.0. Printed (docs/slo.md 2c, issue 40):
- fits: per expert format and vLLM version, the kernel model t = fixed + max(bytes x touched / (bandwidth x
  bandwidth_efficiency), FLOPs / (peak x flops_efficiency)) fitted on the shapes of models OTHER than the held-out
  ones (HELD_OUT_SHAPES: Qwen3-235B-A22B, MiniMax-M2.5, Kimi-K2.5), with its RMS log error there (rms_log_err:
  RMS of log(predicted / measured)); fits_uniform_routing, the same with the experts touched counted as the step
  model's uniform routing expects instead of as the rows' balanced routing touched them (an ablation); beside them end_to_end_profile, the adopted cross-model profile's expert
  efficiencies (VLLM_CROSS_MODEL_PROFILE, fitted on gpt-oss-120b's serving rows) and its per-kernel overhead;
- held_out: per format, held-out model's shape and version, that fit's RMS and mean log error on the shape's rows
  (mean > 0: the kernel ran faster than the model fitted on the other shapes says), and the mean by token band;
- deployments: each held-out model's served deployment (H200; Qwen3-235B-A22B FP8 TP 2 and 4, MiniMax-M2.5 FP8 TP 4,
  Kimi-K2.5 int4 TP 8), one MoE layer at 4, 8, 16, 1,024 and 8,192 tokens: the measured kernel per table version
  (mean of repeats, log-n interpolation where n is not a measured count) against what the step-time model with the
  adopted profile charges that layer for its routed experts (`step_model_expert_seconds`: the memory and compute
  parts, and the larger one, which is what a layer adds to a step whose roof the experts set), also priced with
  the table's routing (balanced: more experts touched at 16 tokens than uniform routing's expectation), and the
  measured over the charged; the same summed over the model's MoE layers (ms a step).
elapsed_s: the whole run.
"""

import json
import os
import platform
import time

import numpy as np

from bench.machine import machine_facts
from core.kernels.cpu_isa import cpu_description
from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost import layer_kernels as lk
from core.planning.cost.fits import moe_kernels as mk
from core.planning.cost.fits.engine_profiles import VLLM_CROSS_MODEL_PROFILE, engine_step_defaults
from core.planning.cost.step_time import from_specs

PROFILE = "vllm-cross-model"
TOKENS = (4, 8, 16, 1024, 8192)
# (model, weight dtype, GPU, TP, the vLLM version of its serving rows in vllm_silicon_models.csv)
DEPLOYMENTS = (
    ("qwen3-235b-a22b", "fp8", "h200-141gb", 2, "0.12.0"),
    ("qwen3-235b-a22b", "fp8", "h200-141gb", 4, "0.12.0"),
    ("minimax-m2.5", "fp8", "h200-141gb", 4, "0.16.0"),
    ("kimi-k2.5", "int4", "h200-141gb", 8, "0.16.0"),
)
TOKEN_BANDS = (("1-16", 1, 16), ("32-512", 32, 512), ("1024-16384", 1024, 16384))


def _shape_label(shape) -> str:
    """(hidden, width, k, E) as "hidden x width, k of E"."""
    h, i, k, e = (int(v) for v in shape)
    return f"{h} x {i}, {k} of {e}"


def _log_error_summary(errors: np.ndarray) -> dict:
    return {
        "rows": int(errors.size),
        "rms_log_err": float(np.sqrt(np.mean(errors**2))),
        "mean_log_err": float(errors.mean()),
    }


def uniform_routing_fits(rows) -> dict:
    """The same fits with each row's experts touched as the step-time model's uniform routing expects (not what
    the rows ran: an ablation, to show what the routing assumption moves)."""
    memory, compute = mk.ideal_seconds(rows, routing="uniform")
    measured = rows["latency_ms"].to_numpy() / 1e3
    held = mk.held_out_mask(rows)
    out = {}
    for fmt in mk.FORMATS:
        for version in mk.VERSIONS:
            train = (rows["moe_dtype"] == fmt).to_numpy() & (rows["version"] == version).to_numpy() & ~held
            if train.any():
                fit = mk.fit_kernel_model(memory[train], compute[train], measured[train])
                out.setdefault(fmt, {})[version] = {
                    "fixed_us": fit.model.fixed_s * 1e6,
                    "bandwidth_efficiency": fit.model.bandwidth_efficiency,
                    "flops_efficiency": fit.model.flops_efficiency,
                    "rms_log_err": fit.rms_log_error,
                }
    return out


def fits_and_held_out(rows) -> tuple[dict, dict, dict]:
    """(fits, held_out, the fitted KernelModel per (format, version)): the kernel model fitted per format and
    version on every shape but the held-out ones, and its errors on each held-out shape."""
    memory, compute = mk.ideal_seconds(rows)
    measured = rows["latency_ms"].to_numpy() / 1e3
    held = mk.held_out_mask(rows)
    tokens = rows["num_tokens"].to_numpy()
    fits, held_out, models = {}, {}, {}
    for fmt in mk.FORMATS:
        for version in mk.VERSIONS:
            mask = (rows["moe_dtype"] == fmt).to_numpy() & (rows["version"] == version).to_numpy()
            train = mask & ~held
            if not train.any():
                continue
            fit = mk.fit_kernel_model(memory[train], compute[train], measured[train])
            models[fmt, version] = fit.model
            subset = rows[train]
            fits.setdefault(fmt, {})[version] = {
                "kernel_source": sorted(set(subset["kernel_source"])),
                "fixed_us": fit.model.fixed_s * 1e6,
                "bandwidth_efficiency": fit.model.bandwidth_efficiency,
                "flops_efficiency": fit.model.flops_efficiency,
                "rms_log_err": fit.rms_log_error,
                "rows": fit.rows,
                "gpus": sorted(set(subset["gpu"])),
                "shapes": sorted(
                    {
                        _shape_label(s)
                        for s in subset[["hidden_size", "inter_size", "topk", "num_experts"]].to_numpy()
                    }
                ),
                "moe_tp_sizes": sorted(int(v) for v in set(subset["moe_tp_size"])),
            }
            for model, shape in mk.HELD_OUT_SHAPES.items():
                part = mask & mk.shape_mask(rows, shape)
                if not part.any():
                    continue
                errors = mk.log_errors(fit.model, memory[part], compute[part], measured[part])
                bands = {}
                for name, low, high in TOKEN_BANDS:
                    band = (tokens[part] >= low) & (tokens[part] <= high)
                    bands[name] = float(errors[band].mean()) if band.any() else None
                entry = held_out.setdefault(fmt, {}).setdefault(
                    model,
                    {
                        "shape": _shape_label(shape),
                        "served_in_this_format": mk.HELD_OUT_FORMATS[model] == fmt,
                    },
                )
                entry[version] = _log_error_summary(errors) | {"mean_log_err_by_tokens": bands}
    return fits, held_out, models


def deployment_comparison(rows, models: dict) -> list[dict]:
    """Per DEPLOYMENTS entry: the measured MoE layer against the step model's charge for its routed experts at
    TOKENS (module docstring)."""
    overrides = engine_step_defaults(PROFILE)
    out = []
    for slug, dtype, gpu, tp, serving in DEPLOYMENTS:
        shape, fmt = mk.HELD_OUT_SHAPES[slug], mk.HELD_OUT_FORMATS[slug]
        step = from_specs(MODELS[slug], GPUS[gpu], tensor_parallel=tp, weight_dtype=dtype, **overrides)
        layers = mk.moe_layers(slug, shape)
        table = rows[
            (rows["gpu"] == gpu).to_numpy()
            & (rows["moe_dtype"] == fmt).to_numpy()
            & (rows["moe_tp_size"] == tp).to_numpy()
            & mk.shape_mask(rows, shape)
        ]
        versions = [v for v in mk.VERSIONS if (table["version"] == v).any()]
        by_tokens = {}
        for n in TOKENS:
            memory, compute = mk.step_model_expert_seconds(step, n, layers)
            touched = mk.balanced_experts_touched(n, shape.topk, shape.num_experts) / shape.num_experts
            at_table = max(mk.step_model_expert_seconds(step, n, layers, touched=touched))
            charged = max(memory, compute)
            measured = {v: mk.measured_ms(table[table["version"] == v], n) * 1e3 for v in versions}
            ideal_memory = mk.expert_bytes(shape, fmt, tp) * touched / GPUS[gpu].memory_bandwidth
            ideal_compute = 2.0 * n * shape.topk * 3 * shape.hidden_size * shape.inter_size / tp
            ideal_compute /= GPUS[gpu].peak_fp8_flops if fmt in mk.FP8_FORMATS else GPUS[gpu].peak_bf16_flops
            by_tokens[str(n)] = {
                "touched_lab": float(step.experts_touched(float(n))),
                "touched_table": touched,
                "lab_memory_us": memory * 1e6,
                "lab_compute_us": compute * 1e6,
                "lab_charge_us": charged * 1e6,
                "lab_charge_table_routing_us": at_table * 1e6,
                "measured_us": measured,
                "measured_over_lab": {v: t / (charged * 1e6) for v, t in measured.items()},
                "kernel_model_us": {
                    v: float(models[fmt, v].seconds(ideal_memory, ideal_compute)) * 1e6
                    for v in versions
                    if (fmt, v) in models
                },
                "all_moe_layers_measured_ms": {v: t * layers / 1e3 for v, t in measured.items()},
                "all_moe_layers_lab_ms": charged * layers * 1e3,
            }
        out.append(
            {
                "model": slug,
                "weight_dtype": dtype,
                "format": fmt,
                "gpu": gpu,
                "tp": tp,
                "serving_rows_vllm": serving,
                "moe_layers": layers,
                "expert_bytes_per_layer_lab": step.expert_weight_bytes / layers,
                "expert_bytes_per_layer_kernel": mk.expert_bytes(shape, fmt, tp),
                "peak_flops": step.peak_flops,
                "table_versions": versions,
                "by_tokens": by_tokens,
            }
        )
    return out


def main() -> None:
    started = time.perf_counter()
    load_before = os.getloadavg()
    rows = mk.load_rows()
    fits, held_out, models = fits_and_held_out(rows)
    deployments = deployment_comparison(rows, models)
    counts = {
        fmt: {v: int(((rows["moe_dtype"] == fmt) & (rows["version"] == v)).sum()) for v in mk.VERSIONS}
        for fmt in mk.FORMATS
    }
    print(
        json.dumps(
            {
                "cpu": cpu_description(),
                "machine": machine_facts(load_before, python=platform.python_version()),
                "source": mk.SOURCE,
                "data": str(mk.DATA_PATH.relative_to(mk.DATA_PATH.parents[4])),
                "rows": counts,
                "kernel_model": "t = fixed + max(E x 3 h i / tp x bytes_per_param x touched / E / (bandwidth x "
                "bandwidth_efficiency), 2 n k 3 h i / tp / (peak x flops_efficiency)); touched: the experts the "
                "rows' balanced routing reaches; peak: FP8 for fp8_block, bf16 otherwise",
                "bytes_per_param": mk.BYTES_PER_PARAM,
                "held_out_shapes": {m: _shape_label(s) for m, s in mk.HELD_OUT_SHAPES.items()},
                "fits": fits,
                "fits_uniform_routing": uniform_routing_fits(rows),
                "end_to_end_profile": {
                    "profile": PROFILE,
                    "expert_bandwidth_efficiency": VLLM_CROSS_MODEL_PROFILE["expert_bandwidth_efficiency"],
                    "expert_flops_efficiency": VLLM_CROSS_MODEL_PROFILE["expert_flops_efficiency"],
                    "kernel_overhead_us": VLLM_CROSS_MODEL_PROFILE["kernel_overhead_s"] * 1e6,
                    # the fixed time the profile gives an MoE block's kernels (layer_kernels.MOE_MLP of them):
                    # beside the measured kernels' fixed time per MoE layer
                    "moe_block_fixed_us": lk.MOE_MLP * VLLM_CROSS_MODEL_PROFILE["kernel_overhead_s"] * 1e6,
                    "fitted_on": "gpt-oss-120b's MXFP4 serving rows (with Llama-3.1-70B and Qwen3-32B): docs/slo.md 2c",
                },
                "held_out": held_out,
                "tokens": list(TOKENS),
                "deployments": deployments,
                "not_in_table": [
                    "minimax-m2.5 FP8 TP 8 on H200 (54 serving rows, vLLM 0.18.0): the table's MiniMax-M2.5 shape "
                    "stops at moe_tp_size 4"
                ],
                "elapsed_s": time.perf_counter() - started,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
