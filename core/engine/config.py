"""The architecture of a Llama-family decoder (Llama, Mistral, Qwen2) as read from a Hugging Face `config.json`.

Only what the forward pass needs is kept. Every supported variation is explicit: grouped-query attention
(`num_kv_heads` <= `num_heads`), RoPE with its scaling ("default", "linear", "llama3"), RMSNorm, tied or untied
embeddings, biases on the q/k/v projections (Qwen2) read from the weights, and a sliding window on every layer
(Mistral) or on some layers only (Qwen2's `layer_types` / `max_window_layers`). Which layer slides, the KV head
count and the head size are read by `core.kv.hf_config.read_kv_layers`, the one reader the planner uses too.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from core.errors import InvalidArgumentError, ModelLoadError
from core.kv.hf_config import FULL, SLIDING, KVLayers, read_kv_layers
from core.kv.model_shape import ModelShape, read_model_shape

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_ARCH_MODEL_TYPES = {arch: model_type for model_type, arch in _MODEL_TYPES.items()}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
LAYER_TYPES = (FULL, SLIDING)  # the layer types this engine runs
# The one tiny Llama config of the lab (random weights, no tokenizer): the Engine page's "tiny" model, the
# sharing measurement's model and the engine tests' model. Vocabulary 512 (the page's example prompts use ids
# up to 400), 512 positions (sizes a default pool of 256 x 512 tokens).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and constants of the model. head_dim * num_heads need not equal hidden_size (explicit head_dim).

    rope_scaling: None, or a dict with "rope_type" in SUPPORTED_ROPE_TYPES and that type's parameters
    ("factor"; for "llama3" also "low_freq_factor", "high_freq_factor", "original_max_position_embeddings").
    sliding_window: None (full attention) or the number of most recent tokens each query of a sliding-attention
        layer attends to (itself included).
    layer_types: one of LAYER_TYPES per layer, as transformers' `layer_types`; empty (when built directly)
        means every layer is "sliding_attention" when sliding_window is set, else "full_attention" (Mistral),
        and is filled in so. `kv_layers` gives them to `core.kv` (`layer_specs`).
    eos_token_ids: the ids that end a sequence (empty when the config names none).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    hidden_act: str = "silu"
    layer_types: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.layer_types:
            kind = FULL if self.sliding_window is None else SLIDING
            object.__setattr__(self, "layer_types", (kind,) * self.num_layers)
        if len(self.layer_types) != self.num_layers or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ModelLoadError(
                f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the {self.num_layers} "
                f"layers, got {list(self.layer_types)}"
            )
        if SLIDING in self.layer_types and self.sliding_window is None:
            raise ModelLoadError(
                "layer_types has sliding_attention layers but the config sets no sliding_window"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"rope scaling type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        if self.hidden_act != "silu":
            raise ModelLoadError(f"hidden_act {self.hidden_act!r} is not supported; supported: 'silu'")

    @property
    def kv_layers(self) -> KVLayers:
        """The layers as `core.kv` sees them (`layer_specs(config, ...)` gives one KV cache spec per layer)."""
        return KVLayers(
            name=self.architecture,
            layer_types=self.layer_types,
            num_attention_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_dim,
            dtype=self.torch_dtype if self.torch_dtype in _DTYPES else "float32",
            sliding_window=self.sliding_window if SLIDING in self.layer_types else None,
        )

    @property
    def shape(self) -> ModelShape:
        """The facts this config shares with the planner's `ModelSpec` (`core.kv.model_shape` maps the field
        names of both): `ModelSpec.from_model_config(self).shape` equals this."""
        return ModelShape(
            num_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            layer_types=self.layer_types,
            sliding_window=self.sliding_window if SLIDING in self.layer_types else None,
        )

    def to_hf_config(self) -> dict:
        """This config as a Hugging Face config dict (transformers 4 keys): `from_dict` reads it back equal."""
        raw = {
            "architectures": [self.architecture],
            "model_type": _ARCH_MODEL_TYPES[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None if self.rope_scaling is None else dict(self.rope_scaling),
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "sliding_window": self.sliding_window,
            "use_sliding_window": SLIDING in self.layer_types,  # Qwen2 reads its layer_types only when set
            "layer_types": list(self.layer_types),
            "torch_dtype": self.torch_dtype,
            "hidden_act": self.hidden_act,
        }
        if self.eos_token_ids:
            raw["eos_token_id"] = list(self.eos_token_ids)
        return raw

    @property
    def checkpoint_dtype(self) -> torch.dtype:
        return _DTYPES.get(self.torch_dtype, torch.float32)

    def inv_freq(self) -> torch.Tensor:
        """[head_dim // 2] float32 RoPE inverse frequencies, scaled as transformers scales them."""
        dim = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        params = self.rope_scaling or {}
        rope_type = params.get("rope_type", "default")
        if rope_type == "linear":
            inv = inv / float(params["factor"])
        elif rope_type == "llama3":
            factor = float(params["factor"])
            low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
            old_len = float(params["original_max_position_embeddings"])
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
            inv = torch.where(medium, smoothed, scaled)
        return inv

    def weight_names(self) -> list[str]:
        """Every weight the forward pass needs, by its Hugging Face name (biases are optional, not listed)."""
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.tie_word_embeddings:
            names.append("lm_head.weight")
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            names += [p + f"self_attn.{x}_proj.weight" for x in ("q", "k", "v", "o")]
            names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        return names

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        """Read a Hugging Face config dict (transformers 4 `rope_scaling` + `rope_theta`, or 5 `rope_parameters`).

        Raises ModelLoadError naming the unsupported architecture, setting or missing key.
        """
        archs = raw.get("architectures") or [_MODEL_TYPES.get(raw.get("model_type", ""), "")]
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs} (model_type {raw.get('model_type')!r}); supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            if "intermediate_size" not in raw:  # a Llama MLP has no fallback width (the planner's 4 x hidden)
                raise KeyError("intermediate_size")
            cfg = {**raw, "model_type": raw.get("model_type") or _ARCH_MODEL_TYPES[arch]}
            kv = read_kv_layers(cfg)  # layer types (Qwen2: max_window_layers, use_sliding_window), KV heads
            shape = read_model_shape(cfg, kv)  # the facts the planner reads too, by the same function
            rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
            theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
            if "type" in rope and "rope_type" not in rope:
                rope["rope_type"] = rope.pop("type")
            eos = raw.get("eos_token_id")
            eos_ids = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
            return cls(
                architecture=arch,
                vocab_size=shape.vocab_size,
                hidden_size=shape.hidden_size,
                intermediate_size=shape.intermediate_size,
                num_layers=shape.num_layers,
                num_heads=shape.num_attention_heads,
                num_kv_heads=shape.num_kv_heads,
                head_dim=shape.head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
                max_position_embeddings=shape.max_position_embeddings,
                tie_word_embeddings=shape.tie_word_embeddings,
                attention_bias=bool(raw.get("attention_bias", arch == "Qwen2ForCausalLM")),
                sliding_window=shape.sliding_window,
                eos_token_ids=eos_ids,
                torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
                hidden_act=str(raw.get("hidden_act", "silu")),
                layer_types=shape.layer_types,
            )
        except InvalidArgumentError as bad:
            raise ModelLoadError(f"config.json: {bad}") from None
        except KeyError as missing:
            raise ModelLoadError(f"config.json has no {missing.args[0]!r}, which a {arch} needs") from None
        except (TypeError, ValueError) as bad:
            raise ModelLoadError(f"config.json has a malformed value: {bad}") from None

    @classmethod
    def from_directory(cls, path: str | Path) -> "ModelConfig":
        """Read `path/config.json`; raises ModelLoadError when it is missing or not JSON."""
        file = Path(path) / "config.json"
        if not Path(path).is_dir():
            raise ModelLoadError(f"model directory {str(path)!r} does not exist or is not a directory")
        if not file.is_file():
            raise ModelLoadError(f"{str(path)!r} has no config.json (a Hugging Face model directory has one)")
        try:
            raw = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ModelLoadError(f"{file} is not readable JSON: {err}") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{file} must hold a JSON object")
        return cls.from_dict(raw)
