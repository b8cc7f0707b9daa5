"""The team host for real: `python -m hosting` with two replicas behind nginx, warmed before it says ready (a
progress line per page, every page's default results in the shared cache), pages rendered through the proxy over
Streamlit's websocket protocol, cookie stickiness, and no process or file left after SIGTERM / Ctrl-C (also
when stopped in the middle of its warm-up)."""

import asyncio
import concurrent.futures
import gzip
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hosting.protocol import ProtocolSession
from hosting.proxy import render_config, streamlit_static_dir
from tests.conftest import ROOT, _free_port
from tests.load.server import descendants

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (.ci/run installs it)"
)


READY_S = (
    600  # the warm-up computes every page's default jobs (the Engine page's answer, a kernel sweep) first
)
# What the pages submit at their defaults (app_pages/kernels.py, simulator.py, slo_planner.py, engine.py): the
# Engine page answers with SmolLM2 when it is fetched (chat_outputs), else generates with the tiny model
# (generate_outputs).
DEFAULT_JOBS = {
    "kernel_correctness",
    "kernel_sweep",
    "compare_policies",
    "slo_search",
    "slo_curves",
}
ENGINE_JOBS = {"chat_outputs", "generate_outputs"}


def _start(port: int, replicas: int, log: Path, until: str = "hosting: ready") -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "hosting", "--port", str(port), "--replicas", str(replicas)],
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + READY_S
    while until not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    return process


def _get(port: int, path: str = "/", cookie: str | None = None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Cookie": cookie} if cookie else {}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers, response.read()


def _stopped_cleanly(process: subprocess.Popen, tree: list[int], runtime: Path, how: int) -> None:
    if how == signal.SIGINT:
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole foreground group
    else:
        process.send_signal(how)
    assert process.wait(timeout=40) == 0
    # A worker orphaned by the killed pool exits at its next check of its parent, after its imports (seconds)
    deadline = time.monotonic() + 60
    while (
        alive := [pid for pid in tree if Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid)]
    ) and (time.monotonic() < deadline):
        time.sleep(0.1)
    assert alive == [], [(pid, _describe(pid)) for pid in alive]
    assert not runtime.exists()


