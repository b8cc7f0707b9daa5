"""Operator limits: defaults, parsing from a mapping, typed errors naming the variable, and the delegation of
core.device's memory budget to them."""

import pytest

from core.device import memory_budget_bytes
from core.errors import InvalidArgumentError, LimitConfigError, LimitExceededError
from core.limits import SPECS, Limits, read_limit


def test_defaults_are_todays_budget_and_page_caps():
    limits = Limits.from_mapping({})
    assert limits.max_tensor_bytes == 4 * 1024**3
    assert limits.max_simulated_requests == 10_000
    assert limits.workers >= 1 and limits.max_queued_jobs == 16
    assert limits.job_timeout_s == 120.0
    assert limits.model_root == ""  # any local directory


def test_values_read_from_the_mapping():
    limits = Limits.from_mapping(
        {
            "PAGED_LAB_MAX_BYTES": "1_000_000",
            "PAGED_LAB_MAX_REQUESTS": " 500 ",
            "PAGED_LAB_JOB_TIMEOUT_S": "2.5",
            "PAGED_LAB_WORKERS": "3",
            "PAGED_LAB_MAX_QUEUED_JOBS": "4",
            "PAGED_LAB_MAX_UPLOAD_BYTES": "1e6",
            "PAGED_LAB_CACHE_ENTRIES": "0",
            "PAGED_LAB_CACHE_TTL_S": "60",
            "PAGED_LAB_MODEL_ROOT": " /srv/my_models ",  # a path: underscores kept, spaces stripped
            "UNRELATED": "x",
        }
    )
    assert limits == Limits(1_000_000, 500, 2.5, 3, 4, 1_000_000, 0, 60.0, model_root="/srv/my_models")
    assert Limits.from_mapping(limits.as_environ()) == limits  # a worker reads back exactly these


def test_blank_values_take_the_default():
    assert Limits.from_mapping({"PAGED_LAB_MAX_BYTES": "  "}).max_tensor_bytes == 4 * 1024**3


@pytest.mark.parametrize(
    ("variable", "raw", "match"),
    [
        ("PAGED_LAB_MAX_BYTES", "lots", "not an integer"),
        ("PAGED_LAB_MAX_BYTES", "0", "between 1"),
        ("PAGED_LAB_MAX_BYTES", "-5", "between 1"),
        ("PAGED_LAB_MAX_BYTES", "1.5", "not an integer"),
        ("PAGED_LAB_WORKERS", "1000", "between 1 and 64"),
        ("PAGED_LAB_JOB_TIMEOUT_S", "nan", "finite"),
        ("PAGED_LAB_JOB_TIMEOUT_S", "inf", "finite"),
        ("PAGED_LAB_JOB_TIMEOUT_S", "soon", "not a number"),
        ("PAGED_LAB_MAX_QUEUED_JOBS", "0", "between 1"),
        ("PAGED_LAB_CACHE_TTL_S", "0", "between 1"),
        ("PAGED_LAB_MODEL_ROOT", "models", "absolute directory path"),
        ("PAGED_LAB_MODEL_ROOT", "/models\0", "absolute directory path"),
    ],
)
def test_bad_values_raise_a_typed_error_naming_the_variable(variable, raw, match):
    with pytest.raises(LimitConfigError, match=match) as caught:
        Limits.from_mapping({variable: raw})
    assert caught.value.variable == variable and variable in str(caught.value)
    assert isinstance(caught.value, InvalidArgumentError)


def test_the_constructor_checks_too():
    with pytest.raises(LimitConfigError, match="PAGED_LAB_WORKERS"):
        Limits(workers=0)
    with pytest.raises(LimitConfigError, match="integer"):
        Limits(max_queued_jobs=2.0)
    with pytest.raises(LimitConfigError):
        Limits(max_tensor_bytes=True)


def test_read_limit_ignores_other_bad_variables():
    mapping = {"PAGED_LAB_WORKERS": "many", "PAGED_LAB_MAX_BYTES": "2048"}
    assert read_limit("max_tensor_bytes", mapping) == 2048
    with pytest.raises(LimitConfigError, match="PAGED_LAB_WORKERS"):
        read_limit("workers", mapping)


def test_device_budget_delegates_to_the_limits(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_BYTES", "4096")
    assert memory_budget_bytes() == 4096 == Limits.from_env().max_tensor_bytes


def test_checks_name_the_limit():
    limits = Limits(max_simulated_requests=100, max_upload_bytes=10)
    limits.check_requests(100)
    with pytest.raises(LimitExceededError, match=r"101 requests.*100.*PAGED_LAB_MAX_REQUESTS"):
        limits.check_requests(101)
    limits.check_upload(10)
    with pytest.raises(LimitExceededError, match="PAGED_LAB_MAX_UPLOAD_BYTES") as caught:
        limits.check_upload(11)
    assert caught.value.variable == "PAGED_LAB_MAX_UPLOAD_BYTES"


def test_rows_cover_every_limit_with_separators():
    rows = Limits().rows()
    assert [r["variable"] for r in rows] == [s.variable for s in SPECS.values()]
    assert rows[0]["value"] == "4,294,967,296 bytes (4.00 GiB)"
    assert rows[1]["value"] == "10,000 requests"
    assert next(r for r in rows if r["variable"] == "PAGED_LAB_MODEL_ROOT") == {
        "limit": "Directory the Engine page may load models from",
        "value": "not set: any local directory",
        "variable": "PAGED_LAB_MODEL_ROOT",
    }


def test_a_value_of_one_reads_singular():
    rows = {r["variable"]: r["value"] for r in Limits(workers=1, job_timeout_s=1.0, max_queued_jobs=1).rows()}
    assert rows["PAGED_LAB_WORKERS"] == "1 process"
    assert rows["PAGED_LAB_JOB_TIMEOUT_S"] == "1 second"
    assert rows["PAGED_LAB_MAX_QUEUED_JOBS"] == "1 job"
    assert {r["variable"]: r["value"] for r in Limits(workers=2).rows()}["PAGED_LAB_WORKERS"] == "2 processes"
