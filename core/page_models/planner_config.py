"""A custom model's config.json on the Planner page: parsing pasted or uploaded text, the fields the planner
reads, and the compact URL-safe encoding a custom model travels in (`encode_config` / `decode_config`).

Every function raises `InvalidArgumentError` (a `LabError`) with the reason for bad input.
"""

import base64
import binascii
import json
import zlib
from typing import Any

from core.errors import InvalidArgumentError, LabError
from core.planning.catalog.models import ModelSpec
from core.uploads import parse_json, upload_text

MAX_CONFIG_CHARS = 200_000  # a pasted or uploaded config.json
MAX_CONFIG_BYTES = 64 * 1024  # a decoded config from the URL
_CONFIG_ERRORS = (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError)


def config_from_text(text: str) -> dict[str, Any]:
    """Parse a pasted config.json into a dict; raises InvalidArgumentError (with the JSON error's position)
    for empty, oversized, malformed, too deeply nested or non-object text."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError("paste or upload a Hugging Face config.json for the custom model")
    if len(text) > MAX_CONFIG_CHARS:
        raise InvalidArgumentError(
            f"the config.json has {len(text):,} characters; at most {MAX_CONFIG_CHARS:,} are accepted"
        )
    config = parse_json(text, "config.json")
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"config.json must be a JSON object, not a JSON {type(config).__name__}")
    return config


def config_from_bytes(data: bytes) -> dict[str, Any]:
    """Parse an uploaded config.json (UTF-8 text); oversized (over 4 x MAX_CONFIG_CHARS bytes), empty,
    compressed, binary or non-UTF-8 files are refused (`core.uploads.upload_text`). The caller checks the
    operator's upload limit before reading the file (`core.uploads.read_upload`)."""
    text = upload_text(
        data, "the uploaded config.json", "a Hugging Face config.json", max_bytes=4 * MAX_CONFIG_CHARS
    )
    return config_from_text(text)


_KEPT_FIELDS = {
    "model_type",
    "torch_dtype",
    "dtype",
    "hidden_size",
    "n_embd",
    "d_model",
    "num_attention_heads",
    "n_head",
    "num_heads",
    "n_heads",
    "num_key_value_heads",
    "n_head_kv",
    "num_kv_heads",
    "multi_query_group_num",
    "multi_query",
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "n_layers",
    "head_dim",
    "intermediate_size",
    "ffn_dim",
    "n_inner",
    "moe_intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "sliding_window",
    "use_sliding_window",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "num_local_experts",
    "n_routed_experts",
    "num_experts",
    "num_experts_per_tok",
    "n_shared_experts",
    "first_k_dense_replace",
    "tie_word_embeddings",
    "attention_bias",
    "enable_bias",
    "quantization_config",
    "_name_or_path",
    "layer_types",
    "sliding_window_pattern",
    "max_window_layers",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "interleave_moe_layer_step",
    "intermediate_size_mlp",
    "full_attention_interval",
    "attn_layer_indices",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "shared_expert_intermediate_size",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_n_groups",
    "mamba_ssm_dtype",
    "experts_per_token",
    "attn_output_gate",
}


def compact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of a config.json that the planner reads (what goes into the URL)."""
    out = {k: v for k, v in config.items() if k in _KEPT_FIELDS}
    if isinstance(config.get("text_config"), dict):
        out["text_config"] = compact_config(config["text_config"])
    if isinstance(out.get("quantization_config"), dict):
        q = out["quantization_config"]
        out["quantization_config"] = {
            k: q[k]
            for k in (
                "quant_method",
                "bits",
                "w_bit",
                "group_size",
                "q_group_size",
                "modules_to_not_convert",
                "ignore",
                "config_groups",
            )
            if k in q
        }
    return out


def encode_config(config: dict[str, Any]) -> str:
    """The compacted config as a URL-safe string: sorted compact JSON, zlib level 9, base64url without '='."""
    raw = json.dumps(compact_config(config), separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def decode_config(text: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Inverse of `encode_config`; raises InvalidArgumentError for anything malformed, not an object, or
    inflating past `max_bytes` (a zip bomb stops there)."""
    reason = "it is not an encoded configuration"
    try:
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, max_bytes + 1)
        if len(raw) > max_bytes or inflater.unconsumed_tail:
            reason = f"it decodes to more than {max_bytes:,} bytes"
            raise ValueError(reason)
        config = json.loads(raw)
    except (binascii.Error, zlib.error, UnicodeDecodeError, RecursionError, TypeError, ValueError):
        raise InvalidArgumentError(f"the custom model in the URL cannot be read: {reason}") from None
    if not isinstance(config, dict):
        raise InvalidArgumentError(f"the custom model in the URL cannot be read: {reason}")
    return config


def model_from_config(config: dict[str, Any]) -> ModelSpec:
    """`ModelSpec.from_hf_config`, with any wrongly typed field reported as InvalidArgumentError."""
    name = config.get("_name_or_path")
    try:
        return ModelSpec.from_hf_config(
            config, name=name if isinstance(name, str) and name else "custom model"
        )
    except LabError:
        raise
    except _CONFIG_ERRORS as error:
        raise InvalidArgumentError(f"config.json has a field of the wrong type or size: {error}") from None
