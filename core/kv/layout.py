"""vLLM V1's KV cache layout for a model: which layers share a block table, how many blocks fit, and how many
blocks one request can need at worst.

vLLM gives every layer a KV cache spec (`core.kv.specs`, read by `core.kv.hf_config.layer_specs`), buckets
layers with identical specs, and splits the buckets into groups of one size so that one block id addresses a
page in every group's tensor: a block costs `group_size x page_bytes` and serves one group. A request holds, per
group, as many blocks as that group's spec needs, so window groups stay bounded while full groups grow with the
context. `kv_cache_layout` reproduces that arithmetic (`vllm/v1/core/kv_cache_utils.py`,
`vllm/v1/kv_cache_interface.py`); `kv_cache_groups` is its grouping step alone. `model_kv_specs` derives a
model's specs, groups and pipeline stages once (memoised); `layout_of` and `kv_read_bytes_of` count from them.
"""

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.kv.hf_config import KVLayers, as_kv_layers, cached_layer_specs, resolve_kv_dtype_name
from core.kv.single_type_manager import rule_of
from core.kv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

GROUP_KINDS = ("full", "sliding_window", "chunked_local", "mla", "mamba")
# The short group kind of each spec kind (what the planner's tables and notes print).
_GROUP_KIND = dict(
    zip(
        ("full_attention", "sliding_window", "chunked_local_attention", "mla_attention", "mamba"),
        GROUP_KINDS,
        strict=True,
    )
)
MAX_LAYOUT_TOKENS = 1 << 26  # 67M tokens: far beyond any published context length
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM V1's default chunked-prefill token budget for `vllm serve`
MAX_PARALLEL = 1024  # largest tensor- or pipeline-parallel size accepted
# Attention kernels need block sizes in multiples of this when vLLM raises the block size for Mamba state
# (FlashAttention: 16; MLA backends: 64).
_KERNEL_BLOCK_ALIGNMENT = {"mla": 64}


