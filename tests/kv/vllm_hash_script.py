"""Run by vLLM's interpreter (tests/kv/test_block_hash.py): for each case on stdin, the ints vLLM 0.32's own
request block hasher gives for a prompt, as its KV events carry them. A case: {"tokens", "block_size", "algo",
"seed" (PYTHONHASHSEED or null), "lora": [name, path] or null, "cache_salt": str or null}. Also prints
vLLM's sha256_cbor digest of each of "cbor_values" (hex), to check the lab's CBOR encoder."""

import json
import os
import sys
from types import SimpleNamespace

from vllm.utils.hashing import get_hash_fn_by_name, sha256_cbor
from vllm.v1.core import kv_cache_utils


def hashes(case):
    if case["seed"] is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = case["seed"]
    hash_fn = get_hash_fn_by_name(case["algo"])
    kv_cache_utils.init_none_hash(hash_fn)
    lora = case.get("lora")
    request = SimpleNamespace(  # the attributes vLLM's block hasher reads from a Request
        block_hashes=[],
        num_tokens=len(case["tokens"]),
        all_token_ids=case["tokens"],
        mm_features=[],
        lora_request=SimpleNamespace(lora_name=lora[0], lora_path=lora[1]) if lora else None,
        cache_salt=case.get("cache_salt"),
        prompt_embeds=None,
    )
    hasher = kv_cache_utils.get_request_block_hasher(case["block_size"], hash_fn)
    return [kv_cache_utils.maybe_convert_block_hash(h) for h in hasher(request)]


def to_cbor_value(value):
    if isinstance(value, dict):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, list):
        return tuple(to_cbor_value(v) for v in value)
    return value


payload = json.load(sys.stdin)
print(
    json.dumps(
        {
            "hashes": [hashes(case) for case in payload["cases"]],
            "cbor": [sha256_cbor(to_cbor_value(v)).hex() for v in payload["cbor_values"]],
        }
    )
)
