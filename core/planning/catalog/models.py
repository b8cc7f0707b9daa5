"""Model architecture specs for capacity planning, read from Hugging Face `config.json` files.

`ModelSpec.from_hf_config(config)` reads the same fields vLLM reads, with vLLM's fallbacks: the KV head count is
`num_key_value_heads` (or another name a model family uses), else `num_attention_heads` (no GQA); the head size
is the config's explicit `head_dim` when it has one, else `hidden_size // num_attention_heads` (Gemma-2-9B
publishes 256 where hidden/heads would give 224). MLA models (DeepSeek-V2/V3) carry `kv_lora_rank` and
`qk_rope_head_dim`: what they cache is one latent of that width per layer, not K and V per head.

`MODELS` holds the presets, built from the config fields stored in `core/planning/catalog/data/models.json` (readable on the
Planner page, and a template for a custom model).
"""

import json
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from core.errors import InvalidArgumentError
from core.kv.hf_config import (
    FULL,
    LINEAR,
    KVLayers,
    RecurrentStateSpec,
    language_config,
    read_int,
    read_kv_layers,
    read_recurrent_state,
)
from core.kv.model_shape import ModelShape, read_model_shape
from core.planning.catalog.layer_structure import PLAIN_LAYERS, LayerStructure, read_layer_structure
from core.planning.catalog.quantization import read_quantization

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_JSON = DATA_DIR / "models.json"