def parallel_size(value: object, name: str) -> int:
    """`value` as an int in 1..MAX_PARALLEL (a plain int in range skips check_int: a plan checks often)."""
    if type(value) is int and 1 <= value <= MAX_PARALLEL:
        return value
    return check_int(value, name, minimum=1, maximum=MAX_PARALLEL)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table: `spec` (every layer's) and `layers`, the model's layer indices in
    this group (global, in order).

    Derived: kind (one of GROUP_KINDS), window (the sliding window or attention chunk in tokens, else None),
    page_bytes (one block of one layer), block_size (tokens per block; a Mamba group's one block holds a whole
    request's state: max_model_len).
    """

    spec: KVCacheSpec
    layers: tuple[int, ...]

    @property
    def kind(self) -> str:
        return _GROUP_KIND[self.spec.kind]

    @property
    def window(self) -> int | None:
        if isinstance(self.spec, SlidingWindowSpec):
            return self.spec.sliding_window
        if isinstance(self.spec, ChunkedLocalAttentionSpec):
            return self.spec.attention_chunk_size
        return None

    @property
    def page_bytes(self) -> int:
        return self.spec.page_size_bytes

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def worst_case_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of `max_model_len` tokens can hold in this group at once (vLLM's
        `max_memory_usage_bytes` / page, `KVCacheSpec.max_blocks_per_request`): full and MLA cdiv(L, B);
        sliding window cdiv(min(W - 1 + T, L), B) + 1 (the window need not start on a block boundary); chunked
        local cdiv(min(C + T, L), B); Mamba 1. T is the tokens in flight in one step (max_num_batched_tokens)."""
        return self.spec.max_blocks_per_request(max_model_len, max_num_batched_tokens)

    def to_dict(self) -> dict[str, Any]:
        """{kind, layers, window, page_bytes, block_size}: the group as the planner's JSON shows it."""
        return {
            "kind": self.kind,
            "layers": self.layers,
            "window": self.window,
            "page_bytes": self.page_bytes,
            "block_size": self.block_size,
        }


@dataclass(frozen=True)
class KVCacheLayout:
    """The KV cache of one GPU (the most loaded pipeline stage) laid out as vLLM V1 does.

    Invariants: block_bytes = group_size x page_bytes (every group's page is the same size);
    num_blocks = available_bytes // page_bytes // group_size; group_blocks[i] is groups[i]'s worst case per
    request at max_model_len and blocks_per_request their sum; max_concurrency = num_blocks /
    blocks_per_request (vLLM's "Maximum concurrency for L tokens per request"); kv_tokens =
    int(max_concurrency x max_model_len). group_size counts layers per group on this GPU, padding included;
    padding_layers is the number of empty slots vLLM adds ("Add N padding layers"). block_size is the
    attention block size (raised above the requested one when Mamba state needs a larger page).
    """

    groups: tuple[KVCacheGroup, ...]
    group_size: int
    padding_layers: int
    page_bytes: int
    block_bytes: int
    num_blocks: int
    group_blocks: tuple[int, ...]
    blocks_per_request: int
    max_concurrency: float
    kv_tokens: int
    block_size: int
    max_model_len: int
    max_num_batched_tokens: int
    hybrid_kv_cache_manager: bool

    @property
    def request_bytes(self) -> int:
        """Bytes one max_model_len request can hold at worst: blocks_per_request x block_bytes."""
        return self.blocks_per_request * self.block_bytes

    def to_dict(self) -> dict[str, Any]:
        """Every field, groups as `KVCacheGroup.to_dict` (JSON-ready)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["groups"] = tuple(g.to_dict() for g in self.groups)
        return data


def kv_cache_layout(
    model: Any,
    available_bytes: int,
    *,
    max_model_len: int,
    block_size: int = 16,
    kv_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    hybrid_kv_cache_manager: bool = True,
) -> KVCacheLayout:
    """The layout vLLM V1 builds for `model` (a config dict, `KVLayers` or a model with `kv_layers`, e.g. the
    planner's `ModelSpec`) with `available_bytes` of KV memory per GPU (see KVCacheLayout).

    Layer specs come from `layer_specs`: full attention (MLA for an MLA model), sliding window, chunked local,
    Mamba (the recurrent state in the model's dtype). With Mamba layers the attention block size becomes the
    smallest multiple of 16 (64 for MLA) whose page holds a Mamba state, if `block_size` is smaller, and the
    Mamba page is padded to the attention page. Grouping: `kv_cache_groups`. `hybrid_kv_cache_manager=False`
    (--disable-hybrid-kv-cache-manager) counts sliding and chunked layers as full attention when full layers
    are present; vLLM refuses it for a model with Mamba layers. Raises `InvalidArgumentError` for bad arguments.
    """
    layers = as_kv_layers(model)
    tensor_parallel = parallel_size(tensor_parallel, "tensor_parallel")
    pipeline_parallel = parallel_size(pipeline_parallel, "pipeline_parallel")
    layers.check_parallel(tensor_parallel, pipeline_parallel)
    available_bytes = check_int(available_bytes, "available_bytes", minimum=0)
    max_model_len = check_int(max_model_len, "max_model_len", minimum=1, maximum=MAX_LAYOUT_TOKENS)
    block_size = check_int(block_size, "block_size", minimum=1, maximum=65_536)
    in_flight = check_int(
        max_num_batched_tokens, "max_num_batched_tokens", minimum=1, maximum=MAX_LAYOUT_TOKENS
    )
    if not isinstance(hybrid_kv_cache_manager, bool):
        raise InvalidArgumentError(
            f"hybrid_kv_cache_manager must be True or False, got {hybrid_kv_cache_manager!r}"
        )
    kv = model_kv_specs(
        layers,
        block_size,
        resolve_kv_dtype_name(layers, kv_dtype),
        (tensor_parallel, pipeline_parallel),
        max_model_len,
        hybrid_kv_cache_manager,
    )
    return layout_of(kv, available_bytes, max_model_len=max_model_len, max_num_batched_tokens=in_flight)


@dataclass(frozen=True)
class ModelKVSpecs:
    """A model's KV cache specs on one tensor-parallel rank, derived once from its `KVLayers` for one block
    size, KV dtype, tp, pp, max_model_len and hybrid setting (`model_kv_specs`).

    specs: one per layer, as `cached_layer_specs` gives them (before vLLM unifies them). groups /
    padding_layers: vLLM's KV cache groups of the unified specs (`kv_cache_groups`); group_size: layers per
    group on the most loaded pipeline stage; page_bytes: one block of one layer (every group's);
    block_size: the attention block size (raised above the requested one when a Mamba state needs a larger
    page). stage_reads: per pipeline stage, ((spec, layers of the stage with it), ...) over `specs` and the
    bytes of 8 tokens of one attention layer (0 without attention): what one decode step reads.
    """

    layers: KVLayers
    specs: tuple[KVCacheSpec, ...]
    groups: tuple[KVCacheGroup, ...]
    padding_layers: int
    group_size: int
    page_bytes: int
    block_size: int
    hybrid_kv_cache_manager: bool
    stage_reads: tuple[tuple[tuple[tuple[KVCacheSpec, int], ...], int], ...]


@lru_cache(maxsize=256)
def model_kv_specs(
    layers: KVLayers,
    block_size: int,
    dtype: str,
    parallel: tuple[int, int],
    max_model_len: int | None,
    hybrid: bool,
) -> ModelKVSpecs:
    """The `ModelKVSpecs` of `layers` for checked arguments (a short KV dtype name; `parallel` the
    (tensor_parallel, pipeline_parallel) sizes), memoised: the one
    derivation of a model's layer specs, groups and stages behind `kv_cache_layout`,
    `kv_read_bytes_per_sequence` and the planner's `ResolvedDeployment`. Raises `InvalidArgumentError` when
    `hybrid` is False and the specs cannot be unified (`unify_hybrid_specs`)."""
    tensor_parallel, pipeline_parallel = parallel
    specs = cached_layer_specs(layers, block_size, dtype, tensor_parallel, max_model_len)
    unified = list(specs) if hybrid else unify_hybrid_specs(list(specs), layers.name)
    unified = unify_page_sizes(unified)
    groups, padding = kv_cache_groups(unified)
    attention = next((s for s in unified if not isinstance(s, MambaSpec)), None)
    return ModelKVSpecs(
        layers=layers,
        specs=specs,
        groups=groups,
        padding_layers=padding,
        group_size=_stage_group_size(groups, layers.num_layers, pipeline_parallel),
        page_bytes=groups[0].page_bytes,
        block_size=block_size if attention is None else attention.block_size,
        hybrid_kv_cache_manager=hybrid,
        stage_reads=_stage_reads(specs, pipeline_parallel),
    )


def layout_of(
    kv: ModelKVSpecs, available_bytes: int, *, max_model_len: int, max_num_batched_tokens: int
) -> KVCacheLayout:
    """The `KVCacheLayout` of derived specs (`model_kv_specs`, made for this max_model_len) in
    `available_bytes` (>= 0) per GPU, for checked arguments: counts blocks, derives nothing."""
    num_blocks = max(0, available_bytes // kv.page_bytes // kv.group_size)
    group_blocks = tuple(g.worst_case_blocks(max_model_len, max_num_batched_tokens) for g in kv.groups)
    per_request = sum(group_blocks)
    concurrency = num_blocks / per_request
    return KVCacheLayout(
        groups=kv.groups,
        group_size=kv.group_size,
        padding_layers=kv.padding_layers,
        page_bytes=kv.page_bytes,
        block_bytes=kv.group_size * kv.page_bytes,
        num_blocks=num_blocks,
        group_blocks=group_blocks,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        kv_tokens=int(concurrency * max_model_len),
        block_size=kv.block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        hybrid_kv_cache_manager=kv.hybrid_kv_cache_manager,
    )


def unify_hybrid_specs(specs: list[KVCacheSpec], name: str = "the model") -> list[KVCacheSpec]:
    """The specs without the hybrid manager (vLLM's unify_hybrid_kv_cache_specs): one spec as is; windowed
    layers count as full when full layers are present; Mamba layers, or windows of two kinds without full
    layers, cannot be unified (`InvalidArgumentError`)."""
    if len(set(specs)) == 1:
        return specs
    if any(isinstance(s, MambaSpec) for s in specs):
        raise InvalidArgumentError(
            f"{name} has Mamba / linear-attention layers: vLLM cannot run it with "
            "--disable-hybrid-kv-cache-manager (its layers cannot be unified into one KV cache type)"
        )
    full = next((s for s in specs if type(s) in (FullAttentionSpec, MLAAttentionSpec)), None)
    if full is not None:
        return [full] * len(specs)
    raise InvalidArgumentError(
        f"{name} mixes sliding-window and chunked layers without full ones: vLLM cannot unify them "
        "without the hybrid KV cache manager"
    )


def unify_page_sizes(specs: list[KVCacheSpec]) -> list[KVCacheSpec]:
    """The specs with one page size, as vLLM makes them for a model with Mamba and attention layers: the
    attention block size becomes the smallest multiple of 16 (64 for MLA) whose page holds a Mamba state (when
    the given one is smaller) and the Mamba page is padded to the attention page. Other models: unchanged."""
    mamba = next((s for s in specs if isinstance(s, MambaSpec)), None)
    attention = next((s for s in specs if not isinstance(s, MambaSpec)), None)
    if mamba is None or attention is None:
        return specs
    align = _KERNEL_BLOCK_ALIGNMENT.get(_GROUP_KIND[attention.kind], 16)
    aligned_page = replace(attention, block_size=align).page_size_bytes
    block_size = max(attention.block_size, align * cdiv(mamba.state_bytes, aligned_page))
    page = replace(attention, block_size=block_size).page_size_bytes
    return [
        replace(s, page_size_padded=page) if isinstance(s, MambaSpec) else replace(s, block_size=block_size)
        for s in specs
    ]


def kv_cache_groups(specs: list[KVCacheSpec]) -> tuple[tuple[KVCacheGroup, ...], int]:
    """(groups, padding layers): layers bucketed by equal spec (in order of first layer), group size = the
    smallest bucket (the largest when it is under 1.5 x the smallest), each bucket split into cdiv(n, size)
    groups by striding (vLLM's _get_kv_cache_groups_uniform_page_size). One spec: one group, no padding."""
    buckets: dict[KVCacheSpec, list[int]] = {}
    same: dict[int, list[int]] = {}  # id(spec) -> its bucket: a model repeats a few spec objects
    for layer, spec in enumerate(specs):
        bucket = same.get(id(spec))
        if bucket is None:
            bucket = same[id(spec)] = buckets.setdefault(spec, [])
        bucket.append(layer)
    if len(buckets) == 1:
        return tuple(KVCacheGroup(spec, tuple(layers)) for spec, layers in buckets.items()), 0
    smallest = min(len(b) for b in buckets.values())
    largest = max(len(b) for b in buckets.values())
    size = largest if largest < 1.5 * smallest else smallest
    groups, padding = [], 0
    for spec, layers in buckets.items():
        count = cdiv(len(layers), size)
        padding += count * size - len(layers)
        groups += [KVCacheGroup(spec, tuple(layers[i::count])) for i in range(count)]
    return tuple(groups), padding


def pipeline_stage_sizes(num_layers: int, pipeline_parallel: int) -> list[int]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them (the remainder goes to the stages
    before the last)."""
    sizes = [num_layers // pipeline_parallel] * pipeline_parallel
    for i in range(2, num_layers % pipeline_parallel + 2):
        sizes[-i] += 1
    return sizes


def _stage_group_size(groups: tuple[KVCacheGroup, ...], num_layers: int, pipeline_parallel: int) -> int:
    """Layers per group on the pipeline stage with the most: vLLM projects the global groups onto each stage,
    sizes each stage's tensors by its largest projected group, and every stage keeps the smallest block count."""
    sizes = pipeline_stage_sizes(num_layers, pipeline_parallel)
    starts = [sum(sizes[:i]) for i in range(pipeline_parallel)]
    return max(
        max(sum(start <= layer < start + n for layer in g.layers) for g in groups)
        for start, n in zip(starts, sizes, strict=True)
    )


def request_blocks(layout: KVCacheLayout, num_tokens: int) -> int:
    """Blocks one request of `num_tokens` tokens can hold at worst, summed over the groups (the layout's
    blocks_per_request when num_tokens == max_model_len)."""
    num_tokens = check_int(num_tokens, "num_tokens", minimum=1, maximum=MAX_LAYOUT_TOKENS)
    return sum(g.worst_case_blocks(num_tokens, layout.max_num_batched_tokens) for g in layout.groups)


def longest_fitting_len(layout: KVCacheLayout, limit: int) -> int:
    """The largest request length (<= limit) whose worst case fits in the layout's blocks, 0 if none (vLLM's
    estimate of the maximum model length, by binary search as it does). For one full-attention group:
    min(limit, num_blocks x block_size)."""
    low, high = 0, check_int(limit, "limit", minimum=1, maximum=MAX_LAYOUT_TOKENS)
    while low < high:
        middle = (low + high + 1) // 2
        if request_blocks(layout, middle) <= layout.num_blocks:
            low = middle
        else:
            high = middle - 1
    return low


def kv_read_bytes_per_sequence(
    model: Any,
    context_len: int,
    *,
    kv_dtype: str = "auto",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """KV bytes one decode step reads for one sequence of `context_len` tokens on the most loaded GPU.

    Per layer of the largest pipeline stage: full attention (and MLA) reads every token, a sliding-window layer
    min(context, window), a chunked-local layer the tokens of the current chunk ((context - 1) % chunk + 1), a
    linear-attention layer its recurrent state. For a model of full-attention layers only this is
    context_len x kv_bytes_per_token.
    """
    layers = as_kv_layers(model)
    tensor_parallel = parallel_size(tensor_parallel, "tensor_parallel")
    pipeline_parallel = parallel_size(pipeline_parallel, "pipeline_parallel")
    layers.check_parallel(tensor_parallel, pipeline_parallel)
    context_len = check_int(context_len, "context_len", minimum=1, maximum=MAX_LAYOUT_TOKENS)
    kv = model_kv_specs(
        layers, 8, resolve_kv_dtype_name(layers, kv_dtype), (tensor_parallel, pipeline_parallel), None, True
    )
    return kv_read_bytes_of(kv, context_len)


def kv_read_bytes_of(kv: ModelKVSpecs, context_len: int) -> int:
    """`kv_read_bytes_per_sequence` of derived specs (`model_kv_specs`) for a checked `context_len`: derives
    nothing."""
    best = 0
    for stage, token_bits in kv.stage_reads:
        tokens = state = 0
        for spec, count in stage:
            if isinstance(spec, MambaSpec):
                state += count * spec.state_bytes
            else:  # the tokens the query at position context_len - 1 reads: the KV core's window rule
                tokens += count * (context_len - rule_of(spec).num_skipped_tokens(context_len - 1))
        best = max(best, tokens * token_bits // 8 + state)
    return best


def _stage_reads(
    specs: tuple[KVCacheSpec, ...], pipeline_parallel: int
) -> tuple[tuple[tuple[tuple[KVCacheSpec, int], ...], int], ...]:
    """Per pipeline stage: ((spec, layers of the stage with it), ...) and the bytes of an 8-token page of its
    attention layers, which is the bits of one token (the same for every attention layer of a model)."""
    sizes = pipeline_stage_sizes(len(specs), pipeline_parallel)
    stages = []
    for stage, size in enumerate(sizes):
        start = sum(sizes[:stage])
        counts: dict[KVCacheSpec, int] = {}
        for spec in specs[start : start + size]:
            counts[spec] = counts.get(spec, 0) + 1
        attention = next((s for s in counts if not isinstance(s, MambaSpec)), None)
        token_bits = 0 if attention is None else replace(attention, block_size=8).page_size_bytes
        stages.append((tuple(counts.items()), token_bits))
    return tuple(stages)


def layout_notes(model: Any, layout: KVCacheLayout) -> list[str]:
    """Notes on a hybrid model's KV cache groups (none for a model with one kind of layer)."""
    hybrid = len(set(as_kv_layers(model).layer_types)) > 1
    if not hybrid and len(layout.groups) == 1 and layout.groups[0].kind in ("full", "mla"):
        return []
    parts = ", ".join(
        f"{len(g.layers)} {g.kind.replace('_', ' ')}"
        + (f" (window {g.window:,})" if g.window else "")
        + f": {blocks:,} blocks"
        for g, blocks in zip(layout.groups, layout.group_blocks, strict=True)
    )
    notes = [
        f"vLLM's KV cache groups (hybrid manager {'on' if layout.hybrid_kv_cache_manager else 'off'}): {parts} "
        f"per {layout.max_model_len:,}-token request; one block id spans {layout.group_size} layers of every group"
        + (f", {layout.padding_layers} padding layers" if layout.padding_layers else "")
        + f". Window groups are sized for {layout.max_num_batched_tokens:,} tokens in flight per step (async "
        "scheduling doubles it)."
    ]
    if layout.hybrid_kv_cache_manager and any(g.kind == "chunked_local" for g in layout.groups):
        notes.append(
            "vLLM versions where VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 0 turn the hybrid "
            "KV cache manager off by themselves for chunked local attention: set it to 1, or expect the figures "
            "of --disable-hybrid-kv-cache-manager."
        )
    if any(g.kind == "mamba" for g in layout.groups) and len(layout.groups) > 1:
        notes.append(
            f"Attention block size raised to {layout.block_size} tokens so one page holds a Mamba state, as vLLM does."
        )
    return notes
