"""The one reader of Hugging Face `config.json` files for KV-cache purposes: what kind every layer is and what it
keeps, read the way vLLM reads a config (integers under their aliases, dtype names, per-layer attention types,
the shape of a linear-attention layer's recurrent state), and turned into per-layer KV cache specs.

- `read_kv_layers(config) -> KVLayers`: layer types, KV heads, head size (MLA-aware), windows, chunk size,
  recurrent state and compute dtype of a config dict (a multimodal config is read from its `text_config`).
- `layer_specs(source, *, block_size, kv_dtype, tensor_parallel=1, max_model_len=None) -> list[KVCacheSpec]`:
  one spec per layer, for a config dict, a `KVLayers`, or any object with a `kv_layers` attribute (the
  planner's `ModelSpec`, the engine's `ModelConfig`).

The planner, the simulator and the engine all get layer kinds from here; none parses them itself.
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from core.common import check_int
from core.errors import InvalidArgumentError
from core.kv.specs import (
    KV_DTYPE_BITS,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    kv_dtype_name,
)

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
    i >= `max_window_layers` slide only when `use_sliding_window` is true (missing means false, as in
    transformers, also for an explicit `layer_types`); any other config with a
    `sliding_window` (and `use_sliding_window` not false): every layer slides; else every layer is full.
    The window (chunk) is None when no layer slides (is chunked).
    """
    model_type = str(cfg.get("model_type", ""))
    window = _positive_int(cfg.get("sliding_window"))
    chunk = _positive_int(cfg.get("attention_chunk_size"))
    flag = cfg.get("use_sliding_window")
    # Qwen2/Qwen3 configs default use_sliding_window to False (transformers), so a missing flag means off.
    flag_off = flag is False or (flag is None and model_type.startswith(("qwen2", "qwen3")))
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


# Alternative config keys, tried in order (vLLM's ModelConfig reads the same aliases).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "n_kv_heads")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
# What `kv_dtype` may name: "auto" (the model's compute dtype) or a KV dtype.
KV_CACHE_DTYPES = ("auto", *KV_DTYPE_BITS)


def language_config(config: Any) -> dict[str, Any]:
    """The config of the language model: the top level, overlaid with `text_config` when there is one."""
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"a config.json must be a JSON object, got {type(config).__name__}")
    cfg = dict(config)
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = {k: v for k, v in cfg.items() if k != "text_config"}
        merged.update(text)
        cfg = merged
    return cfg


