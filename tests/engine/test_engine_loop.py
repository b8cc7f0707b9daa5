"""The step loop: add_request / step / abort_request / has_unfinished_requests, streaming, threads, step timings.

Tokens are checked against transformers' greedy decoding of each prompt alone (the same saved random Llama), so
a request that joins a running batch, survives an abort of its neighbour or is added from another thread must
still produce exactly the tokens it would alone.
"""

import threading

import pytest
import torch

from core.engine import Engine, SamplingParams
from core.errors import InvalidArgumentError
from tests.engine.hf_models import hf_greedy, llama_config, prompts, save_model

LENGTHS = (7, 19, 3, 26)
NEW = 10
GREEDY = SamplingParams(NEW, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("llama_loop")
    model = save_model(LlamaForCausalLM, llama_config(), path)
    batch = prompts(LENGTHS, seed=3)
    return path, batch, [hf_greedy(model, p, NEW)[0] for p in batch]


def _engine(path, **kwargs) -> Engine:
    return Engine.from_pretrained(
        path, num_blocks=kwargs.pop("num_blocks", 64), block_size=4, device="cpu", **kwargs
    )


def _run_to_end(engine: Engine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def test_a_request_added_mid_run_gets_its_tokens_alone(llama):
    path, batch, expected = llama
    engine = _engine(path)
    assert not engine.has_unfinished_requests() and engine.step() == []
    first = engine.add_request(batch[0], GREEDY)
    second = engine.add_request(batch[1], GREEDY, request_id="late-comer-1")
    assert (first, second) == (0, "late-comer-1") and engine.has_unfinished_requests()
    done = {}
    for _ in range(4):  # both are decoding when the others arrive
        done.update((o.request_id, o) for o in engine.step())
    engine.add_request(batch[2], GREEDY, request_id="late-comer-2")
    engine.step()
    engine.add_request(batch[3], GREEDY, request_id=7)
    done.update(_run_to_end(engine))
    assert not engine.has_unfinished_requests() and engine.step() == []
    for request_id, tokens in zip((0, "late-comer-1", "late-comer-2", 7), expected, strict=True):
        (completion,) = done[request_id].outputs
        assert completion.token_ids == tokens
        assert completion.finish_reason == "length"
    assert engine.manager.num_free_blocks == 64
    run = engine.current_run()
    assert sorted(map(str, run.requests["request_id"])) == ["0", "7", "late-comer-1", "late-comer-2"]
    # the late requests joined a running batch: some step decoded while another prefilled
    steps = run.steps
    assert (
        (steps["prefill_tokens"] > 0) & (steps["running_seqs"] > 1) & (steps["tokens_generated"] > 1)
    ).any()


def test_abort_frees_its_blocks_and_leaves_the_others_untouched(llama):
    path, batch, expected = llama
    engine = _engine(path, num_blocks=40)
    keep = engine.add_request(batch[0], GREEDY)  # 7 tokens: 2 blocks of 4
    drop = engine.add_request(batch[3], GREEDY)  # 26 tokens: 7 blocks of 4
    engine.step()
    engine.step()
    # after a prefill and a decode each holds its prompt and one output: 8 tokens (2 blocks) and 27 (7 blocks)
    alone = 40 - 2
    assert engine.manager.num_free_blocks == alone - 7
    assert engine.abort_request(drop) is True
    assert engine.manager.num_free_blocks == alone  # no step running: applied at once
    assert engine.abort_request(drop) is False and engine.abort_request("never added") is False
    done = _run_to_end(engine)
    assert list(done) == [keep] and done[keep].outputs[0].token_ids == expected[0]
    assert engine.manager.num_free_blocks == 40


def test_abort_of_a_waiting_request_and_from_a_stepping_engine(llama):
    path, batch, expected = llama
    engine = _engine(path, max_num_seqs=1, max_num_batched_tokens=64)
    running = engine.add_request(batch[1], GREEDY)
    waiting = engine.add_request(batch[2], GREEDY)
    engine.step()
    assert engine.scheduler.waiting and engine.abort_request(waiting)
    assert not engine.scheduler.waiting
    # an abort queued while the step lock is held is applied when the next step starts
    with engine._step_lock:
        blocker = threading.Thread(target=engine.abort_request, args=(running,))
        blocker.start()
        blocker.join()
        assert engine.manager.num_free_blocks < 64 and engine.has_unfinished_requests()
    assert engine.step() == [] and not engine.has_unfinished_requests()
    assert engine.manager.num_free_blocks == 64
    again = engine.add_request(batch[1], GREEDY)
    assert _run_to_end(engine)[again].outputs[0].token_ids == expected[1]


def test_streaming_reports_every_token_once_in_order(llama):
    path, batch, expected = llama
    engine = _engine(path)
    streamed = engine.add_request(batch[3], GREEDY, stream=True)
    quiet = engine.add_request(batch[0], GREEDY)
    seen = []
    while engine.has_unfinished_requests():
        outs = engine.step()
        assert all(o.finished for o in outs if o.request_id == quiet)
        seen += [o for o in outs if o.request_id == streamed]
    assert [len(o.outputs[0].token_ids) for o in seen] == list(range(1, NEW + 1))
    assert [o.finished for o in seen] == [False] * (NEW - 1) + [True]
    assert [o.outputs[0].finish_reason for o in seen] == [None] * (NEW - 1) + ["length"]
    for k, out in enumerate(seen, start=1):
        assert out.outputs[0].token_ids == expected[3][:k]


def test_requests_added_from_another_thread_while_stepping(llama):
    path, batch, expected = llama
    engine = _engine(path)
    added = threading.Event()

    def producer():
        for i, prompt in enumerate(batch):
            engine.add_request(prompt, GREEDY, request_id=f"r{i}")
        added.set()

    thread = threading.Thread(target=producer)
    done = {}
    engine.add_request(batch[0], GREEDY, request_id="main")
    thread.start()
    while not added.is_set() or engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step())
    thread.join()
    assert done["main"].outputs[0].token_ids == expected[0]
    for i, tokens in enumerate(expected):
        assert done[f"r{i}"].outputs[0].token_ids == tokens


def test_bad_requests_queue_nothing(llama):
    path, batch, _ = llama
    engine = _engine(path, num_blocks=8)
    engine.add_request(batch[0], GREEDY, request_id="a")
    with pytest.raises(InvalidArgumentError, match="already in use"):
        engine.add_request(batch[1], GREEDY, request_id="a")
    with pytest.raises(InvalidArgumentError, match="at its longest"):
        engine.add_request(batch[3], SamplingParams(200, temperature=0.0))
    with pytest.raises(InvalidArgumentError, match="request_id"):
        engine.add_request(batch[0], GREEDY, request_id=1.5)
    with pytest.raises(InvalidArgumentError, match="generate runs alone"):
        engine.generate(batch[:1], GREEDY)
    assert list(_run_to_end(engine)) == ["a"]
    assert engine.generate(batch[:1], GREEDY)[0].request_id == 0


def test_step_times_add_up_and_the_kernels_are_warm(llama):
    path, batch, _ = llama
    engine = _engine(path)
    assert engine.warmup_ms > 0
    assert Engine.from_pretrained(path, num_blocks=8, device="cpu", warmup=False).warmup_ms == 0.0
    assert torch.count_nonzero(engine.cache.key_cache[0][0]) == 0  # the warm-up's block is clean again
    engine.generate(batch, GREEDY)
    steps = engine.last_run.steps
    parts = steps[["attention_ms", "rest_of_model_ms", "host_ms"]]
    assert (parts >= 0).all().all() and (steps["attention_ms"] > 0).all()
    assert parts.sum(axis=1).to_numpy() == pytest.approx(steps["step_time_ms"].to_numpy(), rel=1e-9)
