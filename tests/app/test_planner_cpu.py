"""The Planner page's "vLLM on a CPU" section under AppTest: scenario A's model in VLLM_CPU_KVCACHE_SPACE, its
blocks, tokens and command (hand-worked in tests/planning/memory/test_cpu_kv.py), all in the URL; bad input is an error."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

from core.page_models.planner_config import encode_config
from tests.conftest import open_page_with
from tests.real_model import SMOLLM2_CONFIG as SMOLLM2

ROOT = Path(__file__).resolve().parents[2]


def planner(params: dict[str, str]) -> AppTest:
    return open_page_with("app_pages/planner.py", params)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_cpu_section_plans_smollm2_in_one_gib():
    at = planner(
        {
            "a_model": "custom",
            "a_config": encode_config({**SMOLLM2, "_name_or_path": "smollm2"}),
            "a_ctx": "2048",
            "a_gpus": "1",
            "a_tp": "1",
            "compare": "0",
            "cpu": "1",
            "cpu_gib": "1",
            "cpu_block": "32",
        }
    )
    assert (metric(at, "num_blocks"), metric(at, "kv_tokens")) == ("1,456", "46,592")
    assert metric(at, "KV dtype") == "bf16 (model bfloat16)"
    assert any(
        c.value == "VLLM_CPU_KVCACHE_SPACE=1 vllm serve smollm2 --block-size 32 --max-model-len 2048"
        for c in at.code
    )
    at.toggle(key="cpu").set_value(False).run()  # off: the section's inputs leave the URL
    assert "cpu_gib" not in at.query_params and not any(m.label == "num_blocks" for m in at.metric)


def test_cpu_section_bad_input_is_an_error():
    at = planner(
        {
            "a_model": "llama-3.1-8b",
            "a_ctx": "131072",
            "a_gpus": "1",
            "a_tp": "1",
            "compare": "0",
            "cpu": "1",
            "cpu_gib": "0",
            "cpu_block": "16",
        }
    )
    errors = " ".join(e.value for e in at.error)
    assert "VLLM_CPU_KVCACHE_SPACE" in errors and "CPU block size" in errors
    # the defaults (4 GiB, 128 tokens): llama-3.1-8b's 131,072-token request does not fit, said with the longest
    assert (metric(at, "num_blocks"), metric(at, "kv_tokens")) == ("256", "32,768")
    assert any("Does not fit" in w.value and "32,768" in w.value for w in at.warning)
