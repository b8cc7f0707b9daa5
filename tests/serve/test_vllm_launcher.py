"""The Live page's one-click real vLLM (`core.serve.launcher.VLLMLabServer`), without starting one (the run's one
vLLM is tests/vllm_server.py's): the command it runs names loopback only, vLLM's CPU settings and the SmolLM2 folder,
the planner sizes that command's KV cache as the run's vLLM does (1,456 blocks), its load names the served model, and
the page says why when vLLM is not installed."""

import http.server
import itertools
import json
import threading
import time
from typing import ClassVar

import pytest

from core.serve import launcher
from core.serve.launcher import VLLM_CHOICE, MixedLoad, VLLMLabServer, vllm_available


def test_the_command_listens_on_loopback_only(capsys):
    from core.errors import VLLMUnavailableError
    from core.serve.vllm_env import find_vllm

    try:
        vllm = find_vllm()
    except VLLMUnavailableError as err:
        pytest.skip(str(err))
    from tests.real_model import real_model_path

    real_model_path()  # the GGUF the folder is written from
    server = VLLMLabServer((18000, 15557, 15558))
    cmd, env = server.command()
    assert cmd[:2] == [str(vllm.command), "serve"]
    flags = {a: b for a, b in itertools.pairwise(cmd) if a.startswith("--") and not b.startswith("--")}
    assert (
        flags["--host"] == "127.0.0.1"
        and flags["--port"] == "18000"
        and flags["--served-model-name"] == "smollm2"
    )
    events = json.loads(cmd[cmd.index("--kv-events-config") + 1])
    # a host-named endpoint: vLLM connects its PUB there (the page's subscriber binds); the replay ROUTER it binds
    assert events["endpoint"] == "tcp://127.0.0.1:15557" == server.events_endpoint
    assert events["replay_endpoint"] == "tcp://127.0.0.1:15558" == server.replay_endpoint
    assert "*" not in " ".join(cmd) and "--enable-prefix-caching" in cmd
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and flags["--block-size"] == "32"

    # the planner's CPU plan of that folder and those settings: bf16 SmolLM2, 1 GiB, block 32 -> 1,456 blocks
    from core.planning.commands.dispatch import main

    folder = cmd[2]
    assert (
        main(
            [
                "--config",
                f"{folder}/config.json",
                "--cpu-kv-cache-space-gib",
                env["VLLM_CPU_KVCACHE_SPACE"],
                "--block-size",
                flags["--block-size"],
                "--max-model-len",
                flags["--max-model-len"],
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["num_blocks"] == 1_456


class _Recorder(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list] = []

    def do_POST(self):
        _Recorder.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_the_load_names_the_served_model():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        load = MixedLoad(f"http://127.0.0.1:{server.server_port}", True, 1, 3, model="smollm2")
        deadline = time.monotonic() + 30
        while load.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert load.sent == 3 and load.failed == 0
        assert [b["model"] for b in _Recorder.bodies] == ["smollm2"] * 3
        assert all(b["messages"][0]["role"] == "system" for b in _Recorder.bodies)
    finally:
        server.shutdown()


def test_the_page_says_why_without_vllm(monkeypatch, tmp_path, request):
    from ui.jobs import app_limits

    monkeypatch.setenv("PAGED_LAB_VLLM_VENV", str(tmp_path / "no-venv"))
    monkeypatch.setenv("PAGED_LAB_LIVE_HOSTS", "127.0.0.1")
    app_limits.clear()  # the limits another test of this worker cached were read under other hosts
    request.addfinalizer(app_limits.clear)
    monkeypatch.setattr(
        launcher, "DEFAULT_PORTS", (launcher.free_port(), launcher.free_port(), launcher.free_port())
    )
    assert "python -m core.serve.vllm_env install" in vllm_available()
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.switch_page("app_pages/live.py")
    at.query_params["watch"] = "0"
    at.run()
    at.radio(key="lab_model").set_value(VLLM_CHOICE)
    at.run()
    at.button(key="lab_start").click()
    at.run()
    assert not at.exception
    assert any("A real vLLM cannot start here" in e.value and "vllm_env install" in e.value for e in at.error)
    launcher.stop_all()
