"""The ranges of `core.planning.cost.step_model.StepTimeModel`'s fields, checked when one is made
(`check_step_fields`): byte, FLOP and time figures >= 0, bandwidths and peaks > 0, efficiencies in (0, 1], the
MoE routing and padding consistent, integer counts >= 1."""

import math

from core.common import check_int
from core.errors import InvalidArgumentError


def check_step_fields(model) -> tuple[float, ...]:
    """Raise InvalidArgumentError for a `StepTimeModel` field out of its range (the class docstring's), naming it
    and what is allowed; return small_step_factors as a tuple of floats."""
    try:
        factors = tuple(float(f) for f in model.small_step_factors)
    except (TypeError, ValueError):
        factors = None
    if factors is None or not all(math.isfinite(f) and f > 0 for f in factors):
        raise InvalidArgumentError(
            f"small_step_factors must be finite numbers > 0, got {model.small_step_factors!r}"
        )
    for name in (
        "weight_bytes",
        "kv_bytes_per_token",
        "flops_per_token",
        "attention_flops_per_pair",
        "overhead_s",
        "per_token_overhead_s",
        "comm_bytes_per_token",
        "comm_latency_s",
        "lm_head_flops_per_output",
        "expert_weight_bytes",
        "expert_flops_per_token",
        "prefill_context_flops_per_token",
    ):
        if not getattr(model, name) >= 0:
            raise InvalidArgumentError(f"{name} must be >= 0, got {getattr(model, name)!r}")
    for name in ("memory_bandwidth", "peak_flops", "swap_bandwidth", "interconnect_bandwidth"):
        if not getattr(model, name) > 0:
            raise InvalidArgumentError(f"{name} must be > 0, got {getattr(model, name)!r}")
    for name in ("bandwidth_efficiency", "flops_efficiency"):
        if not 0 < getattr(model, name) <= 1:
            raise InvalidArgumentError(f"{name} must be in (0, 1], got {getattr(model, name)!r}")
    if not 0 <= model.sliding_layer_fraction <= 1 or (
        model.sliding_layer_fraction and not model.sliding_window >= 1
    ):
        raise InvalidArgumentError(
            f"sliding_layer_fraction must be in [0, 1] with a sliding_window >= 1, got "
            f"{model.sliding_layer_fraction!r} and {model.sliding_window!r}"
        )
    prefill_pair = model.prefill_attention_flops_per_pair
    if prefill_pair is not None and not prefill_pair >= 0:
        raise InvalidArgumentError(
            f"prefill_attention_flops_per_pair must be >= 0 or None, got {prefill_pair!r}"
        )
    if (prefill_pair is not None or model.prefill_context_flops_per_token) and model.sliding_layer_fraction:
        raise InvalidArgumentError(
            "prefill attention priced apart (MLA) with sliding-window layers is not modelled: no model has both"
        )
    for name in ("expert_flops_efficiency", "expert_bandwidth_efficiency"):
        value = getattr(model, name)
        if value is not None and not 0 < value <= 1:
            raise InvalidArgumentError(f"{name} must be in (0, 1] or None, got {value!r}")
    if model.expert_flops_per_token > model.flops_per_token:
        raise InvalidArgumentError("expert_flops_per_token is part of flops_per_token: it cannot exceed it")
    if model.num_experts and not (1 <= model.experts_per_token <= model.num_experts):
        raise InvalidArgumentError(
            f"routed experts need 1 <= experts_per_token <= num_experts, got "
            f"{model.experts_per_token!r} of {model.num_experts!r}"
        )
    if model.single_token_overhead_s is not None and not model.single_token_overhead_s >= 0:
        raise InvalidArgumentError(
            f"single_token_overhead_s must be >= 0, got {model.single_token_overhead_s!r}"
        )
    if isinstance(model.expert_token_ranks, bool) or not (
        isinstance(model.expert_token_ranks, int) and model.expert_token_ranks >= 1
    ):
        raise InvalidArgumentError(
            f"expert_token_ranks must be an integer >= 1, got {model.expert_token_ranks!r}"
        )
    if check_int(model.expert_block_rows, "expert_block_rows", minimum=0) and not model.num_experts:
        raise InvalidArgumentError(f"expert_block_rows needs routed experts, got {model.expert_block_rows!r}")
    if isinstance(model.pipeline_stages, bool) or not (
        isinstance(model.pipeline_stages, int) and model.pipeline_stages >= 1
    ):
        raise InvalidArgumentError(f"pipeline_stages must be an integer >= 1, got {model.pipeline_stages!r}")
    return factors
