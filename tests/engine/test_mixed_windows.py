"""Models mixing full-attention and sliding-window layers run with one block table per KV cache group (one pool)
and give transformers' greedy tokens and logits: Gemma-2 style alternating `layer_types` and Qwen2's
`max_window_layers`, on tiny random Qwen2 models saved by transformers."""

import pytest
import torch

from core.engine import Engine, SamplingParams
from tests.engine.hf_models import assert_greedy_like_transformers, hf_beam, hf_greedy, prompts, save_model

WINDOW = 6


def _qwen2(tmp_path, **overrides):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kwargs = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_position_embeddings": 256,
        "eos_token_id": None,
        "bos_token_id": None,
    }
    config = Qwen2Config(**(kwargs | overrides))
    model = save_model(Qwen2ForCausalLM, config, tmp_path)
    every_full = {"use_sliding_window": False, "layer_types": ["full_attention"] * config.num_hidden_layers}
    full = Qwen2ForCausalLM(Qwen2Config(**(kwargs | overrides | every_full))).eval()
    full.load_state_dict(model.state_dict())
    return model, full


@pytest.fixture(scope="module")
def alternating(tmp_path_factory):
    """Gemma-2 style: sliding, full, sliding, full."""
    path = tmp_path_factory.mktemp("qwen2_alternating")
    types = ["sliding_attention", "full_attention"] * 2
    model, full = _qwen2(path, layer_types=types)
    return path, model, full


def _assert_one_pool(snapshot):
    """Every held block id is in exactly one group's tables (ids unique across groups), and the ref counts
    are the number of table entries naming each block."""
    kv = snapshot.pool
    seen: dict[int, int] = {}
    counts = torch.zeros(kv.num_blocks, dtype=torch.long)
    for tables in kv.block_tables.values():
        for g, table in enumerate(tables):
            for block in table:
                if block >= 0:
                    assert seen.setdefault(block, g) == g
                    counts[block] += 1
    assert counts.tolist() == kv.ref_count.tolist()


def test_alternating_layer_types_run_with_a_table_per_group(alternating):
    path, model, full = alternating
    batch = prompts((3, 11, 17), seed=11)
    assert (
        hf_greedy(full, batch[1], 12)[0] != hf_greedy(model, batch[1], 12)[0]
    )  # the window changes the output
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4, device="cpu", max_snapshots=1000)
    assert [g.spec.kind for g in engine.kv_groups] == ["sliding_window", "full_attention"]
    assert engine.layer_group == (0, 1, 0, 1)
    assert_greedy_like_transformers(engine, model, batch, 12)
    run = engine.last_run
    for snap in run.snapshots:
        _assert_one_pool(snap)
    assert run.steps["free_blocks"].iloc[-1] == 64


def test_window_group_frees_blocks_the_full_group_keeps(alternating):
    """One 11-token prompt + 40 tokens in blocks of 4: the full group holds ceil(51 / 4) = 13 blocks at the end,
    the window group (W = 6) at most ceil((6 + 3) / 4) = 3 once decoding, so the pool never holds more than
    13 + 3 = 16 (26 if both groups kept everything)."""
    path, model, _ = alternating
    engine = Engine.from_pretrained(path, num_blocks=32, block_size=4, device="cpu", max_snapshots=1000)
    assert_greedy_like_transformers(engine, model, prompts((11,), seed=5), 40)
    run = engine.last_run
    peak = int(run.steps["blocks_in_use"].max())
    assert peak <= 16 < 26, peak
    held = [
        [sum(b >= 0 for b in t) for t in tables]
        for s in run.snapshots
        for tables in s.pool.block_tables.values()
    ]
    assert max(window for window, _ in held) <= 3
    assert max(full for _, full in held) == 13  # 11 + 38 tokens in the cache at the last snapshot holding it


def test_chunked_prefill_prefix_caching_and_beams_on_mixed_groups(alternating):
    """Prompt chunks of 4 tokens, prefix-cache hits found in every group, and beam search's copy-on-write in
    both groups: still transformers' tokens."""
    path, model, _ = alternating
    shared = prompts((16,), seed=7)[0]
    batch = [shared + tail for tail in prompts((3, 5), seed=8)]
    engine = Engine.from_pretrained(
        path,
        num_blocks=96,
        block_size=4,
        device="cpu",
        enable_prefix_caching=True,
        max_num_seqs=1,
        max_num_batched_tokens=4,
    )
    assert_greedy_like_transformers(engine, model, batch, 8)
    assert engine.last_run.steps["prefill_tokens"].max() <= 4
    assert engine.last_run.requests["cached_tokens"].tolist() == [
        0,
        16,
    ]  # 4 shared blocks cached in both groups
    engine = Engine.from_pretrained(
        path, num_blocks=96, block_size=4, device="cpu", enable_prefix_caching=True
    )
    beams = engine.generate(batch[:1], SamplingParams(8, beam_width=3, ignore_eos=True))
    assert beams[0].outputs[0].token_ids == hf_beam(model, batch[0], 8, 3)
    assert len(engine.last_run.cow_events) > 0
    assert engine.manager.num_free_blocks == 96


def test_qwen2_max_window_layers(tmp_path):
    """Qwen2 with use_sliding_window: layers from max_window_layers on slide. 1 full + 2 sliding layers form a
    full group and two window groups (vLLM's grouping: group size = the smallest bucket)."""
    model, full = _qwen2(tmp_path, num_hidden_layers=3, max_window_layers=1)
    batch = prompts((3, 14), seed=3)
    assert hf_greedy(full, batch[1], 16)[0] != hf_greedy(model, batch[1], 16)[0]
    engine = Engine.from_pretrained(tmp_path, num_blocks=64, block_size=4, device="cpu")
    assert [g.spec.kind for g in engine.kv_groups] == ["full_attention", "sliding_window", "sliding_window"]
    assert_greedy_like_transformers(engine, model, batch, 16)
    # 26 blocks: the four requests peak at 53 together, so the newest are preempted and recomputed (a recompute
    # holds its tokens whole in all three groups until they are computed: 24 blocks for 29 tokens)
    small = Engine.from_pretrained(tmp_path, num_blocks=26, block_size=4, device="cpu")
    assert_greedy_like_transformers(small, model, batch + prompts((9, 12), seed=4), 16)
    assert small.last_run.steps["preemptions_total"].iloc[-1] > 0


def test_nothing_is_served_from_the_cache_before_it_is_computed(alternating):
    """Two equal prompts admitted in one step: the second finds nothing cached (the first's K/V are not written
    yet), and both equal transformers. Once computed, the same prompt hits its 4 full blocks in both groups
    (18 tokens: the last prompt token is always computed)."""
    path, model, _ = alternating
    prompt = prompts((18,), seed=9)[0]
    engine = Engine.from_pretrained(
        path, num_blocks=64, block_size=4, device="cpu", enable_prefix_caching=True
    )
    assert_greedy_like_transformers(engine, model, [prompt, prompt], 6)
    assert engine.last_run.requests["cached_tokens"].tolist() == [0, 0]
    assert engine.last_run.steps["prefill_tokens"].iloc[0] == 36
    assert_greedy_like_transformers(engine, model, [prompt], 6)
    assert engine.last_run.requests["cached_tokens"].tolist() == [16]