# vLLM serves a float32 checkpoint in float16, except for model types known to overflow in float16, which it
# serves in bfloat16 (vllm/config: _FLOAT16_NOT_SUPPORTED_MODELS).
_FP16_UNSAFE_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})
# An MLA config's qk_nope_head_dim / v_head_dim when it leaves them out (DeepSeek-V2/V3's and Kimi-K2's value).
MLA_HEAD_DIM_DEFAULT = 128
# Dense MLPs without a gate projection (two matrices instead of three).
_UNGATED_MLP_MODEL_TYPES = frozenset(
    {"opt", "gpt2", "gpt_neox", "gptj", "falcon", "bloom", "phi", "starcoder2"}
)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the planner needs. Counts are integers; `num_params*` are parameter counts.

    For an MLA model `num_kv_heads` is 1 and `head_dim` is `kv_lora_rank + qk_rope_head_dim` (the latent it
    caches per layer), as vLLM reports them.

    Invariants: every count >= 1; `num_kv_heads <= num_attention_heads`; `num_params_active <= num_params`
    (equal for a dense model); `is_mla` iff `kv_lora_rank` and `qk_rope_head_dim` are both set.
    `dtype` is the checkpoint's `torch_dtype` ("float32", "float16" or "bfloat16"); `quantization` is the
    checkpoint's `quantization_config.quant_method` (e.g. "fp8", "awq", "mxfp4") or None, with its bits, group
    size (one scale per that many weights), the module patterns it leaves unquantized and, for block-scaled FP8
    (`weight_block_size`, e.g. (128, 128): one scale per block of a weight matrix), its block shape
    (`quantization_block`, () when the weights are not block-scaled: which MoE kernels vLLM may run,
    `core.planning.cost.expert_rows`); `core.planning.catalog.quantization` reads them.
    `embedding_params` / `lm_head_params` (0 when tied to the embedding) are the parameters outside the
    decoder layers, used to size the first and last pipeline stages; `expert_params` / `attention_params` are
    the routed-expert and attention parameters of all layers, from the shapes.
    `layer_types` has one entry of LAYER_TYPES per layer, or is empty, meaning every layer is full attention
    (`layer_kinds` always has one per layer). `sliding_window` is set iff a layer slides,
    `attention_chunk_size` iff a layer is chunked, `recurrent_state` iff a layer is linear attention.
    `checkpoint_bytes` is the exact size of the stored weights (a safetensors index's `metadata.total_size`)
    when known, else None. `qk_nope_head_dim` / `v_head_dim` (MLA only, else None): the per-head widths the latent
    is up-projected to (query-key without rotary embedding, V; `core.planning.cost.step_time.mla_attention_flops`).
    `layer_structure`: q/k norms, shared experts, an MoE model's dense layers (`core.planning.catalog.layer_structure`).
    """

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    num_params_active: int
    max_position_embeddings: int
    sliding_window: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    model_type: str = "llama"
    dtype: str = "bfloat16"
    quantization: str | None = None
    quantization_bits: int | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    tie_word_embeddings: bool = False
    embedding_params: int = 0
    lm_head_params: int = 0
    params_estimated: bool = False
    hf_repo: str | None = None
    quantization_group_size: int | None = None
    quantization_skips: tuple[str, ...] = ()
    expert_params: int = 0
    attention_params: int = 0
    layer_types: tuple[str, ...] = ()
    attention_chunk_size: int | None = None
    recurrent_state: RecurrentStateSpec | None = None
    checkpoint_bytes: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    layer_structure: LayerStructure = PLAIN_LAYERS
    quantization_block: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise InvalidArgumentError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers; give one per layer"
            )
        self.kv_layers  # noqa: B018 (validates the layer types, windows and state)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The type of every layer (LAYER_TYPES), full attention where `layer_types` is empty."""
        return self.layer_types or (FULL,) * self.num_layers

    @cached_property
    def kv_layers(self) -> KVLayers:
        """What the KV cache depends on (`core.kv.hf_config.KVLayers`), in the compute dtype."""
        return KVLayers(
            name=self.name,
            layer_types=self.layer_kinds,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_dim,
            dtype=self.compute_dtype,
            is_mla=self.is_mla,
            sliding_window=self.sliding_window,
            attention_chunk_size=self.attention_chunk_size,
            recurrent_state=self.recurrent_state,
        )

    @property
    def is_hybrid(self) -> bool:
        """True when the layers are not all of one type (vLLM's hybrid KV cache manager then groups them)."""
        return len(set(self.layer_kinds)) > 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None and self.qk_rope_head_dim is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def compute_dtype(self) -> str:
        """The dtype vLLM computes in (and caches KV in under `kv_cache_dtype=auto`): "float16" or "bfloat16".

        float32 checkpoints are served in float16 (bfloat16 for Gemma-2/3-like models that overflow in
        float16); FP8-quantized checkpoints compute in their `torch_dtype` (bfloat16 for DeepSeek-V3).
        """
        if self.dtype == "float32":
            return "bfloat16" if self.model_type in _FP16_UNSAFE_MODEL_TYPES else "float16"
        return self.dtype

    @property
    def layer_params(self) -> float:
        """Parameters of one decoder layer on average (total minus embedding and LM head, over layers)."""
        return max(0, self.num_params - self.embedding_params - self.lm_head_params) / self.num_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def shape(self) -> ModelShape:
        """The facts this spec shares with the engine's `ModelConfig` (`core.kv.model_shape`, which maps the
        field names of both): for a config both read, `ModelConfig.from_dict(c).shape` equals this."""
        return ModelShape(
            num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            layer_types=self.layer_kinds,
            sliding_window=self.sliding_window,
        )

    @classmethod
    def from_model_config(
        cls, config: Any, name: str | None = None, num_params: float | None = None
    ) -> "ModelSpec":
        """The spec of an engine model (`core.engine.config.ModelConfig`, read through its `to_hf_config()`, the
        config.json it was read from, so the planner reads it with `from_hf_config`'s one parser); `name`
        defaults to its architecture. Its `.shape` equals the config's."""
        return cls.from_hf_config(
            config.to_hf_config(), name=name or config.architecture, num_params=num_params
        )

    @classmethod
    def from_hf_config(
        cls,
        config: dict[str, Any],
        name: str | None = None,
        num_params: float | None = None,
        num_params_active: float | None = None,
        hf_repo: str | None = None,
    ) -> "ModelSpec":
        """Build a spec from a Hugging Face `config.json` (already parsed into a dict).

        Multimodal configs that nest the language model under `text_config` are read from there. When
        `num_params` is not given it is estimated from the shapes (`estimate_num_params`) and
        `params_estimated` is True. Per-layer attention types follow `read_layer_types`. Raises
        `InvalidArgumentError` naming the missing or bad field.
        """
        cfg = language_config(config)
        kv = read_kv_layers(cfg, name)
        shape = read_model_shape(cfg, kv)
        quantization = read_quantization(cfg)
        num_experts, experts_per_tok = _read_experts(cfg)
        estimate = estimate_num_params(cfg, shape)
        total, active = _param_counts(estimate, num_params, num_params_active, bool(num_experts))
        model_type = str(cfg.get("model_type", "unknown"))
        return cls(
            name=kv.name,
            num_layers=shape.num_layers,
            num_attention_heads=shape.num_attention_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            vocab_size=shape.vocab_size,
            max_position_embeddings=shape.max_position_embeddings,
            num_params=round(total),
            num_params_active=round(active),
            sliding_window=shape.sliding_window,
            kv_lora_rank=read_int(cfg, ("kv_lora_rank",), "kv_lora_rank", default=None),
            qk_rope_head_dim=read_int(cfg, ("qk_rope_head_dim",), "qk_rope_head_dim", default=None),
            **_mla_head_dims(cfg),
            model_type=model_type,
            dtype=kv.dtype,
            **quantization,
            num_experts=num_experts,
            num_experts_per_tok=experts_per_tok,
            tie_word_embeddings=shape.tie_word_embeddings,
            embedding_params=estimate["embedding"],
            lm_head_params=estimate["lm_head"],
            expert_params=estimate["experts"],
            attention_params=estimate["attention"],
            params_estimated=num_params is None,
            hf_repo=hf_repo,
            layer_types=kv.layer_types,
            attention_chunk_size=kv.attention_chunk_size,
            recurrent_state=kv.recurrent_state,
            layer_structure=read_layer_structure(cfg, shape.num_layers, num_experts),
        )


def _mla_head_dims(cfg: dict[str, Any]) -> dict[str, int]:
    """An MLA config's per-head widths after up-projection (DeepSeek-V2/V3's qk_nope_head_dim and v_head_dim,
    MLA_HEAD_DIM_DEFAULT each when the config leaves them out); {} for any other attention."""
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        name: read_int(cfg, (name,), name, default=MLA_HEAD_DIM_DEFAULT)
        for name in ("qk_nope_head_dim", "v_head_dim")
    }


