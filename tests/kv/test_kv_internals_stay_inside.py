"""The KV core's internals stay inside `core/kv` (issue 37): no code outside it reads a request's table records
(`first_held`), the pool's ref-count list (`ref_counts`), a manager's private tail rule (`_tail_is_written`), a
single-type manager's request map (`manager.requests`) or the list of single-type managers (`.managers`). Those
who need an answer ask `KVCacheManager` / `BlockPool` through public methods (`num_free_blocks_after_decode`,
`kv_tokens_read`, `slot_usage`, `ref_count`, ...). Read from the source, like tests/test_layers.py."""

import re

from tests.conftest import ROOT

INTERNALS = re.compile(r"first_held|ref_counts|_tail_is_written|manager\.requests|\.managers\b")
SCANNED = ("core", "app_pages", "ui", "bench")


def readers_of_internals() -> list[str]:
    """`path:line: text` of every line outside core/kv that names a KV-core internal."""
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] == ("core", "kv"):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if INTERNALS.search(line):
                    found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_code_outside_core_kv_reads_its_internals():
    assert readers_of_internals() == []


def test_the_scan_finds_a_reader():
    """The pattern catches each internal (so the test above can fail)."""
    for text in (
        "rec.first_held",
        "pool.ref_counts[b]",
        "m._tail_is_written(n)",
        "manager.requests",
        "kv.managers",
    ):
        assert INTERNALS.search(text), text
    assert not INTERNALS.search("kv.managers_count") and not INTERNALS.search("pool.ref_count(b)")
