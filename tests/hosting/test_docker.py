"""The Docker image. Always: static checks of the Dockerfile, and its CMD and HEALTHCHECK run outside Docker.
With PAGED_LAB_DOCKER_TEST=1 and a Docker engine: the image built for real on a base made from Debian's packages
(`debootstrap` + `docker import`, since Docker Hub's python:3.11-slim may not be reachable), offline from a
wheelhouse in the build context, then run with `--network host` on 127.0.0.1: its health check passes and a page
renders through the proxy. That build takes minutes (see docs/hosting.md, "Docker"), so CI runs it only when asked.
"""

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import pytest

from hosting.protocol import ProtocolSession
from tests.conftest import ROOT, _free_port
from tests.hosting.docker_build import base_image, build_context, docker, docker_daemon

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_dockerfile_runs_the_team_host_as_a_non_root_user_with_a_health_check():
    assert re.search(
        r"^ARG BASE_IMAGE=python:3\.11-slim$", DOCKERFILE, re.M
    )  # the stock base stays the default
    assert re.search(r"^FROM \$\{BASE_IMAGE\} AS base$", DOCKERFILE, re.M)
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/_stcore/health", DOCKERFILE, re.M)
    assert "python -m hosting" in DOCKERFILE and "PAGED_LAB_ADDRESS=0.0.0.0" in DOCKERFILE


def test_dockerfile_pins_torch_like_the_requirements_and_has_a_cuda_switch():
    pinned = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert f"torch=={pinned}" in DOCKERFILE and "torch>=" not in DOCKERFILE
    # The index is the builder's choice: the default names no registry (pip's default index needs no URL).
    assert re.search(r"^ARG TORCH_INDEX_URL=$", DOCKERFILE, re.M)
    assert '${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}' in DOCKERFILE
    hosts = set(re.findall(r"https?://([^/:\s\"]+)", DOCKERFILE))
    assert hosts <= {"127.0.0.1"}, f"the Dockerfile names hosts beyond loopback: {sorted(hosts)}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".streamlit/secrets.toml" in ignored


def test_the_image_copies_every_package_the_app_imports_and_no_tests_or_wheels():
    copied = set(re.findall(r"^COPY --chown=lab:lab (.+) \S+$", DOCKERFILE, re.M))
    sources = {part.rstrip("/") for line in copied for part in line.split()}
    imported = set()
    for path in [ROOT / "app.py", *(ROOT / "app_pages").glob("*.py"), *(ROOT / "hosting").glob("*.py")]:
        imported |= set(re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.M))
    local = {name for name in imported if (ROOT / name).is_dir() or (ROOT / f"{name}.py").exists()}
    assert local <= sources, local - sources
    assert {"app.py", ".streamlit", "hosting", "pyproject.toml"} <= sources
    assert "tests" not in sources and "wheelhouse" not in sources and "." not in sources


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) for each instruction of the final stage's kind, continuation lines joined and
    comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    return [tuple(line.split(None, 1)) for line in lines]


def test_the_images_command_and_health_check_work_outside_docker(tmp_path, shared_host_cache):
    """Without a Docker engine, the next best check: the image's CMD, with the image's ENV (address and port
    moved to loopback and a free port, one replica), starts the team host from this checkout, and the
    HEALTHCHECK command passes against it; SIGTERM stops it."""
    instructions = _dockerfile_instructions()
    env = dict(os.environ)
    for name, args in instructions:
        if name == "ENV":
            for item in shlex.split(args):
                key, value = item.split("=", 1)
                env[key] = value.replace("$PATH", os.environ["PATH"])
    port = str(_free_port())
    env.update(
        PAGED_LAB_ADDRESS="127.0.0.1", PAGED_LAB_PORT=port, PAGED_LAB_REPLICAS="1", PAGED_LAB_WORKERS="1"
    )
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"  # this machine's python, not /opt/venv's
    env.pop("PAGED_LAB_MODEL_ROOT")  # /models does not exist here
    env["PAGED_LAB_CACHE_DIR"] = str(shared_host_cache)  # a volume's cache: what the suite's hosts computed
    command = json.loads(next(args for name, args in instructions if name == "CMD"))
    health = next(args for name, args in instructions if name == "HEALTHCHECK").split(" CMD ", 1)[1]
    log = tmp_path / "host.log"
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600  # it says ready after its warm-up (every page's default jobs)
        while "hosting: ready" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        checked = subprocess.run(
            ["/bin/sh", "-c", health], capture_output=True, text=True, timeout=10, env=env
        )
        assert checked.returncode == 0, (checked.stdout, checked.stderr)
        assert checked.stdout.strip() == "ok"
    finally:
        server.terminate()
        assert server.wait(timeout=40) == 0


@pytest.mark.skipif(
    os.environ.get("PAGED_LAB_DOCKER_TEST") != "1", reason="set PAGED_LAB_DOCKER_TEST=1 (minutes)"
)
def test_image_builds_on_a_debian_base_and_serves_a_page_through_its_proxy(tmp_path):
    with docker_daemon():
        base = base_image(tmp_path)
        context = build_context(tmp_path / "context")
        tag = f"paged-lab-test:{os.getpid()}"
        started = time.monotonic()
        built = docker(
            "build",
            "-t",
            tag,
            "--build-arg",
            f"BASE_IMAGE={base}",
            "--build-arg",
            "PIP_OFFLINE=1",
            str(context),
            timeout=1800,
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        build_s = time.monotonic() - started
        port = _free_port()
        name = f"paged-lab-{os.getpid()}"
        run = docker(
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "-e",
            "PAGED_LAB_ADDRESS=127.0.0.1",
            "-e",
            f"PAGED_LAB_PORT={port}",
            "-e",
            "PAGED_LAB_REPLICAS=2",
            "--health-interval",
            "2s",
            "--health-start-period",
            "120s",
            tag,
        )
        assert run.returncode == 0, run.stderr
        try:
            deadline = time.monotonic() + 180
            health = ""
            while time.monotonic() < deadline and health not in ("healthy", "unhealthy"):
                time.sleep(2)
                health = docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            assert health == "healthy", docker("logs", name).stdout[-4000:]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
                assert response.headers["X-Paged-Lab-Replica"].startswith("127.0.0.1:")

            async def planner():
                async with ProtocolSession(f"http://127.0.0.1:{port}", timeout_s=180) as session:
                    return await session.open("planner")

            render = asyncio.run(planner())
            assert render.charts == 4 and not render.exceptions and not render.errors, render
            assert docker("exec", name, "id", "-u").stdout.strip() != "0"
            stopped = docker("stop", "--time", "30", name, timeout=60)
            assert stopped.returncode == 0
            assert docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
            print(f"docker build took {build_s:.0f} s")
        finally:
            docker("rm", "-f", name)
            docker("rmi", "-f", tag)