def _read_experts(cfg: dict[str, Any]) -> tuple[int, int]:
    """(routed experts per MoE layer, experts each token uses); (0, 0) for a dense model."""
    num_experts = read_int(
        cfg,
        ("num_local_experts", "n_routed_experts", "num_experts"),
        "number of experts",
        default=0,
        minimum=0,
    )
    per_tok = read_int(
        cfg, ("num_experts_per_tok", "experts_per_token"), "num_experts_per_tok", default=0, minimum=0
    )
    return num_experts, per_tok


def _param_counts(
    estimate: dict[str, int], num_params: float | None, num_params_active: float | None, moe: bool
) -> tuple[float, float]:
    """(total, active) parameters: the given counts, else the shape estimate (active scaled for MoE)."""
    total = estimate["total"] if num_params is None else num_params
    if num_params_active is not None:
        active = num_params_active
    elif moe:
        active = total * estimate["active"] / estimate["total"]
    else:
        active = total
    if not (isinstance(total, int | float) and math.isfinite(total) and total >= 1):
        raise InvalidArgumentError(f"num_params must be a positive number, got {total!r}")
    if not (isinstance(active, int | float) and 1 <= active <= total):
        raise InvalidArgumentError(f"num_params_active must be between 1 and num_params, got {active!r}")
    return total, active