@dataclass(frozen=True)
class KVLayers:
    """What a model's KV cache depends on, one entry of `layer_types` (LAYER_TYPES) per layer.

    num_kv_heads / head_size: per layer, before tensor parallelism; for an MLA model 1 and kv_lora_rank +
    qk_rope_head_dim (the latent it caches). dtype: the compute dtype ("float32", "float16", "bfloat16"), what
    kv_dtype "auto" means and what a recurrent state is kept in. Invariants: `sliding_window` is set iff a layer
    slides, `attention_chunk_size` iff a layer is chunked, `recurrent_state` iff a layer is linear attention.
    """

    name: str
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "bfloat16"
    is_mla: bool = False
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    recurrent_state: RecurrentStateSpec | None = None

    def __post_init__(self) -> None:
        kinds = set(self.layer_types)
        unknown = sorted(kinds - set(LAYER_TYPES))
        if unknown:
            raise InvalidArgumentError(
                f"layer types {unknown} are not supported; allowed: {', '.join(LAYER_TYPES)}"
            )
        for kind, value, what in (
            (SLIDING, self.sliding_window, "sliding_window"),
            (CHUNKED, self.attention_chunk_size, "attention_chunk_size"),
            (LINEAR, self.recurrent_state, "recurrent_state"),
        ):
            if (kind in kinds) != (value is not None):
                raise InvalidArgumentError(f"{what} must be set exactly when a layer is {kind}")

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Per layer: its sliding window in tokens (a sliding-attention layer), else None."""
        return tuple(self.sliding_window if t == SLIDING else None for t in self.layer_types)

    def check_parallel(self, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> None:
        """Raise `InvalidArgumentError` for a TP/PP layout vLLM refuses: num_attention_heads % tp != 0; KV
        heads neither divided by tp nor dividing it (MLA's one latent is replicated); pp over the layer count."""
        if self.num_attention_heads % tensor_parallel:
            raise InvalidArgumentError(
                f"{self.name} has {self.num_attention_heads} attention heads, not divisible by tensor_parallel="
                f"{tensor_parallel} (vLLM requires it)"
            )
        kv = self.num_kv_heads
        if not self.is_mla and kv % tensor_parallel and tensor_parallel % kv:
            raise InvalidArgumentError(
                f"{self.name} has {kv} KV heads: tensor_parallel={tensor_parallel} must divide them or be a "
                "multiple of them"
            )
        if pipeline_parallel > self.num_layers:
            raise InvalidArgumentError(
                f"pipeline_parallel={pipeline_parallel} exceeds the {self.num_layers} layers of {self.name}"
            )

    def kv_heads_per_rank(self, tensor_parallel: int = 1) -> int:
        """KV heads each TP rank stores: max(1, kv_heads // tp) (replicated when tp > kv_heads, as in vLLM);
        1 for MLA, whose latent every rank keeps whole."""
        return 1 if self.is_mla else max(1, self.num_kv_heads // tensor_parallel)


def read_kv_layers(config: Any, name: str | None = None) -> KVLayers:
    """The `KVLayers` of a Hugging Face config dict, with vLLM's fallbacks: KV heads `num_key_value_heads`
    (or an alias), else 1 for Falcon's `multi_query`, else `num_attention_heads`; head size the explicit
    `head_dim`, else hidden // heads; MLA (`kv_lora_rank` + `qk_rope_head_dim`) caches one latent of their sum;
    layer types by `read_layer_types`. The dtype is the checkpoint's `torch_dtype` (the caller maps a float32
    checkpoint to its serving dtype). Raises `InvalidArgumentError` naming the missing or bad field."""
    cfg = language_config(config)
    num_layers = read_int(cfg, LAYER_KEYS, "number of layers")
    num_heads = read_int(cfg, HEAD_KEYS, "number of attention heads")
    hidden = read_int(cfg, HIDDEN_KEYS, "hidden size")
    kv_heads = read_int(cfg, KV_HEAD_KEYS, "number of KV heads", default=None)
    if kv_heads is None:
        kv_heads = 1 if cfg.get("multi_query") is True else num_heads
    if kv_heads > num_heads:
        raise InvalidArgumentError(
            f"num_key_value_heads ({kv_heads}) exceeds num_attention_heads ({num_heads})"
        )
    head_size = read_int(cfg, ("head_dim",), "head_dim", default=None)
    if head_size is None:
        if hidden % num_heads:
            raise InvalidArgumentError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}; the config must "
                "give head_dim explicitly"
            )
        head_size = hidden // num_heads
    kv_lora_rank, rope_dim = read_mla(cfg)
    if kv_lora_rank is not None:
        # vLLM's get_head_size / get_num_kv_heads for MLA: one "head" of the latent's width.
        kv_heads, head_size = 1, kv_lora_rank + rope_dim
    types, window, chunk = read_layer_types(cfg, num_layers)
    model_type = str(cfg.get("model_type", "unknown"))
    return KVLayers(
        name=name or str(cfg.get("_name_or_path") or model_type),
        layer_types=types,
        num_attention_heads=num_heads,
        num_kv_heads=kv_heads,
        head_size=head_size,
        dtype=dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or "float16", "torch_dtype"),
        is_mla=kv_lora_rank is not None,
        sliding_window=window,
        attention_chunk_size=chunk,
        recurrent_state=read_recurrent_state(cfg, hidden) if LINEAR in types else None,
    )


def read_mla(cfg: dict[str, Any]) -> tuple[int | None, int | None]:
    """(kv_lora_rank, qk_rope_head_dim) of an MLA model, else (None, None)."""
    kv_lora_rank = read_int(cfg, ("kv_lora_rank",), "kv_lora_rank", default=None)
    rope_dim = read_int(cfg, ("qk_rope_head_dim",), "qk_rope_head_dim", default=None)
    if (kv_lora_rank is None) != (rope_dim is None):
        raise InvalidArgumentError("an MLA config needs both kv_lora_rank and qk_rope_head_dim")
    return kv_lora_rank, rope_dim


