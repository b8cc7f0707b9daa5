"""Our forward pass of a Llama-family decoder over the paged KV cache (no transformers code at run time).

One call runs one engine step: the new tokens of every scheduled sequence, flattened into one token axis:
decode tokens first (one per decoding sequence), then each prefill chunk's tokens in order. Per layer the new
K/V are written into `KVCache` by slot mapping (vLLM's reshape_and_cache), then read back through the block
tables by `paged_attention` (decode rows) and `paged_prefill_attention` (prefill chunks, causal, attending to the
cached prefix too), with each layer's sliding window when it has one (Mistral: every layer; Qwen2: the layers
`core.kv` reads as sliding, `ModelConfig.kv_layers.sliding_windows`). Every layer belongs to one KV cache group
(`layer_group`) and writes and reads through that group's slots and block tables only: a window group's tables
release blocks behind the window (-1 entries), which lie wholly before the window of every query of the step, so
the windowed kernels never read them.
Numerics follow transformers' Llama: RMSNorm in float32, RoPE cos/sin from float32 frequencies cast to the
activation dtype, rotate-half layout, SiLU-gated MLP.
"""

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.engine.config import ModelConfig
from core.kernels.attention import paged_attention, paged_prefill_attention
from core.kernels.cpu_backend import cpu_kernel_available
from core.paging.kv_cache import KVCache

# With backend "auto" on CPU, prefill chunks of at most this many tokens per sequence go to the "cpu" C kernel:
# `core.kernels.attention` measured it faster than "torch" for chunks of 16 and 128 tokens (slower at 512), and on
# the engine's mixed steps (SmolLM2 heads, 1 thread) 1.4-3x faster for chunks of 20-217 tokens.
CPU_PREFILL_MAX_QUERY = 256


