"""The real model served in-process once per test session, as the issue reports ran it (`python -m core.serve
--model smollm2-135m-instruct`, 64 blocks, 8 sequences, prefix caching): ~8 s to load on 2 cores."""

import pytest

from tests.real_model import REAL_MODEL, real_model_path
from tests.serve.inproc import InProcessServer


@pytest.fixture(scope="session")
def real_server():
    path = real_model_path()  # skips outside CI when the model cannot be fetched
    server = InProcessServer(
        str(path), served_name=REAL_MODEL, num_blocks=64, max_num_seqs=8, prefix_caching=True
    )
    yield server
    server.stop()