def as_kv_layers(source: Any) -> KVLayers:
    """`source` as KVLayers: a config dict is read, a KVLayers returned, anything else gives its `kv_layers`."""
    if isinstance(source, KVLayers):
        return source
    if isinstance(source, dict):
        return read_kv_layers(source)
    layers = getattr(source, "kv_layers", None)
    if not isinstance(layers, KVLayers):
        raise InvalidArgumentError(
            f"expected a config dict, KVLayers or a model with kv_layers, got {type(source).__name__}"
        )
    return layers


def resolve_kv_dtype_name(layers: KVLayers, kv_dtype: Any) -> str:
    """The short KV dtype of `kv_dtype` (KV_CACHE_DTYPES or a torch dtype): "auto" is the compute dtype."""
    try:
        return kv_dtype_name(layers.dtype if kv_dtype == "auto" else kv_dtype)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"kv_dtype {kv_dtype!r} is not supported; allowed: {', '.join(KV_CACHE_DTYPES)}"
        ) from None


def layer_specs(
    source: Any,
    *,
    block_size: int,
    kv_dtype: Any = "auto",
    tensor_parallel: int = 1,
    max_model_len: int | None = None,
) -> list[KVCacheSpec]:
    """One KV cache spec per layer of `source` (see `as_kv_layers`), on one tensor-parallel rank.

    Full attention: `FullAttentionSpec` (`MLAAttentionSpec` for an MLA model); sliding: `SlidingWindowSpec`;
    chunked: `ChunkedLocalAttentionSpec`; linear attention: `MambaSpec` with the conv and SSM state shapes on
    one rank in their own dtypes (the compute dtype, the SSM one overridable by the config), whose one block
    holds a request's whole state (block_size = max_model_len when given). Attention specs carry
    `block_size` tokens of `kv_dtype`; KV heads per rank as vLLM splits (or replicates) them. Layers with
    equal specs can share a block table. Raises `InvalidArgumentError` for a tp vLLM refuses or a bad dtype.
    """
    layers = as_kv_layers(source)
    tensor_parallel = check_int(tensor_parallel, "tensor_parallel", minimum=1)
    block_size = check_int(block_size, "block_size", minimum=1)
    if max_model_len is not None:
        max_model_len = check_int(max_model_len, "max_model_len", minimum=1)
    layers.check_parallel(tensor_parallel)
    dtype = resolve_kv_dtype_name(layers, kv_dtype)
    return list(cached_layer_specs(layers, block_size, dtype, tensor_parallel, max_model_len))


@lru_cache(maxsize=256)
def cached_layer_specs(
    layers: KVLayers, block_size: int, dtype: str, tensor_parallel: int, max_model_len: int | None
) -> tuple[KVCacheSpec, ...]:
    """`layer_specs` for checked arguments (a short KV dtype name), memoised: the planner asks for the same
    model's specs many times per page. Layers of one type share one spec object."""
    attention = {
        "block_size": block_size,
        "num_kv_heads": layers.kv_heads_per_rank(tensor_parallel),
        "head_size": layers.head_size,
        "dtype": dtype,
    }
    by_type: dict[str, KVCacheSpec] = {}
    for kind in set(layers.layer_types):
        if kind == FULL:
            by_type[kind] = (MLAAttentionSpec if layers.is_mla else FullAttentionSpec)(**attention)
        elif kind == SLIDING:
            by_type[kind] = SlidingWindowSpec(**attention, sliding_window=layers.sliding_window)
        elif kind == CHUNKED:
            by_type[kind] = ChunkedLocalAttentionSpec(
                **attention, attention_chunk_size=layers.attention_chunk_size
            )
        else:
            state = layers.recurrent_state
            by_type[kind] = MambaSpec(
                block_size=max_model_len or block_size,
                shapes=state.state_shapes(tensor_parallel),
                dtype=layers.dtype,
                dtypes=(layers.dtype, state.ssm_dtype or layers.dtype),
            )
    return tuple(by_type[kind] for kind in layers.layer_types)
