"""vLLM's block hashes (`core.kv.block_hash`) against vLLM 0.32's own hasher, run in vLLM's interpreter
(tests/kv/vllm_hash_script.py; skipped without vLLM, a failure under CI=true), and against a sha256 worked by
hand here with hashlib and pickle. The KV core keyed by `VllmBlockHasher` announces the same ints."""

import hashlib
import pickle
import random
from pathlib import Path

import pytest

from core.errors import BlockHashError, InvalidArgumentError
from core.kv import FullAttentionSpec, KVCacheManager
from core.kv.block_hash import (
    VllmBlockHasher,
    cbor_canonical,
    none_hash_seed,
    vllm_block_hashes,
)
from core.kv.events import BlockStored
from core.paging.block_manager import BlockManager
from tests.vllm_reference import run_vllm_script

SCRIPT = Path(__file__).with_name("vllm_hash_script.py")


def test_one_block_worked_by_hand(monkeypatch):
    """sha256 of pickle((NONE_HASH, tokens, None)), NONE_HASH = sha256(pickle("vllm-none-hash")); the event
    carries the digest's low 64 bits, read big-endian. The second block chains on the first's full digest."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def digest(value) -> bytes:
        return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    none_hash = digest("vllm-none-hash")
    tokens = list(range(1000, 1040))
    first = digest((none_hash, tuple(tokens[:32]), None))
    assert vllm_block_hashes(tokens, 32) == [int.from_bytes(first[24:], "big")]  # 8 tokens left: no 2nd block
    first = digest((none_hash, tuple(tokens[:20]), None))
    second = digest((first, tuple(tokens[20:]), None))
    assert vllm_block_hashes(tokens, 20) == [int.from_bytes(d, "big") % 2**64 for d in (first, second)]
    assert vllm_block_hashes(tokens[:31], 32) == []


def test_seed_rule(monkeypatch):
    """PYTHONHASHSEED, when set, is the seed; else "vllm-none-hash"; an explicit hash_seed wins over both."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert none_hash_seed() == "vllm-none-hash"
    default = vllm_block_hashes(range(64), 32)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert none_hash_seed() == "0"
    seeded = vllm_block_hashes(range(64), 32)
    assert seeded != default and seeded == vllm_block_hashes(range(64), 32, hash_seed="0")
    assert vllm_block_hashes(range(64), 32, hash_seed="vllm-none-hash") == default


def _cases():
    rng = random.Random(36)
    prompt = [rng.randrange(49_152) for _ in range(200)]
    edges = [0, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63]  # every CBOR head size
    cases = []
    for algo in ("sha256", "sha256_cbor"):
        cases += [
            {"tokens": prompt, "block_size": 32, "algo": algo, "seed": None},
            {"tokens": prompt[:100], "block_size": 16, "algo": algo, "seed": "0"},
            {"tokens": edges * 3, "block_size": 5, "algo": algo, "seed": "1234"},
            {
                "tokens": prompt,
                "block_size": 32,
                "algo": algo,
                "seed": None,
                "lora": ["sql", "/adapters/sql"],
            },
            {"tokens": prompt, "block_size": 32, "algo": algo, "seed": None, "cache_salt": "tenant-7"},
            {
                "tokens": prompt,
                "block_size": 64,
                "algo": algo,
                "seed": None,
                "lora": ["a", "/p"],
                "cache_salt": "s",
            },
        ]
    return cases


def _lab(case) -> list[int]:
    extra = {}
    if case.get("lora"):
        extra.update(lora_name=case["lora"][0], lora_path=case["lora"][1])
    if case.get("cache_salt"):
        extra["cache_salt"] = case["cache_salt"]
    return vllm_block_hashes(
        case["tokens"], case["block_size"], case["algo"], extra_keys=extra or None, hash_seed=case["seed"]
    )


