"""`profile_checks`: the cross-model profile's errors per GPU and per model that a plan carries, held to the saved
run of `python -m bench.slo_published` (recomputed here from its rows), and how a plan finds its own."""

import json
import math
from dataclasses import replace

from core.planning.catalog.hardware import GPUS
from core.planning.catalog.models import MODELS
from core.planning.cost.fits import profile_checks as pc
from core.planning.cost.fits import published_vllm_rows as pvr
from core.planning.predict.deployment import Deployment
from tests.conftest import ROOT

SAVED = json.loads((ROOT / "bench" / "results" / "slo-published.json").read_text())


def _rms(rows: list[dict], key: str) -> float:
    return math.sqrt(sum(r[key] ** 2 for r in rows) / len(rows))


def _checked(status: str, rows: list[dict]) -> pc.Checked:
    ttft, tpot = _rms(rows, "ttft_rel_err"), _rms(rows, "tpot_rel_err")
    return pc.Checked(status, len(rows), round(ttft, 3), round(tpot, 3))


def test_gpu_checks_are_the_saved_runs_rows():
    """H100 / H200: the training rows on each (what the fit reached there); B200: every row on it (no fit sees
    it); KV-limited rows left out, as in the fit."""
    training = [r for r in SAVED["rows"] if r["set"] == "training"]
    held_gpu = [r for r in SAVED["held_out_gpu_rows"] if r["set"] != "kv-limited"]
    expected = {
        gpu: _checked("fitted", [r for r in training if r["gpu"] == gpu])
        for gpu in ("h100-80gb", "h200-141gb")
    }
    expected[SAVED["held_out_gpu"]["gpu"]] = _checked("held out", held_gpu)
    assert expected == pc.GPU_CHECKS


# A plan prices today's vLLM, whose MoE kernels compute routed rows only: for the rows that ran vLLM 0.12's padded
# kernel (docs/slo.md 2c, the eighth stage) its check is the saved run's figure with every expert routed.
ROUTED = SAVED["without_term"]["padded_expert_kernel"]["heldout_by_model"]


def test_model_checks_are_the_saved_runs_rows():
    """Each model's rows' errors in the saved run; Qwen3-235B-A22B's (and its FP8 checkpoint's, which the rows
    served) priced as today's vLLM prices them (routed), and at the rows' own release (vLLM 0.12, `RELEASE_CHECKS`)
    the saved run's figures."""
    for model, check in pc.MODEL_CHECKS.items():
        rows_of = {v: k for k, v in pvr.FP8_CHECKPOINTS.items()}.get(model, model)
        status = "fitted" if rows_of in SAVED["training_by_model"] else "held out"
        rows = [r for r in SAVED["rows"] if r["model"] == rows_of and r["set"] != "kv-limited"]
        if rows_of == "qwen3-235b-a22b":
            routed = ROUTED[rows_of]
            expected = (len(rows), round(routed["ttft_rms_rel_err"], 3), round(routed["tpot_rms_rel_err"], 3))
            assert check == pc.Checked(status, *expected)
            assert pc.RELEASE_CHECKS[("qwen3-235b-a22b-fp8", (0, 12))] == _checked(status, rows)
            continue
        assert check == _checked(status, rows), model
    named = (
        set(SAVED["training_by_model"]) | set(SAVED["heldout_by_model"]) | set(pvr.FP8_CHECKPOINTS.values())
    )
    assert set(pc.MODEL_CHECKS) == named


def test_a_plan_at_the_rows_release_carries_the_release_check():
    fp8, h200 = MODELS["qwen3-235b-a22b-fp8"], GPUS["h200-141gb"]
    at_release = pc.profile_check(pc.CHECKED_ENGINE, fp8, h200, "0.12.0")["model"]
    assert at_release == pc.RELEASE_CHECKS[("qwen3-235b-a22b-fp8", (0, 12))]._asdict()
    for other in (None, "0.16.0"):
        check = pc.profile_check(pc.CHECKED_ENGINE, fp8, h200, other)["model"]
        assert check == pc.MODEL_CHECKS["qwen3-235b-a22b-fp8"]._asdict()
    deployment = Deployment("qwen3-235b-a22b-fp8", "h200-141gb", tp=2, vllm_version="0.12.0")
    assert deployment.profile_check()["model"] == at_release


def test_a_plan_finds_its_gpu_and_model_and_says_what_was_never_measured():
    check = pc.profile_check("vllm-cross-model", MODELS["kimi-k2.5"], GPUS["b200"])
    assert check["gpu"] == {
        "status": "held out",
        "rows": 341,
        "ttft_rms_rel_err": 0.443,
        "tpot_rms_rel_err": 0.197,
    }
    assert check["model"]["status"] == "held out" and check["model"]["rows"] == 45
    # a model read from a config.json with a preset's figures (a fine-tune's) is that preset, whatever its name;
    # another architecture was never measured
    same = pc.profile_check(
        "vllm-cross-model", replace(MODELS["qwen3-32b"], name="my-finetune"), GPUS["h100-80gb"]
    )
    assert same["model"]["status"] == "fitted" and same["gpu"]["status"] == "fitted"
    other = replace(MODELS["qwen3-32b"], intermediate_size=MODELS["qwen3-32b"].intermediate_size + 128)
    never = pc.profile_check("vllm-cross-model", other, GPUS["l40s"])
    assert (
        never["model"]
        == never["gpu"]
        == {
            "status": "not measured",
            "rows": 0,
            "ttft_rms_rel_err": None,
            "tpot_rms_rel_err": None,
        }
    )
    assert pc.profile_check("vllm", MODELS["qwen3-32b"], GPUS["h100-80gb"]) is None
    words = pc.check_words(check, "Kimi-K2.5", "B200")
    assert (
        "B200 (held out, 341 runs): TTFT 44%, TPOT 20%" in words and "Kimi-K2.5 (held out, 45 runs)" in words
    )
    assert "L40S: no published run measured" in pc.check_words(never, "x", "L40S")


def test_a_deployment_carries_its_check():
    deployment = Deployment("llama-3.1-70b", "b200", tp=4)
    assert deployment.profile_check() == pc.profile_check(
        deployment.engine, MODELS["llama-3.1-70b"], GPUS["b200"]
    )
    assert Deployment("llama-3.1-70b", "b200", tp=4, engine="trtllm").profile_check() is None


def test_a_search_carries_each_gpus_check_and_words_for_the_chosen_one():
    gpus = [("h100-80gb", GPUS["h100-80gb"]), ("b200", GPUS["b200"]), ("l40s", GPUS["l40s"])]
    check = pc.search_check("vllm-cross-model", MODELS["llama-3.1-70b"], gpus)
    assert check["model"] == pc.MODEL_CHECKS["llama-3.1-70b"]._asdict()
    assert check["gpus"]["b200"] == pc.GPU_CHECKS["b200"]._asdict()
    assert check["gpus"]["l40s"]["status"] == "not measured"
    words = pc.search_check_words(check, "Llama-3.1-70B", "b200", "B200")
    assert words == pc.check_words(
        pc.profile_check("vllm-cross-model", MODELS["llama-3.1-70b"], GPUS["b200"]), "Llama-3.1-70B", "B200"
    )
    assert pc.search_check("trtllm", MODELS["llama-3.1-70b"], gpus) is None
    assert pc.search_check_words(None, "Llama-3.1-70B", "b200", "B200") == ""
