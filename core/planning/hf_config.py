"""Reading Hugging Face `config.json` fields the way vLLM does: integers under their aliases, dtype names, the
type of every layer (full, sliding-window, chunked-local or linear attention) and the shape of a linear-attention
layer's recurrent state (Mamba2, Gated DeltaNet)."""

import math
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidArgumentError

_DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}

# Refuse configs that cannot describe a real model (guards the planner against absurd pasted values).
MAX_DIMENSION = 1 << 20

# Per-layer attention types (Hugging Face's `layer_types` vocabulary). "linear_attention" is any layer that keeps
# a fixed-size recurrent state instead of K and V per token (Mamba2, Gated DeltaNet).
FULL, SLIDING, CHUNKED, LINEAR = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
)
LAYER_TYPES = (FULL, SLIDING, CHUNKED, LINEAR)
_LAYER_TYPE_ALIASES = {
    FULL: FULL,
    "attention": FULL,
    "global_attention": FULL,
    SLIDING: SLIDING,
    CHUNKED: CHUNKED,
    LINEAR: LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class RecurrentStateSpec:
    """The fixed-size state one linear-attention layer keeps per request, sized as vLLM's
    `MambaStateShapeCalculator` does (Mamba2 and Gated DeltaNet share one form):

        conv state: (conv_kernel - 1, conv_dim / tp) with conv_dim = inner_size + 2 x groups x state_size
        SSM state:  (num_heads / tp, head_dim, state_size)

    Mamba2 (`kind` "mamba2"): inner_size = mamba_expand x hidden, groups = mamba_n_groups (raised to tp when tp
    does not divide them, as vLLM replicates groups with their heads), heads / head_dim / state_size =
    mamba_n_heads / mamba_d_head / mamba_d_state. Gated DeltaNet ("gated_delta_net", Qwen3-Next): inner_size =
    value heads x value head dim, groups = key heads, heads = value heads, head_dim = value head dim,
    state_size = key head dim. `ssm_dtype` is the SSM state's dtype when the config fixes it
    (`mamba_ssm_dtype`), else None: both states are in the model's dtype (vLLM's `mamba_cache_dtype=auto`).
    """

    kind: str
    conv_kernel: int
    inner_size: int
    num_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    ssm_dtype: str | None = None

    def state_shapes(self, tensor_parallel: int = 1) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """(conv state shape, SSM state shape) on one TP rank; raises `InvalidArgumentError` when tp does
        not divide the sharded dimensions."""
        groups = self.num_groups
        if self.kind == "mamba2" and groups % tensor_parallel:
            groups = tensor_parallel
        conv_dim = self.inner_size + 2 * groups * self.state_size
        if conv_dim % tensor_parallel or self.num_heads % tensor_parallel:
            raise InvalidArgumentError(
                f"tensor_parallel={tensor_parallel} must divide the {self.kind} state: conv width {conv_dim:,}, "
                f"{self.num_heads} heads"
            )
        return (
            (self.conv_kernel - 1, conv_dim // tensor_parallel),
            (self.num_heads // tensor_parallel, self.head_dim, self.state_size),
        )

    def state_bytes(self, tensor_parallel: int, model_dtype: str) -> int:
        """Bytes of one request's state for one layer on one TP rank (conv + SSM state)."""
        conv, ssm = self.state_shapes(tensor_parallel)
        conv_bytes = DTYPE_BYTES[model_dtype]
        ssm_bytes = DTYPE_BYTES[self.ssm_dtype or model_dtype]
        return math.prod(conv) * conv_bytes + math.prod(ssm) * ssm_bytes


def dtype_name(raw: Any, field: str) -> str:
    dtype = _DTYPE_NAMES.get(str(raw).replace("torch.", "").lower())
    if dtype is None:
        raise InvalidArgumentError(f"{field} {raw!r} is not supported; allowed: float32, float16, bfloat16")
    return dtype


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def read_layer_types(cfg: dict[str, Any], num_layers: int) -> tuple[tuple[str, ...], int | None, int | None]:
    """(per-layer type, sliding window, attention chunk size) as vLLM reads a config.

    Types are LAYER_TYPES. In order: an explicit `layer_types` list; Gemma-2 and gpt-oss: even layers
    (0, 2, ...) slide; Gemma-3: layer i is full when (i + 1) % `sliding_window_pattern` (default 6) == 0, else
    it slides; Llama-4 with `attention_chunk_size`: layers that use RoPE (`no_rope_layers[i] == 1`; by default
    every layer but each `no_rope_layer_interval`-th, 4) are chunked, the NoPE layers full; Qwen3-Next
    (`full_attention_interval`, default 4): layer i is full when (i + 1) % interval == 0, else linear;
    Bamba-style `attn_layer_indices`: those layers are full, the rest linear; Qwen2/Qwen3: layers
    i >= `max_window_layers` slide only when `use_sliding_window` is true; any other config with a
    `sliding_window` (and `use_sliding_window` not false): every layer slides; else every layer is full.
    The window (chunk) is None when no layer slides (is chunked).
    """
    model_type = str(cfg.get("model_type", ""))
    window = _positive_int(cfg.get("sliding_window"))
    chunk = _positive_int(cfg.get("attention_chunk_size"))
    flag_off = cfg.get("use_sliding_window") is False
    layers = range(num_layers)
    if cfg.get("layer_types") is not None:
        types = _normalise_layer_types(cfg["layer_types"], num_layers)
    elif model_type in ("gemma2", "gpt_oss"):
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in layers)
    elif model_type in ("gemma3", "gemma3_text"):
        pattern = read_int(cfg, ("sliding_window_pattern",), "sliding_window_pattern", default=6)
        types = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in layers)
    elif model_type.startswith("llama4") and chunk is not None:
        uses_rope = cfg.get("no_rope_layers")
        if not uses_rope:
            interval = read_int(cfg, ("no_rope_layer_interval",), "no_rope_layer_interval", default=4)
            uses_rope = [int((i + 1) % interval != 0) for i in layers]
        if not isinstance(uses_rope, list) or len(uses_rope) != num_layers:
            raise InvalidArgumentError(f"no_rope_layers must list {num_layers} flags (1 = RoPE, 0 = NoPE)")
        types = tuple(CHUNKED if flag else FULL for flag in uses_rope)
    elif "full_attention_interval" in cfg or model_type == "qwen3_next":
        interval = read_int(cfg, ("full_attention_interval",), "full_attention_interval", default=4)
        types = tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in layers)
    elif isinstance(cfg.get("attn_layer_indices"), list):
        full = set(cfg["attn_layer_indices"])
        types = tuple(FULL if i in full else LINEAR for i in layers)
    elif model_type.startswith(("qwen2", "qwen3")):
        first = read_int(cfg, ("max_window_layers",), "max_window_layers", default=num_layers, minimum=0)
        on = cfg.get("use_sliding_window") is True and window is not None
        types = tuple(SLIDING if on and i >= first else FULL for i in layers)
    elif window is not None and not flag_off:
        types = (SLIDING,) * num_layers
    else:
        types = (FULL,) * num_layers
    if flag_off:
        types = tuple(FULL if t == SLIDING else t for t in types)
    if SLIDING in types and window is None:
        raise InvalidArgumentError("the config has sliding-attention layers but no positive sliding_window")
    if CHUNKED in types and chunk is None:
        raise InvalidArgumentError(
            "the config has chunked-attention layers but no positive attention_chunk_size"
        )
    return types, window if SLIDING in types else None, chunk if CHUNKED in types else None