CBOR_VALUES = [
    None,
    True,
    False,
    0,
    23,
    24,
    255,
    256,
    65_535,
    65_536,
    2**32,
    2**64 - 1,
    -1,
    -24,
    -25,
    -(2**64),
    "",
    "vllm-none-hash",
    "é✓",
    {"bytes": ""},
    {"bytes": "00ff" * 20},
    [],
    [1, [2, [None, "x"]]],
    ["x" * 300, list(range(30))],
]


def _cbor_value(value):
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return tuple(_cbor_value(v) for v in value)
    return value


def test_equal_to_vllms_own_hasher():
    """Every case (both algorithms, PYTHONHASHSEED set or not, LoRA and cache_salt extra keys, token ids at every
    CBOR size boundary) gives vLLM's ints, block for block; the CBOR encoder hashes like cbor2's canonical mode."""
    cases = _cases()
    reference = run_vllm_script(SCRIPT, {"cases": cases, "cbor_values": CBOR_VALUES})
    for case, expected in zip(cases, reference["hashes"], strict=True):
        assert len(expected) == len(case["tokens"]) // case["block_size"] > 0
        assert _lab(case) == expected, case
    ours = [hashlib.sha256(cbor_canonical(_cbor_value(v))).hexdigest() for v in CBOR_VALUES]
    assert ours == reference["cbor"]


def test_extra_keys_change_the_right_blocks():
    tokens = list(range(96))
    plain = vllm_block_hashes(tokens, 32)
    salted = vllm_block_hashes(tokens, 32, extra_keys={"cache_salt": "s"})
    lora = vllm_block_hashes(tokens, 32, extra_keys={"lora_name": "a", "lora_path": "/p"})
    assert all(
        a != b for a, b in zip(plain, salted, strict=True)
    )  # the salt changes block 0, hence every child
    assert all(a != b for a, b in zip(plain, lora, strict=True))
    assert (
        vllm_block_hashes(tokens, 32, extra_keys={"cache_salt": ""}) == plain
    )  # vLLM: an empty salt is none


@pytest.mark.parametrize(
    ("kwargs", "feature"),
    [
        ({"hash_algo": "xxhash"}, "xxhash"),
        ({"hash_algo": "xxhash_cbor"}, "xxhash_cbor"),
        ({"hash_algo": "md5"}, "hash_algo"),
        ({"extra_keys": {"mm_hashes": ["abc"]}}, "multimodal extra keys"),
        ({"extra_keys": {"prompt_embeds": "x"}}, "prompt-embeds extra keys"),
        ({"extra_keys": {"lora_name": "a"}}, "lora_path"),
        ({"extra_keys": {"lora_path": "/p"}}, "lora_name"),
        ({"extra_keys": {"tenant": "x"}}, "extra_keys"),
        ({"extra_keys": {"cache_salt": 5}}, "cache_salt"),
    ],
)
def test_refused_by_name(kwargs, feature):
    with pytest.raises(BlockHashError) as info:
        vllm_block_hashes(range(64), 32, **kwargs)
    assert info.value.feature == feature
    again = pickle.loads(pickle.dumps(info.value))
    assert (str(again), again.feature) == (str(info.value), feature)


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="block_size"):
        vllm_block_hashes(range(64), 0)
    with pytest.raises(BlockHashError, match=r"token_ids\[1\]"):
        vllm_block_hashes([1, 2.0, 3], 1)
    with pytest.raises(BlockHashError, match="64 bits"):
        vllm_block_hashes([2**70], 1, "sha256_cbor")


def test_hasher_pickles_and_compares():
    hasher = VllmBlockHasher("sha256_cbor", extra_keys={"cache_salt": "s"}, hash_seed="7")
    again = pickle.loads(pickle.dumps(hasher))
    assert again == hasher and hash(again) == hash(hasher)
    assert again(None, (1, 2)) == hasher(None, (1, 2)) and again != VllmBlockHasher()


