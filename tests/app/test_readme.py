"""The README and the docs stay true: their Python examples run as written, the README keeps its two quick-start
commands (CI runs the second one verbatim), and the sharing table shows what `bench/sharing.py` saved."""

import json
import re

import pytest

from tests.conftest import ROOT

# The pages whose Python examples run: the README's ten lines and the API reference's sections.
EXAMPLE_PAGES = ("README.md", "docs/api.md")


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)


def test_every_python_example_is_on_a_page_that_runs():
    """A Python example on a page outside EXAMPLE_PAGES would never run: none is allowed to hide there."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    stray = [str(p.relative_to(ROOT)) for p in pages if str(p.relative_to(ROOT)) not in EXAMPLE_PAGES]
    assert [p for p in stray if _python_blocks(p)] == []


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_python_examples_run(page):
    blocks = _python_blocks(page)
    assert blocks, f"{page} has no Python example"
    for block in blocks:
        exec(compile(block, page, "exec"), {"__name__": "readme_example"})


def test_quick_start_is_the_two_commands_ci_runs():
    """The README's first bash block is the two quick-start commands; `.ci/run` runs the second as written."""
    readme = (ROOT / "README.md").read_text()
    first_bash = re.search(r"```bash\n(.*?)```", readme, flags=re.S).group(1).splitlines()
    assert first_bash[0] == "pip install -r requirements.txt && streamlit run app.py"
    assert first_bash[1].startswith("pip install -r requirements-dev.txt")
    assert first_bash[1].endswith("&& python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert first_bash[1] in ci, ".ci/run no longer runs the README's test command"


def _table_after(text: str, marker: str) -> list[list[str]]:
    """The rows of the first markdown table after `marker`, cells stripped, header and rule left out."""
    rows = []
    for line in text[text.index(marker) :].splitlines():
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def test_sharing_table_is_what_the_bench_saved():
    """docs/benchmarks.md's Figure 15 table against bench/results/sharing-smollm2.json (bench/sharing.py's output)."""
    saved = json.loads((ROOT / "bench" / "results" / "sharing-smollm2.json").read_text())
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    ours, paper = _table_after(text, "## Sharing on a real model")
    order = [("parallel sampling", w) for w in (2, 4, 6)] + [("beam search", w) for w in (2, 4, 6)]
    by_mode = {(r["mode"], r["width"]): r for r in saved["rows"]}
    assert [float(c) for c in ours[1:]] == [by_mode[k]["saving_pct"] for k in order]
    assert [float(c) for c in paper[1:]] == [by_mode[k]["paper_pct"] for k in order]
    assert f"{saved['mean_prompt_tokens']} prompt tokens on average" in text
