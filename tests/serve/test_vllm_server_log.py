"""A failed `vllm serve` start says its root cause: `VLLMServer.start`'s error carries the log's first error report
(vLLM's engine core logs it at ERROR level; its API server then ends the log with only "see root cause above"),
shortened by `first_error` to its first line and the exception, then the log's end. The log below has the shape
of a real one: a vLLM 0.32 start whose replay port another process held (the failure one run of the suite had)."""

import os
import stat
from types import SimpleNamespace

import pytest

from core.errors import VLLMUnavailableError
from core.serve import vllm_server
from core.serve.vllm_server import VLLMServeConfig, VLLMServer, first_error

CORE = "(EngineCore pid=42) ERROR 12-07 12:25:28 [core.py:1510] "
ENGINE_REPORT = [
    CORE + "EngineCore failed to start.",
    CORE + "Traceback (most recent call last):",
    CORE + '  File "vllm/v1/core/sched/scheduler.py", line 196, in __init__',
    CORE + "    self.kv_event_publisher = EventPublisherFactory.create(",
    CORE + '  File "zmq/backend/cython/_zmq.py", line 190, in zmq.backend.cython._zmq._check_rc',
    CORE + "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:43247')",
]
API_END = [
    "Traceback (most recent call last):",
    '  File "vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup',
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]
LOG = [
    "(APIServer pid=7) INFO 12-07 12:24:58 [utils.py:299] vLLM API server version 0.32.0",
    "(EngineCore pid=42) INFO 12-07 12:25:01 [core.py:133] Initializing a V1 LLM engine (v0.32.0)",
    *ENGINE_REPORT,
    "(APIServer pid=7) INFO 12-07 12:25:29 [launcher.py:254] [shutdown] API server: shutdown triggered",
    *API_END,
]


def _lines(lines: list[str]) -> list[str]:
    return [line + "\n" for line in lines]


def test_first_error_is_the_engine_cores_report_cut_to_its_ends():
    assert first_error(_lines(LOG)) == _lines([ENGINE_REPORT[0], "...", *ENGINE_REPORT[-3:]])
    assert first_error(_lines(LOG), context=10) == _lines(ENGINE_REPORT)  # short enough: whole
    assert first_error(_lines(LOG[:2])) == []
    # a bare traceback (no logger prefix) runs to its exception line; four lines are not worth cutting
    assert first_error(_lines(["starting", *API_END, "after"])) == _lines(API_END)
    assert first_error(_lines([*API_END, "after"]), context=0) == _lines([API_END[0], "...", API_END[-1]])


def test_the_excerpt_is_the_cause_then_the_end(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("".join(_lines(LOG)))
    server = VLLMServer(VLLMServeConfig(model_dir=str(tmp_path)), log_path=log)
    assert server.log_excerpt(lines=4) == "".join(
        _lines([ENGINE_REPORT[0], "...", *ENGINE_REPORT[-3:], "[...]", *API_END])
    )
    assert server.log_excerpt(lines=len(LOG)) == "".join(_lines(LOG))  # the cause is inside the end: once
    log.write_text("".join(_lines(LOG[:2])))
    assert server.log_excerpt() == "".join(_lines(LOG[:2]))  # no error: the end alone


def test_a_failed_start_names_the_root_cause(tmp_path, monkeypatch):
    """A stand-in `vllm` that writes the log above and exits 1, as vLLM did."""
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + "".join(_lines(LOG)) + "EOF\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(vllm_server, "find_vllm", lambda: SimpleNamespace(command=fake))
    server = VLLMServer(VLLMServeConfig(model_dir=str(tmp_path)), log_path=tmp_path / "serve.log")
    with pytest.raises(VLLMUnavailableError) as failed:
        server.start(timeout_s=60)
    message = str(failed.value)
    assert message.startswith("vllm serve did not start (exit 1, 60 s allowed); from ")
    assert ENGINE_REPORT[-1] in message and API_END[-1] in message
    assert message.index(ENGINE_REPORT[-1]) < message.index(API_END[-1])
    assert os.path.exists(server.log_path)
