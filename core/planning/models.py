"""Model architecture specs for capacity planning, read from Hugging Face `config.json` files.

`ModelSpec.from_hf_config(config)` reads the same fields vLLM reads, with vLLM's fallbacks: the KV head count is
`num_key_value_heads` (or another name a model family uses), else `num_attention_heads` (no GQA); the head size
is the config's explicit `head_dim` when it has one, else `hidden_size // num_attention_heads` (Gemma-2-9B
publishes 256 where hidden/heads would give 224). MLA models (DeepSeek-V2/V3) carry `kv_lora_rank` and
`qk_rope_head_dim`: what they cache is one latent of that width per layer, not K and V per head.

`MODELS` holds the presets, built from the config fields stored in `core/planning/data/models.json` (readable on the
Planner page, and a template for a custom model).
"""

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from core.errors import InvalidArgumentError

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_JSON = DATA_DIR / "models.json"

# Alternative config keys, tried in order (vLLM's ModelConfig reads the same aliases).
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "n_kv_heads")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
_INTERMEDIATE_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
_POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)

# vLLM serves a float32 checkpoint in float16, except for model types known to overflow in float16, which it
# serves in bfloat16 (vllm/config: _FLOAT16_NOT_SUPPORTED_MODELS).
_FP16_UNSAFE_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})
# Dense MLPs without a gate projection (two matrices instead of three).
_UNGATED_MLP_MODEL_TYPES = frozenset(
    {"opt", "gpt2", "gpt_neox", "gptj", "falcon", "bloom", "phi", "starcoder2"}
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


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the planner needs. Counts are integers; `num_params*` are parameter counts.

    For an MLA model `num_kv_heads` is 1 and `head_dim` is `kv_lora_rank + qk_rope_head_dim` (the latent it
    caches per layer), as vLLM reports them.

    Invariants: every count >= 1; `num_kv_heads <= num_attention_heads`; `num_params_active <= num_params`
    (equal for a dense model); `is_mla` iff `kv_lora_rank` and `qk_rope_head_dim` are both set.
    `dtype` is the checkpoint's `torch_dtype` ("float32", "float16" or "bfloat16"); `quantization` is the
    checkpoint's `quantization_config.quant_method` (e.g. "fp8", "awq") or None.
    `embedding_params` / `lm_head_params` (0 when tied to the embedding) are the parameters outside the
    decoder layers, used to size the first and last pipeline stages.
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
        `params_estimated` is True. Raises `InvalidArgumentError` naming the missing or bad field.
        """
        if not isinstance(config, dict):
            raise InvalidArgumentError(f"a config.json must be a JSON object, got {type(config).__name__}")
        cfg = dict(config)
        text = cfg.get("text_config")
        if isinstance(text, dict):
            merged = {k: v for k, v in cfg.items() if k != "text_config"}
            merged.update(text)
            cfg = merged

        num_layers = _read_int(cfg, _LAYER_KEYS, "number of layers")
        num_heads = _read_int(cfg, _HEAD_KEYS, "number of attention heads")
        hidden = _read_int(cfg, _HIDDEN_KEYS, "hidden size")
        kv_heads = _read_int(cfg, _KV_HEAD_KEYS, "number of KV heads", default=None)
        if kv_heads is None:
            # Falcon's multi_query flag means a single KV head; otherwise no GQA: one KV head per query head.
            kv_heads = 1 if cfg.get("multi_query") is True else num_heads
        if kv_heads > num_heads:
            raise InvalidArgumentError(
                f"num_key_value_heads ({kv_heads}) exceeds num_attention_heads ({num_heads})"
            )
        head_dim = _read_int(cfg, ("head_dim",), "head_dim", default=None)
        if head_dim is None:
            if hidden % num_heads:
                raise InvalidArgumentError(
                    f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}; the config must "
                    "give head_dim explicitly"
                )
            head_dim = hidden // num_heads
        intermediate = _read_int(cfg, _INTERMEDIATE_KEYS, "intermediate size", default=4 * hidden)
        vocab = _read_int(cfg, ("vocab_size", "padded_vocab_size"), "vocab_size")
        max_positions = _read_int(cfg, _POSITION_KEYS, "max_position_embeddings", default=2048)

        sliding_window = cfg.get("sliding_window")
        if (
            cfg.get("use_sliding_window") is False
            or not isinstance(sliding_window, int)
            or sliding_window < 1
        ):
            sliding_window = None
        kv_lora_rank = _read_int(cfg, ("kv_lora_rank",), "kv_lora_rank", default=None)
        rope_dim = _read_int(cfg, ("qk_rope_head_dim",), "qk_rope_head_dim", default=None)
        if (kv_lora_rank is None) != (rope_dim is None):
            raise InvalidArgumentError("an MLA config needs both kv_lora_rank and qk_rope_head_dim")
        if kv_lora_rank is not None:
            # What an MLA layer caches is one "head" of width kv_lora_rank + qk_rope_head_dim (vLLM's
            # get_head_size / get_num_kv_heads for MLA), shared by all query heads.
            kv_heads, head_dim = 1, kv_lora_rank + rope_dim

        raw_dtype = cfg.get("torch_dtype", cfg.get("dtype", "float16"))
        dtype = _DTYPE_NAMES.get(str(raw_dtype).replace("torch.", "").lower())
        if dtype is None:
            raise InvalidArgumentError(
                f"torch_dtype {raw_dtype!r} is not supported; allowed: float32, float16, bfloat16"
            )
        quant = cfg.get("quantization_config")
        quantization, quantization_bits = None, None
        if isinstance(quant, dict):
            quantization = str(quant.get("quant_method", "unknown")).lower()
            bits = quant.get("bits", quant.get("w_bit"))
            if isinstance(bits, int) and bits > 0:
                quantization_bits = bits
            elif quantization == "fp8":
                quantization_bits = 8

        num_experts = _read_int(
            cfg,
            ("num_local_experts", "n_routed_experts", "num_experts"),
            "number of experts",
            default=0,
            minimum=0,
        )
        experts_per_tok = _read_int(
            cfg, ("num_experts_per_tok",), "num_experts_per_tok", default=0, minimum=0
        )
        tie = bool(cfg.get("tie_word_embeddings", True))  # PretrainedConfig default
        model_type = str(cfg.get("model_type", "unknown"))

        estimate = estimate_num_params(cfg)
        total = estimate["total"] if num_params is None else num_params
        if num_params_active is not None:
            active = num_params_active
        elif num_experts:
            active = total * estimate["active"] / estimate["total"]
        else:
            active = total
        if not (isinstance(total, int | float) and math.isfinite(total) and total >= 1):
            raise InvalidArgumentError(f"num_params must be a positive number, got {total!r}")
        if not (isinstance(active, int | float) and 1 <= active <= total):
            raise InvalidArgumentError(f"num_params_active must be between 1 and num_params, got {active!r}")

        return cls(
            name=name or str(cfg.get("_name_or_path") or model_type),
            num_layers=num_layers,
            num_attention_heads=num_heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=intermediate,
            vocab_size=vocab,
            num_params=round(total),
            num_params_active=round(active),
            max_position_embeddings=max_positions,
            sliding_window=sliding_window,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope_dim,
            model_type=model_type,
            dtype=dtype,
            quantization=quantization,
            quantization_bits=quantization_bits,
            num_experts=num_experts,
            num_experts_per_tok=experts_per_tok,
            tie_word_embeddings=tie,
            embedding_params=estimate["embedding"],
            lm_head_params=estimate["lm_head"],
            params_estimated=num_params is None,
            hf_repo=hf_repo,
        )


def _read_int(
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


def estimate_num_params(config: dict[str, Any]) -> dict[str, int]:
    """Parameter count from a config's shapes: {"total", "active", "embedding", "lm_head"}.

    Counts every weight matrix, bias and norm of the decoder (Llama/Mistral/Qwen2/Gemma-2/Phi-3 with a gated
    MLP, OPT-style with an ungated one and biases, Mixtral-style and DeepSeek-style MoE, MLA attention), the
    token (and learned position) embedding, and the LM head unless tied. Multi-token-prediction modules
    (DeepSeek-V3's `num_nextn_predict_layers`) are not part of the served model and are not counted.
    "active" counts only `num_experts_per_tok` routed experts per MoE layer. Within ~1% of published counts
    for the presets (tests/test_models.py).
    """
    cfg = config
    layers = _read_int(cfg, _LAYER_KEYS, "number of layers")
    heads = _read_int(cfg, _HEAD_KEYS, "number of attention heads")
    hidden = _read_int(cfg, _HIDDEN_KEYS, "hidden size")
    kv_heads = _read_int(cfg, _KV_HEAD_KEYS, "number of KV heads", default=None) or heads
    head_dim = _read_int(cfg, ("head_dim",), "head_dim", default=None) or hidden // heads
    inter = _read_int(cfg, _INTERMEDIATE_KEYS, "intermediate size", default=4 * hidden)
    vocab = _read_int(cfg, ("vocab_size", "padded_vocab_size"), "vocab_size")
    model_type = str(cfg.get("model_type", "unknown"))
    biased = model_type == "opt" and bool(cfg.get("enable_bias", True))
    qkv_bias = biased or model_type == "qwen2" or bool(cfg.get("attention_bias", False))
    o_bias = biased or (bool(cfg.get("attention_bias", False)) and model_type != "qwen2")
    ungated = model_type in _UNGATED_MLP_MODEL_TYPES
    norm = 2 * hidden if model_type == "opt" else hidden  # LayerNorm has a bias, RMSNorm does not
    norms_per_layer = 4 if model_type in ("gemma2", "gemma3", "gemma3_text") else 2

    # Attention.
    kv_lora = cfg.get("kv_lora_rank")
    if kv_lora:
        q_lora = cfg.get("q_lora_rank")
        rope = int(cfg["qk_rope_head_dim"])
        nope = int(cfg.get("qk_nope_head_dim", 128))
        v_dim = int(cfg.get("v_head_dim", 128))
        q_dim = heads * (nope + rope)
        attn = (hidden * q_lora + q_lora + q_lora * q_dim) if q_lora else hidden * q_dim
        attn += (
            hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim) + heads * v_dim * hidden
        )
    else:
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
        if qkv_bias:
            attn += q_out + 2 * kv_out
        if o_bias:
            attn += hidden

    def mlp(width: int) -> int:
        if ungated:
            return 2 * hidden * width + ((width + hidden) if biased else 0)
        return 3 * hidden * width

    # MLP / experts.
    routed = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    per_tok = int(cfg.get("num_experts_per_tok") or 0)
    total_layers = active_layers = 0
    if routed:
        expert_width = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0)
        dense_first = int(cfg.get("first_k_dense_replace") or 0)
        router = hidden * routed + (routed if model_type.startswith("deepseek_v3") else 0)
        moe_common = attn + norms_per_layer * norm + router + shared * mlp(expert_width)
        dense_layer = attn + norms_per_layer * norm + mlp(inter)
        moe_layers = layers - dense_first
        total_layers = dense_first * dense_layer + moe_layers * (moe_common + routed * mlp(expert_width))
        active_layers = dense_first * dense_layer + moe_layers * (moe_common + per_tok * mlp(expert_width))
    else:
        total_layers = active_layers = layers * (attn + norms_per_layer * norm + mlp(inter))

    embedding = vocab * hidden
    if model_type == "opt":
        embedding += (
            int(cfg.get("max_position_embeddings", 2048)) + 2
        ) * hidden  # learned positions, offset 2
    lm_head = 0 if cfg.get("tie_word_embeddings", True) else vocab * hidden
    outside = embedding + lm_head + norm  # final norm
    return {
        "total": total_layers + outside,
        "active": active_layers + outside,
        "embedding": embedding,
        "lm_head": lm_head,
    }


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


def get_model(slug: str) -> ModelSpec:
    """The preset named `slug`; raises `InvalidArgumentError` listing the known slugs."""
    try:
        return MODELS[slug]
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"unknown model {slug!r}; known: {', '.join(MODELS)}") from None
