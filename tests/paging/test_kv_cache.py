import pytest
import torch

from core.device import DEFAULT_MAX_BYTES, format_bytes, memory_budget_bytes
from core.errors import InvalidArgumentError, MemoryBudgetError
from core.paging.block_manager import BlockManager
from core.paging.kv_cache import KVCache, PagedKVCache, kv_cache_bytes


def small_cache(**overrides):
    kwargs = {
        "num_layers": 2,
        "num_blocks": 8,
        "block_size": 4,
        "num_kv_heads": 2,
        "head_dim": 3,
        "dtype": torch.float32,
        "device": "cpu",
    }
    kwargs.update(overrides)
    return KVCache(**kwargs)


def test_layout_and_bytes():
    cache = small_cache()
    assert len(cache.key_cache) == len(cache.value_cache) == 2
    assert cache.key_cache[0].shape == (8, 4, 2, 3)  # [num_blocks, block_size, num_kv_heads, head_dim]
    assert cache.nbytes == 2 * 2 * 8 * 4 * 2 * 3 * 4  # K and V, layers, blocks, slots, heads, dims, fp32
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in cache.key_cache + cache.value_cache)


def test_opt_13b_bytes_per_token_match_the_paper():
    # PagedAttention paper, section 3: 2 x 5120 hidden x 40 layers x 2 bytes = 800 KiB per token
    per_token = kv_cache_bytes(40, 1, 1, 40, 128, torch.float16)
    assert per_token == 819_200 == 800 * 1024


def test_write_scatters_to_slots_and_gather_reads_them_back_in_order():
    cache = small_cache()
    table = [5, 2]  # logical block 0 -> physical 5, logical 1 -> physical 2
    num_tokens = 6
    slots = [table[p // 4] * 4 + p % 4 for p in range(num_tokens)]
    key = torch.randn(num_tokens, 2, 3)
    value = torch.randn(num_tokens, 2, 3)
    cache.write(1, slots, key, value)
    k, v = cache.gather(1, table, num_tokens)
    torch.testing.assert_close(k, key)
    torch.testing.assert_close(v, value)
    assert cache.key_cache[1][5, 1].equal(key[1])  # token 1 is block 5, offset 1
    assert cache.key_cache[1][2, 1].equal(key[5])  # token 5 is block 2, offset 1
    assert cache.key_cache[0].abs().sum() == 0  # other layers untouched


def test_copy_blocks_copies_every_layer():
    cache = small_cache()
    for layer in range(2):
        cache.key_cache[layer][3] = layer + 1.0
        cache.value_cache[layer][3] = -(layer + 1.0)
    cache.copy_blocks([(3, 6)])
    for layer in range(2):
        assert cache.key_cache[layer][6].eq(layer + 1.0).all()
        assert cache.value_cache[layer][6].eq(-(layer + 1.0)).all()


def test_bad_arguments_raise_typed_errors():
    cache = small_cache()
    with pytest.raises(InvalidArgumentError, match=r"slot ids must be in \[0, 32\)"):
        cache.write(0, [32], torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))
    with pytest.raises(InvalidArgumentError, match="shape"):
        cache.write(0, [0], torch.zeros(1, 3, 3), torch.zeros(1, 3, 3))
    with pytest.raises(InvalidArgumentError, match="layer"):
        cache.gather(2, [0], 1)
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        cache.gather(0, [0], 5)
    with pytest.raises(InvalidArgumentError, match="block ids"):
        cache.copy_blocks([(0, 8)])
    with pytest.raises(InvalidArgumentError, match="dtype"):
        small_cache(dtype=torch.int8)
    with pytest.raises(InvalidArgumentError, match="head_dim"):
        small_cache(head_dim=0)


def test_memory_budget_is_checked_before_allocating():
    with pytest.raises(MemoryBudgetError) as info:
        small_cache(max_bytes=100)
    assert info.value.requested_bytes == 3072 and info.value.allowed_bytes == 100
    message = str(info.value)
    assert "3,072 bytes" in message and "budget of 100 bytes" in message and "PAGED_LAB_MAX_BYTES" in message
    assert "2 layers" in message  # what was asked for
    # the default budget refuses a 1 TiB cache without touching memory
    with pytest.raises(MemoryBudgetError):
        KVCache(80, 1_000_000, 16, 8, 128, torch.bfloat16, device="cpu")


def test_operator_budget_from_environment(monkeypatch):
    monkeypatch.delenv("PAGED_LAB_MAX_BYTES", raising=False)
    assert memory_budget_bytes() == DEFAULT_MAX_BYTES == 4 * 1024**3
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "1000")
    assert memory_budget_bytes() == 1000
    with pytest.raises(MemoryBudgetError):
        small_cache()
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match="not an integer"):
        memory_budget_bytes()


def test_format_bytes():
    assert format_bytes(819_200) == "800.0 KiB"
    assert format_bytes(12 * 1024**3) == "12.0 GiB"
    assert format_bytes(1023) == "1,023 B"


def test_paged_kv_cache_copy_on_write_keeps_forks_apart():
    manager = BlockManager(num_blocks=8, block_size=4)
    paged = PagedKVCache(manager, small_cache())
    manager.allocate("p", [0])
    paged.cache.write(0, [manager.block_table("p")[0] * 4], torch.ones(1, 2, 3), torch.ones(1, 2, 3))
    manager.fork("p", "c")
    child_kv = torch.full((2, 2, 3), 7.0)
    result = paged.append("c", 1, child_kv, child_kv)
    assert result.cow is not None
    parent_kv = torch.full((2, 2, 3), -7.0)
    paged.append("p", 1, parent_kv, parent_kv)
    k_child, _ = paged.cache.gather(0, manager.block_table("c"), 2)
    k_parent, _ = paged.cache.gather(0, manager.block_table("p"), 2)
    assert k_child[0].eq(1).all() and k_parent[0].eq(1).all()  # the shared prompt token was copied
    assert k_child[1].eq(7).all() and k_parent[1].eq(-7).all()  # and the writes did not leak
    with pytest.raises(InvalidArgumentError):
        PagedKVCache(BlockManager(4, 4), small_cache())


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    cache = KVCache(np.int64(1), np.int64(4), np.int32(2), np.int64(1), np.int64(2), device="cpu")
    assert (cache.num_blocks, cache.block_size) == (4, 2) and type(cache.num_blocks) is int
    cache.write(np.int64(0), [3], torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    key, _ = cache.gather(np.int64(0), [1], np.int64(2))
    assert key[1].tolist() == [[1.0, 1.0]]  # slot 3 = block 1, offset 1
