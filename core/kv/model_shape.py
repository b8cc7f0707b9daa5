"""One model vocabulary: the facts of a decoder's shape that the engine's `ModelConfig` and the planner's
`ModelSpec` share, read from a Hugging Face `config.json` by one function, `read_model_shape`.

`core.engine.config.ModelConfig.from_dict` and `core.planning.catalog.models.ModelSpec.from_hf_config` both read their
shared facts here (and nowhere else); each reads only what is its own beside them (the engine: architecture,
RoPE, norms, biases, EOS ids, the dtype it computes in; the planner: parameter counts, quantization, experts,
MLA, chunked and linear-attention layers). Both give their shared facts back as a `ModelShape` (`.shape`), so
the two views of one model can be compared fact by fact, and `ModelSpec.from_model_config` plans an engine
model from the engine's own config.

The mapping, once (the public field names of both classes stay as they are):

    fact                  config.json key (aliases, fallback)                        ModelShape / ModelSpec / ModelConfig
    layers                num_hidden_layers (n_layer, num_layers, n_layers)          num_layers / num_layers / num_layers
    query heads           num_attention_heads (n_head, num_heads, n_heads)           num_attention_heads / num_attention_heads / num_heads
    KV heads              num_key_value_heads (... , else the query heads)           num_kv_heads / num_kv_heads / num_kv_heads
    head size             head_dim (else hidden_size // num_attention_heads)         head_dim / head_dim / head_dim
    hidden size           hidden_size (n_embd, d_model, dim)                         hidden_size (all three)
    MLP width             intermediate_size (ffn_dim, n_inner, ffn_hidden_size;      intermediate_size (all three; the
                          else 4 x hidden)                                           engine requires the key)
    vocabulary            vocab_size (padded_vocab_size)                             vocab_size (all three)
    context               max_position_embeddings (n_positions, ...; else 2048)      max_position_embeddings (all three)
    tied LM head          tie_word_embeddings (else the family's transformers        tie_word_embeddings (all three)
                          default: False for Llama, Mistral, Qwen, Phi-3, ...)
    layer kinds           layer_types, or the family's rule (`read_layer_types`)     layer_types / layer_kinds / layer_types
    sliding window        sliding_window (None when no layer slides)                 sliding_window (all three)

Not shared: the dtype. The engine keeps the checkpoint's `torch_dtype` and computes in it (float32 when the
config names none, as transformers loads it); the planner keeps the checkpoint's dtype too but serves in
`ModelSpec.compute_dtype`, as vLLM does.
"""

from dataclasses import dataclass
from typing import Any

from core.errors import InvalidArgumentError
from core.kv.hf_config import (
    HIDDEN_KEYS,
    LAYER_TYPES,
    KVLayers,
    language_config,
    read_int,
    read_kv_layers,
)

# Alternative config keys, tried in order (vLLM's ModelConfig reads the same aliases).
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size")
DEFAULT_MAX_POSITIONS = 2048
# Model types whose transformers config class defaults tie_word_embeddings to False (transformers 5.23:
# `CONFIG_MAPPING[model_type]().tie_word_embeddings`); any other type takes PretrainedConfig's True.
UNTIED_MODEL_TYPES = frozenset(
    {
        "llama",
        "llama4",
        "llama4_text",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "phi",
        "phi3",
        "deepseek_v2",
        "deepseek_v3",
        "gpt_oss",
        "gpt_neox",
    }
)


@dataclass(frozen=True)
class ModelShape:
    """The shared facts of one model (see the module docstring for where each comes from). Invariants:
    `layer_types` has one entry of LAYER_TYPES per layer; `sliding_window` is set iff a layer slides."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= set(LAYER_TYPES):
            raise InvalidArgumentError(
                f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the {self.num_layers} layers"
            )


def read_tie_word_embeddings(cfg: dict[str, Any]) -> bool:
    """`tie_word_embeddings`, else the default of the config's family (`UNTIED_MODEL_TYPES`: False)."""
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        return str(cfg.get("model_type", "")) not in UNTIED_MODEL_TYPES
    return bool(tied)


def read_model_shape(config: Any, kv: KVLayers | None = None) -> ModelShape:
    """The `ModelShape` of a Hugging Face config dict (a multimodal one read from its `text_config`), with
    vLLM's aliases and fallbacks; `kv`: the config's `read_kv_layers`, when the caller has it already. Raises
    `InvalidArgumentError` naming the missing or bad field."""
    cfg = language_config(config)
    kv = read_kv_layers(cfg) if kv is None else kv
    hidden = read_int(cfg, HIDDEN_KEYS, "hidden size")
    return ModelShape(
        num_layers=kv.num_layers,
        num_attention_heads=kv.num_attention_heads,
        num_kv_heads=kv.num_kv_heads,
        head_dim=kv.head_size,
        hidden_size=hidden,
        intermediate_size=read_int(cfg, INTERMEDIATE_KEYS, "intermediate size", default=4 * hidden),
        vocab_size=read_int(cfg, VOCAB_KEYS, "vocab_size"),
        max_position_embeddings=read_int(
            cfg, POSITION_KEYS, "max_position_embeddings", default=DEFAULT_MAX_POSITIONS
        ),
        tie_word_embeddings=read_tie_word_embeddings(cfg),
        layer_types=kv.layer_types,
        sliding_window=kv.sliding_window,
    )
