"""Running vLLM's own code as a test reference: vLLM lives in its own virtual environment (`core.serve.vllm_env`:
its pins conflict with the project's), so tests run a script in its interpreter and compare what it prints.

`vllm_python()` is that interpreter (`find_vllm()`: $PAGED_LAB_VLLM_VENV or `.venv-vllm`); a machine without it
skips the test saying how to make it, except under CI=true, where a missing vLLM fails the run.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest


def vllm_python() -> str:
    from core.errors import VLLMUnavailableError
    from core.serve.vllm_env import find_vllm

    try:
        return str(find_vllm().python)
    except VLLMUnavailableError as err:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(err))
        pytest.skip(str(err))


def run_vllm_script(script: Path, payload, timeout: float = 180) -> object:
    """Run `script` under vLLM's interpreter with `payload` as JSON on stdin; its last stdout line as JSON. The
    script starts without PYTHONHASHSEED (it sets what a case needs)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update(OMP_NUM_THREADS="1", VLLM_LOGGING_LEVEL="ERROR", VLLM_CONFIGURE_LOGGING="0")
    done = subprocess.run(
        [vllm_python(), str(script)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
