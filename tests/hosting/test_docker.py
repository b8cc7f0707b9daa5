"""The Docker image: static checks of the Dockerfile always; a real build whose health check must pass when a
Docker daemon answers and the base image can be pulled (skipped otherwise, saying why)."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

from tests.conftest import ROOT, _free_port

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_dockerfile_runs_as_a_non_root_user_with_a_health_check():
    assert re.search(r"^FROM python:3\.11-slim", DOCKERFILE, re.M)
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*/_stcore/health", DOCKERFILE, re.M)
    assert '"--server.address", "0.0.0.0"' in DOCKERFILE


def test_dockerfile_pins_torch_like_the_requirements_and_has_a_cuda_switch():
    pinned = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert f"torch=={pinned}" in DOCKERFILE and "torch>=" not in DOCKERFILE
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", DOCKERFILE, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".git" in ignored and ".streamlit/secrets.toml" in ignored


def _docker(*args, timeout=60):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def docker_ready():
    if shutil.which("docker") is None:
        pytest.skip("no docker client on this machine")
    try:
        if _docker("info", timeout=20).returncode != 0:
            pytest.skip("docker client present but no daemon answers (docker info fails)")
        if _docker("pull", "python:3.11-slim", timeout=300).returncode != 0:
            pytest.skip("the base image python:3.11-slim cannot be pulled from here")
    except subprocess.TimeoutExpired:
        pytest.skip("docker did not answer in time")


def test_image_builds_and_its_health_check_passes(docker_ready):
    tag = f"paged-lab-test:{uuid.uuid4().hex[:8]}"
    built = _docker("build", "-t", tag, str(ROOT), timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:]
    port = _free_port()
    name = f"paged-lab-{uuid.uuid4().hex[:8]}"
    run = _docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8501",
        "--health-interval", "2s", "--health-start-period", "60s", tag,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    try:
        deadline = time.monotonic() + 120
        health = ""
        while time.monotonic() < deadline:
            health = _docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
            if health in ("healthy", "unhealthy"):
                break
            time.sleep(2)
        assert health == "healthy", _docker("logs", name).stdout[-4000:]
        user = _docker("exec", name, "id", "-u").stdout.strip()
        assert user != "0"
    finally:
        _docker("rm", "-f", name)
        _docker("rmi", "-f", tag)


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) for each instruction, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    return [tuple(line.split(None, 1)) for line in lines]


def test_the_images_command_and_health_check_work_outside_docker():
    """Without a Docker engine, the next best check: the image's CMD, with the image's ENV, serves the app from a
    copy of what the image copies, and the HEALTHCHECK command passes against it (address and port moved to
    loopback and a free port; as this machine's user, not the image's)."""
    instructions = _dockerfile_instructions()
    env = dict(os.environ)
    for name, args in instructions:
        if name == "ENV":
            env.update(dict(shlex.split(item)[0].split("=", 1) for item in shlex.split(args)))
    command = json.loads(next(args for name, args in instructions if name == "CMD"))
    health = next(args for name, args in instructions if name == "HEALTHCHECK").split(" CMD ", 1)[1]
    port = str(_free_port())
    command = [port if part == "8501" else "127.0.0.1" if part == "0.0.0.0" else part for part in command]
    health = health.replace(":8501/", f":{port}/")  # the shell form: Docker runs it with /bin/sh -c
    assert command[:2] == ["streamlit", "run"] and "127.0.0.1" in command
    server = subprocess.Popen(
        [sys.executable, "-m", *command], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.25)
        checked = subprocess.run(["/bin/sh", "-c", health], capture_output=True, text=True, timeout=10)
        assert checked.returncode == 0, (checked.stdout, checked.stderr)
        assert checked.stdout.strip() == "ok"
    finally:
        server.terminate()
        server.wait(timeout=15)