def _normalise_layer_types(raw: Any, num_layers: int) -> tuple[str, ...]:
    if not isinstance(raw, list | tuple) or len(raw) != num_layers:
        raise InvalidArgumentError(f"layer_types must be a list of {num_layers} entries (one per layer)")
    types = []
    for entry in raw:
        kind = _LAYER_TYPE_ALIASES.get(str(entry).lower())
        if kind is None:
            raise InvalidArgumentError(
                f"layer type {entry!r} is not supported; allowed: {', '.join(sorted(_LAYER_TYPE_ALIASES))}"
            )
        types.append(kind)
    return tuple(types)


def read_recurrent_state(cfg: dict[str, Any], hidden: int) -> RecurrentStateSpec:
    """The state shape of the linear-attention layers: Gated DeltaNet (`linear_*` fields, Qwen3-Next) or
    Mamba2 (`mamba_*` fields, granite-4.0-h and Bamba)."""
    raw_ssm = cfg.get("mamba_ssm_dtype")
    ssm_dtype = None if raw_ssm in (None, "auto") else dtype_name(raw_ssm, "mamba_ssm_dtype")
    if "linear_num_value_heads" in cfg:
        value_heads = read_int(cfg, ("linear_num_value_heads",), "linear_num_value_heads")
        value_dim = read_int(cfg, ("linear_value_head_dim",), "linear_value_head_dim")
        return RecurrentStateSpec(
            kind="gated_delta_net",
            conv_kernel=read_int(cfg, ("linear_conv_kernel_dim",), "linear_conv_kernel_dim", default=4),
            inner_size=value_heads * value_dim,
            num_groups=read_int(cfg, ("linear_num_key_heads",), "linear_num_key_heads"),
            num_heads=value_heads,
            head_dim=value_dim,
            state_size=read_int(cfg, ("linear_key_head_dim",), "linear_key_head_dim"),
            ssm_dtype=ssm_dtype,
        )
    if "mamba_n_heads" in cfg or "mamba_d_state" in cfg:
        expand = cfg.get("mamba_expand", 2)
        if isinstance(expand, bool) or not isinstance(expand, int | float) or expand <= 0:
            raise InvalidArgumentError(
                f"config field 'mamba_expand' must be a positive number, got {expand!r}"
            )
        inner = int(expand * hidden)
        heads = read_int(cfg, ("mamba_n_heads",), "mamba_n_heads", default=128)
        head_dim = cfg.get("mamba_d_head", "auto")
        head_dim = inner // heads if head_dim == "auto" else read_int(cfg, ("mamba_d_head",), "mamba_d_head")
        return RecurrentStateSpec(
            kind="mamba2",
            conv_kernel=read_int(cfg, ("mamba_d_conv",), "mamba_d_conv", default=4),
            inner_size=inner,
            num_groups=read_int(cfg, ("mamba_n_groups",), "mamba_n_groups", default=1),
            num_heads=heads,
            head_dim=head_dim,
            state_size=read_int(cfg, ("mamba_d_state",), "mamba_d_state", default=256),
            ssm_dtype=ssm_dtype,
        )
    raise InvalidArgumentError(
        "the config has linear-attention layers but no state shape: expected Gated DeltaNet fields "
        "(linear_num_value_heads, linear_value_head_dim, linear_num_key_heads, linear_key_head_dim) or Mamba2 "
        "fields (mamba_n_heads, mamba_d_head, mamba_d_state, mamba_d_conv, mamba_expand, mamba_n_groups)"
    )


def read_int(
    cfg: dict[str, Any], keys: tuple[str, ...], what: str, default: Any = ..., minimum: int = 1
) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                raise InvalidArgumentError(f"config field {key!r} ({what}) must be an integer, got {value!r}")
            value = int(value)
            if not minimum <= value <= MAX_DIMENSION * 1024:
                raise InvalidArgumentError(
                    f"config field {key!r} ({what}) = {value:,} is out of range; allowed {minimum}.."
                    f"{MAX_DIMENSION * 1024:,}"
                )
            return value
    if default is ...:
        raise InvalidArgumentError(f"config.json lacks the {what}; expected one of: {', '.join(keys)}")
    return default
