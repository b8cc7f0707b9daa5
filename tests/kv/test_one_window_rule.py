"""The window rule is written once: no module of `core/` does arithmetic on a window or chunk size except the
KV core's rule itself (`core/kv/single_type_manager.py`), the specs' vLLM memory bound
(`SlidingWindowSpec.max_blocks_per_request`) and the attention kernels' masks (the compute side, which reads
K/V the tables hold). A second copy anywhere else (a policy, the engine, the facade) fails this test: ask the
manager's `num_skipped_tokens` / `num_skipped_blocks` (or `rule_of(spec)`) instead."""

import ast
from pathlib import Path

import core

WINDOW_NAMES = {"window", "sliding_window", "attention_chunk_size", "_window"}
ALLOWED = {
    "core/kv/single_type_manager.py",  # the rule
    "core/kv/specs.py",  # vLLM's max_memory_usage_bytes bound per spec
}
ALLOWED_DIRS = ("core/kernels/",)  # attention masks: which positions a query attends to


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _window_arithmetic(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        arithmetic = isinstance(node, ast.BinOp) and isinstance(
            node.op, ast.Add | ast.Sub | ast.FloorDiv | ast.Mod
        )
        if arithmetic and WINDOW_NAMES & {_name(node.left), _name(node.right)}:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_second_copy_of_the_window_rule():
    root = Path(core.__file__).parent.parent
    copies = {}
    for path in sorted((root / "core").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED or rel.startswith(ALLOWED_DIRS):
            continue
        found = _window_arithmetic(path)
        if found:
            copies[rel] = found
    assert copies == {}


def test_the_scan_sees_a_copy(tmp_path):
    """The scan is not vacuous: the closed forms the callers used to write are caught."""
    sample = tmp_path / "copy.py"
    sample.write_text(
        "def held(last, bs, window):\n    return last // bs - max(0, last - window + 1) // bs + 1\n"
        "def read(lens, w):\n    return min(lens, self.sliding_window)\n"
        "def phase(self, bs):\n    return (self._window - 1) % bs\n"
    )
    assert len(_window_arithmetic(sample)) == 2  # `last - window` and `self._window - 1`
