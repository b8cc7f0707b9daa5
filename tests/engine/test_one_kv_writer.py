"""The engine's KV memory has one writer: every call that changes the KV cache manager (allocate, append, mark
computed, fork, free) is made from inside a `Scheduler` method (schedule / allocate / postprocess / abort /
reset), never by the model runner, the sampler or the engine itself (nano-vllm: only the scheduler allocates,
appends, hashes and frees). Checked on a run with n samples, beam search, a sliding-window group, prefix
caching, preemptions and an abort; the run's tokens are also checked to be those of a run without the spy."""

import inspect

import pytest

from core.engine import Engine, SamplingParams
from core.engine.step_executor import EngineExecutor
from core.kv.kv_cache_manager import KVCacheManager
from core.sched import driver
from core.sched import scheduler as scheduler_module

WRITES = ("allocate", "append_token", "mark_computed", "fork", "free", "decode_steps")
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "use_sliding_window": True,
    "sliding_window": 6,
    "layer_types": ["sliding_attention", "full_attention"],
    "eos_token_id": None,
}


def _run(engine: Engine) -> list:
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10], [5] * 13, [7, 8]]
    params = [
        SamplingParams(12, n=3, temperature=1.0, seed=1, ignore_eos=True),
        SamplingParams(10, beam_width=3, ignore_eos=True),
        SamplingParams(14, temperature=0.0, ignore_eos=True),
        SamplingParams(9, n=2, temperature=1.0, seed=2, ignore_eos=True),
    ]
    outputs = engine.generate(prompts, params)
    rid = engine.add_request([3, 1, 4, 1, 5], SamplingParams(20, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort_request(rid)
    engine.step()
    return [[o.token_ids for o in out.outputs] for out in outputs]


def _engine() -> Engine:
    # 40 blocks of 4 tokens over two groups: tight enough that the run preempts
    return Engine.from_config(
        CONFIG, seed=0, num_blocks=40, block_size=4, device="cpu", enable_prefix_caching=True, warmup=False
    )


def test_only_the_scheduler_writes_kv_memory(monkeypatch):
    expected = _run(_engine())
    writers = set()
    for name in WRITES:
        real = getattr(KVCacheManager, name)

        def spy(self, *args, _real=real, **kwargs):
            frames = inspect.stack(0)[1:]
            sched = [f for f in frames if f.filename == scheduler_module.__file__]
            writers.add(sched[-1].function if sched else frames[0].function + " @ " + frames[0].filename)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(KVCacheManager, name, spy)
    engine = _engine()
    assert _run(engine) == expected  # the spy changes nothing
    assert engine.last_run.steps["preemptions"].sum() > 0
    assert writers <= {"schedule", "allocate", "postprocess", "abort", "reset"}, writers
    assert {"schedule", "allocate", "postprocess", "abort"} <= writers
    assert engine.manager.num_free_blocks == engine.num_blocks  # everything given back


@pytest.mark.parametrize("name", ["_step", "step"])
def test_the_step_reads_schedule_run_postprocess(name):
    """`Engine._step` is nano-vllm's loop: schedule, run, postprocess, an observer records (under 15 lines),
    written once in the run driver the simulator uses too; the engine's executor runs the model."""
    lines = [line for line in inspect.getsource(getattr(Engine, name)).splitlines() if line.strip()]
    body = [line for line in lines if not line.strip().startswith(('"""', "#"))]
    assert len(body) < 20 if name == "step" else len(body) < 15
    if name == "_step":
        code = "\n".join(line.split("  #")[0] for line in body)
        assert "driver.run_step(self.scheduler, self._executor, self._observer)" in code
        assert "memory" not in code  # no direct KV access
        phases = (
            "scheduler.schedule()",
            "scheduler.allocate(",
            "executor.execute(",
            "scheduler.postprocess(",
            "observer.on_step(",
        )
        source = inspect.getsource(driver.run_step)
        positions = [source.index(phase, source.index("def run_step")) for phase in phases]
        assert positions == sorted(positions)  # in this order
        assert "self.runner.execute(step)" in inspect.getsource(EngineExecutor.execute)


def test_a_sequences_kv_request_owns_the_same_tokens():
    """One mode (issue 37): the KV cache manager's request owns its tokens (a copy made at admission, a fork, and
    each `grow`), and they stay the sequence's first `num_allocated` tokens through sampling, forks and beams."""
    engine = _engine()
    engine.add_request([1, 2, 3, 4, 5], SamplingParams(6, n=2, temperature=1.0, seed=0, ignore_eos=True))
    engine.add_request([9, 8, 7], SamplingParams(6, beam_width=2, ignore_eos=True))
    checked = 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq in engine.memory.live_seqs():
            assert engine.manager.token_ids(seq.seq_id) == seq.token_ids[: seq.num_allocated]
            assert engine.manager.num_tokens(seq.seq_id) == seq.num_allocated
            checked += 1
    assert checked > 10