def _describe(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        parent = status.split("PPid:")[1].split()[0]
        return (
            f"ppid {parent}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        )
    except OSError:
        return "gone"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _pool_answers(runtime: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(runtime / "pool.sock"))
            return True
        except OSError:
            return False


def _cached_jobs(cache: Path) -> dict[str, str]:
    """Result file name -> the function whose result it holds, for every result in the shared disk cache (a file
    holds the pickled `(job key, value)`, the key being (module, function, args))."""
    found = {}
    for path in sorted(cache.glob("*.result")):
        with path.open("rb") as file:
            key, _ = pickle.load(file)
        found[path.name] = key[1]
    return found


def _check_warm_up_log(text: str, replicas: int) -> None:
    """Before "hosting: ready": one "warming i/N" line per page of the navigation, in order, then the other
    replicas' line and the summary."""
    before_ready = text.split("hosting: ready", 1)[0]
    steps = re.findall(r"hosting: warming (\d+)/(\d+): .* \(/([a-z_]*)\) defaults on replica 1", before_ready)
    total = int(steps[0][1])
    assert [int(i) for i, _, _ in steps] == list(range(1, total + 1)), steps
    assert {"kernels", "simulator", "planner", "slo_planner", "engine"} <= {page for _, _, page in steps}, (
        steps
    )
    if replicas > 1:
        assert f"hosting: warming replicas 2-{replicas}: every page once" in before_ready
    assert "hosting: warm-up done in" in before_ready and "hosting: warm-up:" not in before_ready, text
    assert "hosting: pool workers restarted fresh (" in before_ready, text  # the warm-up's memos given back


def _runtime_dir(log: Path) -> Path:
    """The host's runtime directory, from its ready line ("... cache RUNTIME/results)")."""
    line = next(line for line in log.read_text().splitlines() if line.startswith("hosting: ready"))
    return Path(line.rsplit("cache ", 1)[1].rstrip(")")).parent


def _hand_over(cache: Path, shared: Path) -> None:
    """Copy the results of `cache` missing from `shared` (the suite's other hosts' cache, tests/conftest.py), each
    written to a temporary name and renamed, so a host reading `shared` sees whole files only."""
    for path in cache.glob("*.result"):
        if not (shared / path.name).exists():
            partial = shared / f".{path.name}.{os.getpid()}.tmp"
            shutil.copyfile(path, partial)
            os.replace(partial, shared / path.name)


def test_two_replicas_behind_nginx_serve_a_page_stick_by_cookie_and_stop_on_sigterm(
    tmp_path, shared_host_cache
):
    port = _free_port()
    process = _start(port, 2, tmp_path / "host.log")
    try:
        tree = descendants(process.pid)
        assert (
            len(tree) >= 1 + 1 + 2 + 2 + 1
        )  # launcher, pool, 2 workers, 2 replicas, nginx master (+ workers)
        headers, body = _get(port, "/_stcore/health")
        assert body == b"ok"
        headers, _ = _get(port)
        cookie = headers["Set-Cookie"].split(";")[0]
        assert cookie.startswith("paged_lab_replica=")
        replica = headers["X-Paged-Lab-Replica"]
        assert {_get(port, "/_stcore/health", cookie)[0]["X-Paged-Lab-Replica"] for _ in range(10)} == {
            replica
        }
        seen = {_get(port)[0]["X-Paged-Lab-Replica"] for _ in range(40)}  # fresh browsers spread over both
        assert len(seen) == 2, seen
        _static_files_come_from_nginx(port)

        async def planner():
            async with ProtocolSession(f"http://127.0.0.1:{port}", timeout_s=120) as session:
                return await session.open("planner"), session.replica

        runtime = _runtime_dir(tmp_path / "host.log")
        _check_warm_up_log((tmp_path / "host.log").read_text(), replicas=2)
        cached = _cached_jobs(runtime / "results")  # as the host said ready, before anyone visited
        assert set(cached.values()) >= DEFAULT_JOBS and ENGINE_JOBS & set(cached.values()), cached
        # a thread of its own: a browser test earlier in the session may have left this thread's event loop running
        with concurrent.futures.ThreadPoolExecutor(1) as one:
            render, _ = one.submit(asyncio.run, planner()).result()
            opened = one.submit(asyncio.run, _default_pages(port)).result()
        assert render.charts == 4 and not render.exceptions and not render.errors, render
        for page in opened:
            assert page.charts >= 4 and not page.exceptions and not page.errors, page
        assert _cached_jobs(runtime / "results") == cached  # their defaults were there: nothing new computed
        _hand_over(runtime / "results", shared_host_cache)  # the later hosts need not compute them again
        assert (runtime / "nginx.conf").exists() and (runtime / "pool.sock").exists()
        pool = next(pid for pid in tree if b"hosting.pool" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(pool, signal.SIGKILL)  # the host starts another; its workers see their pipe close and exit
        deadline = time.monotonic() + 60
        while "the pool exited" not in (tmp_path / "host.log").read_text() or not _pool_answers(runtime):
            assert time.monotonic() < deadline, (tmp_path / "host.log").read_text()[-3000:]
            time.sleep(0.1)
        tree = sorted(set(tree) | set(descendants(process.pid)))
    except BaseException:
        process.kill()
        raise
    _stopped_cleanly(process, tree, runtime, signal.SIGTERM)


async def _default_pages(port: int) -> list:
    """The Kernels and Simulator pages opened by one new visitor through the proxy."""
    async with ProtocolSession(f"http://127.0.0.1:{port}", timeout_s=120) as session:
        return [await session.open("kernels"), await session.open("simulator")]


def _static_files_come_from_nginx(port: int) -> None:
    """The page's first script: nginx's copy (no replica answered), the installed file byte for byte, typed as
    JavaScript (module scripts need it), cached for good, and compressed when the browser accepts it."""
    _, page = _get(port)
    script = page.decode().split('src="./static/', 1)[1].split('"', 1)[0]
    headers, body = _get(port, f"/static/{script}")
    assert "X-Paged-Lab-Replica" not in headers
    assert body == (streamlit_static_dir() / script).read_bytes()
    assert headers["Content-Type"].startswith("application/javascript")
    assert "immutable" in headers["Cache-Control"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/static/{script}", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(response.read()) == body


def test_ctrl_c_in_the_middle_of_the_warm_up_stops_every_process(tmp_path):
    """Ctrl-C while the Kernels page's default jobs are being computed, before the proxy ever started."""
    log = tmp_path / "host.log"
    process = _start(_free_port(), 1, log, until="hosting: warming 2/")
    tree = descendants(process.pid)
    pool = next(pid for pid in tree if b"hosting.pool" in Path(f"/proc/{pid}/cmdline").read_bytes())
    arguments = Path(f"/proc/{pool}/cmdline").read_bytes().split(b"\0")
    runtime = Path(arguments[arguments.index(b"--socket") + 1].decode()).parent
    _stopped_cleanly(process, tree, runtime, signal.SIGINT)
    assert "hosting: ready" not in log.read_text(), log.read_text()[-3000:]


def test_the_proxy_config_is_valid_for_nginx(tmp_path):
    config = tmp_path / "nginx.conf"
    config.write_text(render_config("127.0.0.1", 8501, [9001, 9002, 9003], tmp_path, 25_000_000))
    checked = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(config), "-e", "stderr"],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    text = config.read_text()
    assert text.count("server 127.0.0.1:900") == 3 and "hash $paged_lab_route consistent" in text
    assert "client_max_body_size 26000000;" in text
    with pytest.raises(ValueError):
        render_config("127.0.0.1", 8501, [], tmp_path, 1)
