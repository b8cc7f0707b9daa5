"""vLLM V1's KV cache layout for a model: which layers share a block table, how many blocks fit, and how many
blocks one request can need at worst.

vLLM gives every layer a KV cache spec (full attention, sliding window, chunked local attention, MLA, Mamba),
buckets layers with identical specs, and splits the buckets into groups of one size so that one block id
addresses a page in every group's tensor: a block costs `group_size x page_bytes` and serves one group. A
request holds, per group, as many blocks as that group's attention type needs, so window groups stay bounded
while full groups grow with the context. `kv_cache_layout` reproduces that arithmetic
(`vllm/v1/core/kv_cache_utils.py`, `vllm/v1/kv_cache_interface.py`).
"""

from dataclasses import dataclass

from core.common import cdiv, check_int
from core.errors import InvalidArgumentError
from core.planning.hf_config import CHUNKED, FULL, LINEAR, SLIDING
from core.planning.kv_accounting import (
    DTYPE_BITS,
    check_parallelism,
    kv_heads_per_gpu,
    resolve_kv_dtype,
)
from core.planning.models import ModelSpec

GROUP_KINDS = ("full", "sliding_window", "chunked_local", "mla", "mamba")
MAX_LAYOUT_TOKENS = 1 << 26  # 67M tokens: far beyond any published context length
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# Attention kernels need block sizes in multiples of this when vLLM raises the block size for Mamba state
# (FlashAttention: 16; MLA backends: 64).
_KERNEL_BLOCK_ALIGNMENT = {"mla": 64}


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share one block table.

    kind: one of GROUP_KINDS; layers: the model's layer indices in this group (global, in order); window:
    the sliding window or attention chunk (tokens), else None; page_bytes: bytes of one block of one layer;
    block_size: tokens per block (a Mamba group's one block holds a whole request's state: max_model_len).
    """

    kind: str
    layers: tuple[int, ...]
    window: int | None
    page_bytes: int
    block_size: int

    def worst_case_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request of `max_model_len` tokens can hold in this group at once (vLLM's
        `max_memory_usage_bytes` / page): full and MLA cdiv(L, B); sliding window
        cdiv(min(W - 1 + T, L), B) + 1 (the window need not start on a block boundary); chunked local
        cdiv(min(C + T, L), B); Mamba 1. T is the tokens in flight in one step (max_num_batched_tokens)."""
        length, block, in_flight = max_model_len, self.block_size, max_num_batched_tokens
        if self.kind == "sliding_window":
            return cdiv(min(self.window - 1 + in_flight, length), block) + 1
        if self.kind == "chunked_local":
            return cdiv(min(self.window + in_flight, length), block)
        if self.kind == "mamba":
            return 1
        return cdiv(length, block)


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


