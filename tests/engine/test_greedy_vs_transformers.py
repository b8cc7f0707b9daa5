"""Greedy decoding through the paged engine gives transformers' own tokens and logits (float32, CPU)."""

import pytest
import torch

from core.engine import Engine, SamplingParams
from tests.engine.hf_models import hf_greedy, llama_config, prompts, save_model

LENGTHS = (5, 1, 17, 32, 9, 40)
NEW = 12
TOL = 1e-4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama")
    model = save_model(LlamaForCausalLM, llama_config(), path)
    return path, model


@pytest.fixture(scope="module")
def reference(llama):
    _, model = llama
    return [hf_greedy(model, p, NEW) for p in prompts(LENGTHS)]


def _check(engine, reference, batch=None):
    outs = engine.generate(
        batch or prompts(LENGTHS), SamplingParams(NEW, temperature=0.0), return_logits=True
    )
    assert len(outs) == len(reference)
    for out, (tokens, logits) in zip(outs, reference, strict=True):
        (completion,) = out.outputs
        assert completion.token_ids == tokens
        assert completion.finish_reason == "length"
        assert torch.allclose(completion.logits, logits, atol=TOL, rtol=0)
        expected = torch.log_softmax(logits, -1)[torch.arange(NEW), tokens].sum()
        assert completion.cumulative_logprob == pytest.approx(float(expected), abs=1e-3)
    return outs


def test_roomy_pool_matches_transformers(llama, reference):
    engine = Engine.from_pretrained(llama[0], num_blocks=128, block_size=8, device="cpu")
    _check(engine, reference)
    steps = engine.last_run.steps
    assert steps["preemptions_total"].iloc[-1] == 0
    # every prompt was prefilled once in the first step, then one token per sequence per step
    assert steps["prefill_tokens"].iloc[0] == sum(LENGTHS)
    assert steps["tokens_generated"].sum() == NEW * len(LENGTHS)
    assert steps["free_blocks"].iloc[-1] == 128


def test_chunked_prefill_matches_transformers(llama, reference):
    """A 16-token step budget splits the long prompts over several steps."""
    engine = Engine.from_pretrained(
        llama[0], num_blocks=128, block_size=4, device="cpu", max_num_seqs=4, max_num_batched_tokens=16
    )
    _check(engine, reference)
    steps = engine.last_run.steps
    assert steps["prefill_tokens"].max() <= 16
    assert (steps["prefill_tokens"] > 0).sum() >= sum(LENGTHS) // 16


def test_small_pool_preempts_and_recomputes(llama, reference):
    """16 blocks of 4 tokens cannot hold all six sequences: the newest are preempted and recomputed."""
    engine = Engine.from_pretrained(llama[0], num_blocks=16, block_size=4, device="cpu")
    _check(engine, reference)
    run = engine.last_run
    assert run.steps["preemptions_total"].iloc[-1] > 0
    assert run.requests["preemptions"].sum() == run.steps["preemptions_total"].iloc[-1]
    # Every block is either held or free after every step, and all 16 come back at the end.
    assert (run.steps["blocks_in_use"] + run.steps["free_blocks"] == 16).all()
    assert run.steps["free_blocks"].iloc[-1] == 16


def test_prefix_caching_reuses_blocks_and_matches_transformers(llama):
    _, model = llama
    shared = prompts([24], seed=7)[0]
    batch = [shared + tail for tail in prompts((3, 9, 1), seed=8)]
    reference = [hf_greedy(model, p, NEW) for p in batch]
    engine = Engine.from_pretrained(
        llama[0], num_blocks=64, block_size=8, device="cpu", enable_prefix_caching=True, max_num_seqs=1
    )
    _check(engine, reference, batch)
    # one request at a time: the 2nd and 3rd find the 3 full shared blocks in the cache
    assert engine.last_run.requests["cached_tokens"].tolist() == [0, 24, 24]
    _check(engine, reference, batch)  # a second call also finds the 2nd prompt's own 4th block (33 tokens)
    assert engine.last_run.requests["cached_tokens"].tolist() == [24, 32, 24]
