"""Running vLLM's own code as a test reference: vLLM lives in its own interpreter (its pins conflict with the
project's), so tests call it in a subprocess and compare what it prints.

`vllm_python()`: PAGED_LAB_VLLM_PYTHON when set, else this interpreter when it imports vllm, else the venv that
`.ci/run` makes (`.venv-vllm/bin/python` at the repository root), else None. `require_vllm_python()` skips the
test when there is none, except under CI=true, where a missing vLLM fails the run.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def vllm_python() -> str | None:
    env = os.environ.get("PAGED_LAB_VLLM_PYTHON")
    if env:
        return env
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    local = ROOT / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else None


def require_vllm_python() -> str:
    python = vllm_python()
    if python is None:
        message = "vLLM is not installed: set PAGED_LAB_VLLM_PYTHON to an interpreter that imports vllm"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


def run_vllm_script(script: Path, payload, timeout: float = 120) -> object:
    """Run `script` under vLLM's interpreter with `payload` as JSON on stdin; its stdout parsed as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update(OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="ERROR", VLLM_CONFIGURE_LOGGING="0")
    done = subprocess.run(
        [require_vllm_python(), str(script)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
