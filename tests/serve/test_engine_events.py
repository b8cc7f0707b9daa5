"""The engine's KV cache events come from its KVCacheManager (`Engine(enable_kv_cache_events=True)`): blocks are
announced when their K/V are computed, and the server loop refuses to publish from an engine that queues none."""

import pytest

from core.engine import Engine, SamplingParams
from core.engine.config import TINY_LLAMA
from core.errors import InvalidArgumentError
from core.kv import BlockStored
from core.serve.loop import EngineLoop


def _engine(**kwargs) -> Engine:
    return Engine.from_config(TINY_LLAMA, num_blocks=16, block_size=4, device="cpu", warmup=False, **kwargs)


def test_blocks_are_announced_once_computed_and_equal_the_cache():
    engine = _engine(enable_prefix_caching=True, enable_kv_cache_events=True)
    engine.add_request(list(range(1, 10)), SamplingParams(3, temperature=0.0, ignore_eos=True))
    assert engine.manager.take_events() == []  # queued, allocated at the first step: nothing computed yet
    engine.step()  # the 9-token prompt is computed: its 2 full blocks enter the cache, chained
    (stored,) = engine.manager.take_events()
    assert isinstance(stored, BlockStored) and stored.token_ids == list(range(1, 9))
    assert len(stored.block_hashes) == 2 and stored.parent_block_hash is None
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.manager.take_events() == []  # 11 tokens computed in all: no third full block
    assert set(stored.block_hashes) == {h for _, h in engine.manager.cached_block_hashes()}


def test_the_loop_publishes_only_from_an_engine_that_queues_events():
    with pytest.raises(InvalidArgumentError, match="enable_kv_cache_events"):
        EngineLoop(_engine(enable_prefix_caching=True), metrics=None, publisher=object())