def _stored(events) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_kv_core_announces_vllms_hashes(algo):
    """KVCacheManager and BlockManager keyed by VllmBlockHasher: BlockStored carries vllm_block_hashes of each
    prompt (parents chained as ints), a shared prefix hits, and eviction removes the same ints."""
    rng = random.Random(5)
    shared = [rng.randrange(1000) for _ in range(64)]
    prompts = [shared + [rng.randrange(1000) for _ in range(40)] for _ in range(3)]
    hasher = VllmBlockHasher(algo)
    kv = KVCacheManager(
        [FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8)],
        12,
        enable_prefix_caching=True,
        enable_kv_cache_events=True,
        block_hasher=hasher,
    )
    bm = BlockManager(12, 16, enable_prefix_caching=True, enable_kv_cache_events=True, block_hasher=hasher)
    announced_kv, announced_bm = [], []
    for i, prompt in enumerate(prompts):
        expected = vllm_block_hashes(prompt, 16, algo)
        hit = kv.allocate(i, prompt)
        kv.mark_computed(i, len(prompt))
        bm.allocate(i, prompt)
        events_kv, events_bm = kv.take_events(), bm.take_events()
        assert hit == (0 if i == 0 else 64)
        # the first request announces every full block; later ones only the blocks past the shared prefix
        assert _stored(events_kv) == expected[0 if i == 0 else 4 :] == _stored(events_bm)
        first = next(e for e in events_kv if isinstance(e, BlockStored))
        assert first.parent_block_hash == (None if i == 0 else expected[3])
        assert {h for _, h in kv.cached_block_hashes()} >= set(expected)
        announced_kv += _stored(events_kv)
        announced_bm += _stored(events_bm)
        kv.free(i)
        bm.free(i)
    assert announced_kv == announced_bm


def test_prefix_chains_give_the_keys_hashing_every_block_gives():
    """`PrefixChains.keys` (a shared prefix's chain reused) equals `extend_block_hashes` from scratch (the
    reference) for prompts that share prefixes of any length, diverge inside a block, grow turn by turn, are
    shorter than a stored chain, or evict each other (a tiny token budget); with vLLM's hasher it hashes."""
    from core.kv.block_hash import PrefixChains, extend_block_hashes

    rng = random.Random(7)
    heads = [tuple(rng.randrange(1 << 40) for _ in range(rng.randrange(1, 70))) for _ in range(4)]
    prompts = []
    for _ in range(300):
        head = heads[rng.randrange(4)][: rng.randrange(1, 70)]
        tail = tuple(rng.randrange(1 << 40) for _ in range(rng.randrange(0, 40)))
        prompts.append(head + tail)
        if rng.random() < 0.3:  # a conversation's next turn: the last prompt, then more
            prompts.append(prompts[-1] + tuple(rng.randrange(50) for _ in range(rng.randrange(1, 30))))
    for block_size, budget in ((4, 1 << 20), (16, 1 << 20), (4, 40)):
        chains = PrefixChains(block_size, max_tokens=budget)
        for prompt in prompts:
            num_blocks = rng.randrange(0, len(prompt) // block_size + 1)
            expected: list = []
            extend_block_hashes(expected, prompt, block_size, num_blocks)
            keys, known = chains.lookup(prompt, num_blocks)
            assert keys == expected
            assert known == [
                (expected[i - 1] if i else None, prompt[i * block_size : (i + 1) * block_size])
                for i in range(len(known))
            ]  # the leading blocks' (parent, tokens), as the pool keys them
            assert chains._tokens == sum(len(entry[0]) for entry in chains._chains.values()) <= budget
    hasher = VllmBlockHasher()
    chains = PrefixChains(4, hasher)
    for prompt in prompts[:20]:
        expected = []
        extend_block_hashes(expected, prompt, 4, len(prompt) // 4, hasher)
        assert chains.keys(prompt, len(prompt) // 4) == expected