@dataclass(eq=False)
class ForwardBatch:
    """The tokens of one step and where their K/V go. T = num_decode + sum(query_lens) tokens; G = KV cache
    groups (one block table per group for every sequence; a layer of group g uses row g of the tables and slots).

    token_ids, positions: [T] int64 on the model's device; positions are absolute in the sequence.
    slot_mapping: [G, T] int64, each token's KV slot in each group.
    decode_block_tables: [G, num_decode, max_blocks] int32; decode_context_lens: [num_decode] tokens in the cache
        after this step's write (position + 1).
    prefill_block_tables: [G, num_prefill, max_blocks] int32; prefill_context_lens: [num_prefill] cached tokens
        including the chunk; prefill_query_lens: [num_prefill] chunk lengths (>= 1).
    logits_indices: [S] int64 indices into the T tokens whose next-token logits are returned, in order.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    num_decode: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_context_lens: torch.Tensor
    prefill_query_lens: torch.Tensor
    logits_indices: torch.Tensor


class LlamaModel:
    """Weights by Hugging Face name, and the forward pass. `weights` must match `config` (see core.engine.weights).

    attention_ms: milliseconds spent in the paged attention kernels (all layers) during the last `forward`.
    layer_windows: per layer, its sliding window in tokens, or None for full attention.
    layer_group: per layer, the index of its KV cache group (the row of `ForwardBatch`'s tables and slots it
        uses); default every layer in group 0.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        backend: str = "auto",
        layer_group: tuple[int, ...] | None = None,
    ):
        self.config = config
        self.backend = backend
        self.layer_windows = config.kv_layers.sliding_windows  # per layer: W, or None (full attention)
        self.layer_group = tuple(layer_group) if layer_group is not None else (0,) * config.num_layers
        first = weights["model.embed_tokens.weight"]
        self.device, self.dtype = first.device, first.dtype
        self.embed = first  # [vocab, hidden]
        self.lm_head = weights[
            "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        ]
        self.norm = weights["model.norm.weight"]
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{x}_proj" for x in ("q", "k", "v")]
            # q, k and v fused into one matrix: [(heads + 2 kv_heads) * head_dim, hidden]
            qkv_w = torch.cat([weights[n + ".weight"] for n in attn])
            qkv_b = torch.cat([weights[n + ".bias"] for n in attn]) if attn[0] + ".bias" in weights else None
            self.layers.append(
                {
                    "qkv_w": qkv_w,
                    "qkv_b": qkv_b,
                    "o_w": weights[p + "self_attn.o_proj.weight"],
                    "o_b": weights.get(p + "self_attn.o_proj.bias"),
                    "gate_up_w": torch.cat(
                        [weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]]
                    ),
                    "down_w": weights[p + "mlp.down_proj.weight"],
                    "in_norm": weights[p + "input_layernorm.weight"],
                    "post_norm": weights[p + "post_attention_layernorm.weight"],
                }
            )
        self.inv_freq = config.inv_freq().to(self.device)  # [head_dim // 2] float32
        self.attention_ms = 0.0

    @property
    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            tensors += [t for t in layer.values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return weight * xf.to(x.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, head_dim]
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]  # [T, 1, head_dim]

    @staticmethod
    def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Run the step; returns [S, vocab] float32 logits of the tokens at `batch.logits_indices`.

        Side effect: the K/V of every token of the batch are written to its slot (its layer's group's) in every
        layer of `cache`.
        """
        c = self.config
        heads, kv_heads, dim = c.num_heads, c.num_kv_heads, c.head_dim
        num_tokens = batch.token_ids.numel()
        windows = self.layer_windows  # per layer: W, or None for full attention
        cos, sin = self._rope(batch.positions)
        prefill_backend = self.backend
        # prefill chunks padded to [num_prefill, max_q]: row/col of each prefill token
        qlens = batch.prefill_query_lens
        num_prefill = qlens.numel()
        if num_prefill:
            max_q = int(qlens.max())
            rows = torch.repeat_interleave(torch.arange(num_prefill, device=self.device), qlens)
            starts = torch.cumsum(qlens, 0) - qlens
            cols = torch.arange(num_tokens - batch.num_decode, device=self.device) - starts[rows]
            short = max_q <= CPU_PREFILL_MAX_QUERY and self.device.type == "cpu"
            if self.backend == "auto" and short and cpu_kernel_available():
                prefill_backend = "cpu"
        timer = _Timer(self.device)
        x = self.embed[batch.token_ids]  # [T, hidden]
        for index, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer["in_norm"])
            qkv = F.linear(h, layer["qkv_w"], layer["qkv_b"])  # [T, (heads + 2 kv_heads) * dim]
            q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
            q = self._apply_rope(q.view(num_tokens, heads, dim), cos, sin)  # [T, heads, dim]
            k = self._apply_rope(k.view(num_tokens, kv_heads, dim), cos, sin)  # [T, kv_heads, dim]
            v = v.view(num_tokens, kv_heads, dim)
            g = self.layer_group[index]
            cache.write(index, batch.slot_mapping[g], k, v)
            key_cache, value_cache = cache.key_cache[index], cache.value_cache[index]
            extra = {"sliding_window": windows[index]} if windows[index] is not None else {}
            out = torch.empty_like(q)  # [T, heads, dim]
            timer.start()
            nd = batch.num_decode
            if nd:
                out[:nd] = paged_attention(
                    q[:nd].contiguous(),
                    key_cache,
                    value_cache,
                    batch.decode_block_tables[g],
                    batch.decode_context_lens,
                    backend=self.backend,
                    **extra,
                )
            if num_prefill:
                padded = q.new_zeros(num_prefill, max_q, heads, dim)  # [prefill seqs, max_q, heads, dim]
                padded[rows, cols] = q[nd:]
                result = paged_prefill_attention(
                    padded,
                    key_cache,
                    value_cache,
                    batch.prefill_block_tables[g],
                    batch.prefill_context_lens,
                    qlens,
                    backend=prefill_backend,
                    **extra,
                )
                out[nd:] = result[rows, cols]
            timer.stop()
            x = x + F.linear(out.view(num_tokens, heads * dim), layer["o_w"], layer["o_b"])
            h = self._rms_norm(x, layer["post_norm"])
            gate, up = F.linear(h, layer["gate_up_w"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["down_w"])
        x = self._rms_norm(x[batch.logits_indices], self.norm)  # [S, hidden]
        logits = F.linear(x, self.lm_head).float()  # [S, vocab]
        self.attention_ms = timer.total_ms()
        return logits


class _Timer:
    """Sums the wall time of start/stop intervals; on CUDA with events, read once at the end (one sync)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: list = []
        self.total = 0.0
        self._t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        else:
            self.total += (time.perf_counter() - self._t0) * 1e3

    def total_ms(self) -> float:
        if self.cuda and self.events:
            self.events[-1].synchronize()
            return sum(a.elapsed_time(b) for a, b in zip(self.events[::2], self.events[1::2], strict=True))
        return self.total
