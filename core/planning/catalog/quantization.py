"""A checkpoint's `quantization_config` as `core.planning.catalog.models.ModelSpec` fields: the method, its bits,
group size, the modules it leaves unquantized and, for block-scaled FP8, the block shape."""

from typing import Any


def read_quantization(cfg: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's `quantization_config` as ModelSpec fields: method, bits, group size, skipped modules.

    mxfp4 (gpt-oss) stores 4-bit values with one 8-bit scale per 32; fp8 is 8 bits (block scales are
    negligible; `weight_block_size` is their block, `quantization_block`); AWQ / GPTQ give `bits` (`w_bit`) and
    `group_size` (`q_group_size`); compressed-tensors gives `config_groups.*.weights.num_bits` / `group_size` and
    an `ignore` list.
    """
    quant = cfg.get("quantization_config")
    fields: dict[str, Any] = {
        "quantization": None,
        "quantization_bits": None,
        "quantization_group_size": None,
        "quantization_skips": (),
        "quantization_block": (),
    }
    if not isinstance(quant, dict):
        return fields
    method = str(quant.get("quant_method", "unknown")).lower()
    bits = quant.get("bits", quant.get("w_bit"))
    group = quant.get("group_size", quant.get("q_group_size"))
    groups = quant.get("config_groups")
    if isinstance(groups, dict) and groups:
        weights = next(iter(groups.values())).get("weights") or {}
        bits, group = weights.get("num_bits", bits), weights.get("group_size", group)
    if method == "mxfp4":
        bits, group = 4, 32
    elif method == "fp8" and not isinstance(bits, int):
        bits = 8
    skips = quant.get("modules_to_not_convert") or quant.get("ignore") or ()
    fields.update(
        quantization=method,
        quantization_bits=bits if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0 else None,
        quantization_group_size=group if isinstance(group, int) and group > 0 else None,
        quantization_skips=tuple(str(s) for s in skips) if isinstance(skips, list | tuple) else (),
        quantization_block=block_shape(quant.get("weight_block_size")),
    )
    return fields


def block_shape(value: Any) -> tuple[int, ...]:
    """A `weight_block_size` as a tuple of positive ints ((128, 128)); () when absent or not such a list."""
    if not isinstance(value, list | tuple) or not value:
        return ()
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return ()
    return tuple(value)