def estimate_num_params(config: dict[str, Any], shape: ModelShape | None = None) -> dict[str, int]:
    """Parameter count from a config's shapes: {"total", "active", "embedding", "lm_head", "experts",
    "attention"}.

    Counts every weight matrix, bias and norm of the decoder (Llama/Mistral/Qwen2/Gemma-2/Phi-3 with a gated
    MLP, OPT-style with an ungated one and biases, Mixtral-, DeepSeek-, Qwen-, Llama-4- and gpt-oss-style MoE
    with shared experts, MLA attention, Mamba2 / Gated DeltaNet linear attention), the token (and learned
    position) embedding, and the LM head unless tied. Multi-token-prediction modules (DeepSeek-V3's
    `num_nextn_predict_layers`) are not part of the served model and are not counted. "active" counts only
    `num_experts_per_tok` routed experts per MoE layer; "experts" is every routed expert's parameters,
    "attention" every attention (or linear-attention) layer's. Within ~1% of published counts for the presets
    (tests/planning/catalog/test_models.py). `shape`: the config's `read_model_shape`, when the caller has it already.
    """
    cfg = language_config(config)
    shape = read_model_shape(cfg) if shape is None else shape
    layers, hidden, inter = shape.num_layers, shape.hidden_size, shape.intermediate_size
    vocab = shape.vocab_size
    model_type = str(cfg.get("model_type", "unknown"))
    biased = model_type == "opt" and bool(cfg.get("enable_bias", True))
    ungated = model_type in _UNGATED_MLP_MODEL_TYPES
    norm = 2 * hidden if model_type == "opt" else hidden  # LayerNorm has a bias, RMSNorm does not
    norms_per_layer = 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2

    linear_layers = shape.layer_types.count(LINEAR)
    attention = (layers - linear_layers) * _attention_params(cfg, shape)
    if linear_layers:
        attention += linear_layers * _linear_attention_params(read_recurrent_state(cfg, hidden), hidden)

    def mlp(width: int) -> int:
        if ungated:
            return 2 * hidden * width + ((width + hidden) if biased else 0)
        return 3 * hidden * width

    routed = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    per_tok = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
    experts = active_experts = 0
    if routed:
        expert_width = int(cfg.get("moe_intermediate_size") or inter)
        expert = mlp(expert_width) + ((2 * expert_width + hidden) if model_type == "gpt_oss" else 0)
        dense_width = inter
        moe_layers = layers - int(cfg.get("first_k_dense_replace") or 0)
        shared = int(cfg.get("n_shared_experts") or 0) * mlp(expert_width)
        if cfg.get("shared_expert_intermediate_size"):  # Qwen2-MoE / Qwen3-Next: one gated shared expert
            shared = mlp(int(cfg["shared_expert_intermediate_size"])) + hidden
        if model_type.startswith("llama4"):  # one shared expert; MoE every interleave_moe_layer_step layers
            shared = mlp(expert_width)
            moe_layers = layers // int(cfg.get("interleave_moe_layer_step") or 1)
            dense_width = int(cfg.get("intermediate_size_mlp") or inter)
        router = hidden * routed + (routed if model_type.startswith(("deepseek_v3", "gpt_oss")) else 0)
        experts, active_experts = moe_layers * routed * expert, moe_layers * per_tok * expert
        common = moe_layers * (router + shared) + (layers - moe_layers) * mlp(dense_width)
    else:
        common = layers * mlp(inter)
    decoder = attention + layers * norms_per_layer * norm + common

    embedding = vocab * hidden
    if model_type == "opt":
        embedding += (shape.max_position_embeddings + 2) * hidden  # learned positions, offset 2
    lm_head = 0 if shape.tie_word_embeddings else vocab * hidden
    outside = embedding + lm_head + norm  # final norm
    return {
        "total": decoder + experts + outside,
        "active": decoder + active_experts + outside,
        "embedding": embedding,
        "lm_head": lm_head,
        "experts": experts,
        "attention": attention,
    }