def kv_cache_layout(
    model: ModelSpec,
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
    """The layout vLLM V1 builds for `model` with `available_bytes` of KV memory per GPU (see KVCacheLayout).

    Layer specs: full attention (MLA for an MLA model), sliding window, chunked local, Mamba (state bytes from
    `RecurrentStateSpec`, in the model's dtype). With Mamba layers the attention block size becomes the smallest
    multiple of 16 (64 for MLA) whose page holds a Mamba state, if `block_size` is smaller, and the Mamba page is
    padded to the attention page. One spec for every layer: one group. Otherwise layers are bucketed by spec,
    group size = the smallest bucket (the largest when it is under 1.5 x the smallest), each bucket split into
    cdiv(n, group size) groups by striding. `hybrid_kv_cache_manager=False` (--disable-hybrid-kv-cache-manager)
    counts sliding and chunked layers as full attention when full layers are present; vLLM refuses it for a
    model with Mamba layers. Raises `InvalidArgumentError` for bad arguments.
    """
    check_parallelism(model, tensor_parallel, pipeline_parallel)
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
    bits = DTYPE_BITS[resolve_kv_dtype(model, kv_dtype)]

    specs = _layer_specs(model, hybrid_kv_cache_manager)
    attention_kind = "mla" if model.is_mla else "full"
    # Bytes of one token of one attention layer on this GPU.
    if model.is_mla:
        token_bytes = (model.kv_lora_rank + model.qk_rope_head_dim) * bits / 8
    else:
        token_bytes = 2 * kv_heads_per_gpu(model, tensor_parallel) * model.head_dim * bits / 8
    has_attention = any(kind != "mamba" for kind, _ in specs)
    mamba_bytes = 0
    if any(kind == "mamba" for kind, _ in specs):
        mamba_bytes = model.recurrent_state.state_bytes(tensor_parallel, model.compute_dtype)
        if has_attention:
            align = _KERNEL_BLOCK_ALIGNMENT.get(attention_kind, 16)
            block_size = max(block_size, align * cdiv(mamba_bytes, int(align * token_bytes)))
    page = int(block_size * token_bytes) if has_attention else mamba_bytes

    buckets: dict[tuple[str, int | None], list[int]] = {}
    for layer, spec in enumerate(specs):
        buckets.setdefault(spec, []).append(layer)
    grouped, padding = _split_buckets(list(buckets.values()))
    groups = tuple(
        KVCacheGroup(
            kind=specs[layers[0]][0],
            layers=tuple(layers),
            window=specs[layers[0]][1],
            page_bytes=page,
            block_size=max_model_len if specs[layers[0]][0] == "mamba" else block_size,
        )
        for layers in grouped
    )
    group_size = _stage_group_size(groups, model.num_layers, pipeline_parallel)
    num_blocks = max(0, available_bytes // page // group_size)
    group_blocks = tuple(g.worst_case_blocks(max_model_len, in_flight) for g in groups)
    per_request = sum(group_blocks)
    concurrency = num_blocks / per_request
    return KVCacheLayout(
        groups=groups,
        group_size=group_size,
        padding_layers=padding,
        page_bytes=page,
        block_bytes=group_size * page,
        num_blocks=num_blocks,
        group_blocks=group_blocks,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        kv_tokens=int(concurrency * max_model_len),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_batched_tokens=in_flight,
        hybrid_kv_cache_manager=hybrid_kv_cache_manager,
    )


def _layer_specs(model: ModelSpec, hybrid: bool) -> list[tuple[str, int | None]]:
    """(group kind, window) of every layer; without the hybrid manager, windowed layers count as full when
    full layers are present (vLLM's unify_hybrid_kv_cache_specs)."""
    full = "mla" if model.is_mla else "full"
    kinds = {
        FULL: (full, None),
        SLIDING: ("sliding_window", model.sliding_window),
        CHUNKED: ("chunked_local", model.attention_chunk_size),
        LINEAR: ("mamba", None),
    }
    specs = [kinds[kind] for kind in model.layer_kinds]
    if hybrid or len(set(specs)) == 1:
        return specs
    if any(kind == "mamba" for kind, _ in specs):
        raise InvalidArgumentError(
            f"{model.name} has Mamba / linear-attention layers: vLLM cannot run it with "
            "--disable-hybrid-kv-cache-manager (its layers cannot be unified into one KV cache type)"
        )
    if any(kind == full for kind, _ in specs):
        specs = [(full, None) for _ in specs]
    if len(set(specs)) > 1:
        raise InvalidArgumentError(
            f"{model.name} mixes sliding-window and chunked layers without full ones: vLLM cannot unify them "
            "without the hybrid KV cache manager"
        )
    return specs


def _split_buckets(buckets: list[list[int]]) -> tuple[list[list[int]], int]:
    """(groups, padding layers): vLLM's _get_kv_cache_groups_uniform_page_size on buckets of layer indices."""
    if len(buckets) == 1:
        return buckets, 0
    smallest = min(len(b) for b in buckets)
    largest = max(len(b) for b in buckets)
    size = largest if largest < 1.5 * smallest else smallest
    groups, padding = [], 0
    for layers in buckets:
        count = cdiv(len(layers), size)
        padding += count * size - len(layers)
        groups += [layers[i::count] for i in range(count)]
    return groups, padding


def _stage_group_size(groups: tuple[KVCacheGroup, ...], num_layers: int, pipeline_parallel: int) -> int:
    """Layers per group on the pipeline stage with the most: vLLM projects the global groups onto each stage,
    sizes each stage's tensors by its largest projected group, and every stage keeps the smallest block count.
    Stages split layers as vLLM's get_pp_indices does (the remainder goes to the stages before the last)."""
    sizes = [num_layers // pipeline_parallel] * pipeline_parallel
    for i in range(2, num_layers % pipeline_parallel + 2):
        sizes[-i] += 1
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
    model: ModelSpec,
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
    check_parallelism(model, tensor_parallel, pipeline_parallel)
    context_len = check_int(context_len, "context_len", minimum=1, maximum=MAX_LAYOUT_TOKENS)
    bits = DTYPE_BITS[resolve_kv_dtype(model, kv_dtype)]
    if model.is_mla:
        token_elements = model.kv_lora_rank + model.qk_rope_head_dim
    else:
        token_elements = 2 * kv_heads_per_gpu(model, tensor_parallel) * model.head_dim
    sizes = [model.num_layers // pipeline_parallel] * pipeline_parallel
    for i in range(2, model.num_layers % pipeline_parallel + 2):
        sizes[-i] += 1
    best = 0
    for stage, size in enumerate(sizes):
        start = sum(sizes[:stage])
        tokens = state = 0
        for kind in model.layer_kinds[start : start + size]:
            if kind == SLIDING:
                tokens += min(context_len, model.sliding_window)
            elif kind == CHUNKED:
                tokens += (context_len - 1) % model.attention_chunk_size + 1
            elif kind == LINEAR:
                state += model.recurrent_state.state_bytes(tensor_parallel, model.compute_dtype)
            else:
                tokens += context_len
        best = max(best, tokens * token_elements * bits // 8 + state)
    return best


def layout_notes(model: ModelSpec, layout: KVCacheLayout) -> list[str]:
    """Notes on a hybrid model's KV cache groups (none for a model with one kind of layer)."""
    if not model.is_hybrid and len(layout.groups) == 1 and layout.groups[0].kind in ("full", "mla"):
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
