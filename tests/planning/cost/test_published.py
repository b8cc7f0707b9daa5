"""Published GPU figures against the model: every row of the README table is recomputed and held to the error
the table states; the benchmark settings it reproduces are checked by hand; the fit is a least-squares optimum."""

import math
import re

import numpy as np
import pytest

from core.planning.cost.fits.published import (
    FIGURES,
    bench_settings,
    comparison,
    fit_published,
    gpu_step_defaults,
    predict,
)
from tests.conftest import ROOT

ROW = re.compile(
    r"^\| TensorRT-LLM perf overview \| (?P<model>[^|]+) FP8 \| (?P<gpu>[^|]+) TP(?P<tp>\d) \| (?P<isl>\d+) / "
    r"(?P<osl>\d+) \| (?P<published>[\d,]+) \| (?P<predicted>[\d,]+) \| (?P<error>[-+][\d.]+)% \| (?P<set>[^|]+) \|$"
)


def _table() -> list[dict]:
    rows = [m.groupdict() for m in map(ROW.match, (ROOT / "README.md").read_text().splitlines()) if m]
    assert len(rows) == len(FIGURES) == 40
    return rows


def test_every_stated_error_holds():
    computed = {
        (f["figure"].gpu, f["figure"].tp, f["figure"].isl, f["figure"].osl, f["figure"].model): f
        for f in comparison()
    }
    models = {"Llama-3.1-8B": "llama-3.1-8b", "Llama-3.3-70B": "llama-3.1-70b"}
    gpus = {"H100 SXM 80GB": "h100-80gb", "H200 SXM 141GB": "h200-141gb"}
    for row in _table():
        key = (
            gpus[row["gpu"].strip()],
            int(row["tp"]),
            int(row["isl"]),
            int(row["osl"]),
            models[row["model"]],
        )
        got = computed[key]
        assert got["published"] == float(row["published"].replace(",", ""))
        assert got["predicted"] == pytest.approx(float(row["predicted"].replace(",", "")), abs=0.5)
        assert 100 * got["error"] == pytest.approx(float(row["error"]), abs=0.051)
        assert got["set"] == row["set"].strip()


def test_the_summary_the_page_states():
    errors = np.array([r["error"] for r in comparison()])
    training = np.array([r["set"] == "training" for r in comparison()])
    assert math.sqrt(np.mean(errors[training] ** 2)) == pytest.approx(0.162, abs=0.0005)
    assert math.sqrt(np.mean(errors[~training] ** 2)) == pytest.approx(0.190, abs=0.0005)
    fit = gpu_step_defaults()
    # to the three decimals stated, within a tolerance (a lstsq fit: another CPU's BLAS rounds differently)
    assert fit["bandwidth_efficiency"] == pytest.approx(0.594, abs=5e-4 + 1e-9)
    assert fit["flops_efficiency"] == pytest.approx(0.435, abs=5e-4 + 1e-9)
    assert fit["overhead_s"] == pytest.approx(1.87e-3, abs=5e-6)


def test_bench_settings_by_hand():
    # Llama-3.1-8B FP8 on one H100 (81,559 MiB), 128 / 128: KV memory 0.95 x (85.52e9 - 8.03e9) B at 65,536 B
    # per token (32 layers x 2 x 8 heads x 128 x 1 byte) holds 4,387 requests of 256 tokens; the batch is capped
    # at 4,096 (a multiple of 256) and the tokens at 4,096 x (1 + 1) = 8,192
    figure = next(
        f for f in FIGURES if (f.model, f.gpu, f.isl, f.osl) == ("llama-3.1-8b", "h100-80gb", 128, 128)
    )
    fit = 0.95 * (81_559 * 1024**2 - 8.03e9) / (65_536 * 256)
    assert bench_settings(figure) == (4096, 8192, int(fit)) and int(fit) == 4387


def test_the_fit_is_a_least_squares_optimum_of_the_training_rows():
    fit = fit_published()
    training = [f for f in FIGURES if f.training]

    def loss(params: dict) -> float:
        return sum(math.log(predict(f, params) / f.tokens_per_s) ** 2 for f in training)

    best = loss(fit)
    for name in fit:
        for factor in (0.97, 1.03):
            moved = dict(fit, **{name: min(1.0, fit[name] * factor)})
            if moved != fit:
                assert loss(moved) >= best - 1e-12, (name, factor)