def _attention_params(cfg: dict[str, Any], shape: ModelShape) -> int:
    """Parameters of one (full, sliding or chunked) attention layer: standard, GQA or MLA projections."""
    hidden, heads = shape.hidden_size, shape.num_attention_heads
    kv_heads, head_dim = shape.num_kv_heads, shape.head_dim  # MLA: the latent, not used below
    model_type = str(cfg.get("model_type", "unknown"))
    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora:
        q_lora = cfg.get("q_lora_rank")
        rope = int(cfg["qk_rope_head_dim"])
        nope, v_dim = _mla_head_dims(cfg).values()
        q_dim = heads * (nope + rope)
        attn = (hidden * q_lora + q_lora + q_lora * q_dim) if q_lora else hidden * q_dim
        return attn + (
            hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
        )
    biased = model_type == "opt" and bool(cfg.get("enable_bias", True))
    qkv_bias = biased or model_type == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = biased or (bool(cfg.get("attention_bias", False)) and model_type != "qwen2")
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    gate = q_out if cfg.get("attn_output_gate", model_type == "qwen3_next") else 0  # sigmoid output gate
    attn = hidden * (q_out + gate) + 2 * hidden * kv_out + q_out * hidden
    if qkv_bias:
        attn += q_out + 2 * kv_out
    if o_bias:
        attn += hidden
    if model_type == "gpt_oss":
        attn += heads  # attention sinks
    return attn


def _linear_attention_params(state: RecurrentStateSpec, hidden: int) -> int:
    """Parameters of one Mamba2 / Gated DeltaNet layer: input projection (conv channels, output gate and the
    per-head dt (Mamba2) or beta and alpha (GDN)), depthwise conv, per-head constants, norm, output projection."""
    conv_dim = state.inner_size + 2 * state.num_groups * state.state_size
    per_head = state.num_heads * (2 if state.kind == "gated_delta_net" else 1)
    return (
        hidden * (conv_dim + state.inner_size + per_head)
        + conv_dim * state.conv_kernel
        + 3 * state.num_heads
        + state.inner_size
        + state.inner_size * hidden
    )


def load_model_presets(path: Path = MODELS_JSON) -> dict[str, ModelSpec]:
    """Read a presets file ({slug: {"name", "hf_repo", "num_params", ["num_params_active"], "config"}})."""
    raw = json.loads(Path(path).read_text())
    presets: dict[str, ModelSpec] = {}
    for slug, entry in raw.items():
        if slug.startswith("_"):
            continue
        presets[slug] = ModelSpec.from_hf_config(
            entry["config"],
            name=entry.get("name", slug),
            num_params=entry.get("num_params"),
            num_params_active=entry.get("num_params_active"),
            hf_repo=entry.get("hf_repo"),
        )
    return presets


def preset_configs(path: Path = MODELS_JSON) -> dict[str, dict[str, Any]]:
    """The raw preset entries as stored (what the Planner page shows and offers as a config template)."""
    raw = json.loads(Path(path).read_text())
    return {slug: entry for slug, entry in raw.items() if not slug.startswith("_")}


MODELS: dict[str, ModelSpec] = load_model_presets()


# Other names users type for a preset.
_ALIASES = {"mistral-7b-v0.1": "mistral-7b"}


def get_model(slug: str) -> ModelSpec:
    """The preset named `slug`; raises `InvalidArgumentError` listing the known slugs."""
    try:
        return MODELS[_ALIASES.get(slug, slug)]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"unknown model {slug!r}; known: {', '.join(MODELS)}") from None


def model_from_config_file(path: str | Path, num_params: float | None = None) -> ModelSpec:
    """The model a Hugging Face config.json file describes (named after the file), with `num_params` when given
    (else estimated from the shapes). Raises InvalidArgumentError when the file cannot be read or holds no JSON
    object, or for a config the planner cannot read."""
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidArgumentError(f"cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"{path} must hold a JSON object (a Hugging Face config.json)")
    return ModelSpec.from_hf_config(config, name=Path(path).stem, num_params=num_params)
