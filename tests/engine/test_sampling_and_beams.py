"""Parallel sampling forks the prompt's blocks; beam search gives transformers' best beam."""

import pytest
import torch

from core.common import cdiv
from core.engine import Engine, SamplingParams
from core.engine.sampling import filtered_logits
from tests.engine.hf_models import hf_beam, llama_config, prompts, save_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama_sampling")
    return path, save_model(LlamaForCausalLM, llama_config(), path, seed=3)


def test_beam_width_4_gives_transformers_best_beam(llama):
    path, model = llama
    batch = prompts((6, 13, 2), seed=5)
    engine = Engine.from_pretrained(path, num_blocks=96, block_size=4, device="cpu")
    outs = engine.generate(batch, SamplingParams(10, beam_width=4, ignore_eos=True))
    for prompt, out in zip(batch, outs, strict=True):
        assert len(out.outputs) == 4
        assert out.outputs[0].token_ids == hf_beam(model, prompt, 10, 4)
        scores = [o.cumulative_logprob for o in out.outputs]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(o.token_ids) for o in out.outputs}) == 4
    run = engine.last_run
    assert run.steps["shared_blocks"].max() > 0  # beams share their common history
    assert run.steps["cow_copies"].sum() > 0
    assert run.steps["free_blocks"].iloc[-1] == 96  # every dead or finished beam was freed


def test_beam_search_under_preemption_keeps_the_best_beam(llama):
    path, model = llama
    batch = prompts((6, 13, 2), seed=5)
    engine = Engine.from_pretrained(path, num_blocks=24, block_size=4, device="cpu")
    outs = engine.generate(batch, SamplingParams(10, beam_width=4, ignore_eos=True))
    assert engine.last_run.steps["preemptions_total"].iloc[-1] > 0
    for prompt, out in zip(batch, outs, strict=True):
        assert out.outputs[0].token_ids == hf_beam(model, prompt, 10, 4)


def test_parallel_sampling_is_seeded_and_forks_the_prompt(llama):
    path, _ = llama
    prompt_len, bs, n = 21, 4, 4
    batch = prompts((prompt_len,), seed=9)
    params = SamplingParams(8, temperature=1.0, n=n, seed=1234, ignore_eos=True)
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=bs, device="cpu")
    first = engine.generate(batch, params)[0].outputs
    steps = engine.last_run.steps
    second = Engine.from_pretrained(path, num_blocks=64, block_size=bs, device="cpu").generate(batch, params)[
        0
    ]
    assert [o.token_ids for o in first] == [o.token_ids for o in second.outputs]
    assert len({tuple(o.token_ids) for o in first}) == n  # the samples differ
    # step 0 prefilled the prompt once (ceil(21 / 4) = 6 blocks, no sharing yet) and sampled n first tokens
    assert steps["blocks_in_use"].iloc[0] == cdiv(prompt_len, bs)
    # step 1 appended each sample's first token: the 5 full prompt blocks are shared once, and each sample
    # holds its own copy of the partially filled last block (n - 1 copies, the last writer keeps the original)
    assert steps["blocks_in_use"].iloc[1] == prompt_len // bs + n
    assert steps["shared_blocks"].iloc[1] == prompt_len // bs
    assert steps["cow_copies"].iloc[1] == n - 1
    assert steps["blocks_without_sharing"].iloc[1] == n * cdiv(prompt_len + 1, bs)
    cows = engine.last_run.cow_events
    assert len(cows) == n - 1 and set(cows["step"]) == {1}


def test_other_seed_changes_the_samples(llama):
    path, _ = llama
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4, device="cpu")
    batch = prompts((7,), seed=2)
    a = engine.generate(batch, SamplingParams(8, n=2, seed=1, ignore_eos=True))[0].outputs
    b = engine.generate(batch, SamplingParams(8, n=2, seed=2, ignore_eos=True))[0].outputs
    assert [o.token_ids for o in a] != [o.token_ids for o in b]


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filtered_logits(logits, SamplingParams(1, top_k=2)).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filtered_logits(logits, SamplingParams(1, top_p=0.8)).isfinite()
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 + 0.3 reaches 0.8
    kept = filtered_logits(logits, SamplingParams(1, top_p=0.81)).isfinite()
    assert kept.tolist() == [[True, True, True, False]]


def test_stop_tokens_end_an_output(llama):
    path, _ = llama
    engine = Engine.from_pretrained(path, num_blocks=64, block_size=4, device="cpu")
    batch = prompts((5,), seed=4)
    free_run = engine.generate(batch, SamplingParams(8, temperature=0.0))[0].outputs[0].token_ids
    stop = free_run[3]
    out = engine.generate(batch, SamplingParams(8, temperature=0.0, stop_token_ids=(stop,)))[0].outputs[0]
    assert out.token_ids == free_run[: free_run.index(stop) + 1]
    assert out.finish_reason == "stop"
