"""Every relative link in the README and docs/ points at a file that exists and, with a #fragment, at a heading
that page has (GitHub's anchor rule: lower case, punctuation dropped, spaces to hyphens)."""

import re

from tests.conftest import ROOT

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", flags=re.S)


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page) -> set[str]:
    text = CODE.sub("", page.read_text())
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(CODE.sub("", page.read_text())):
            if not re.match(r"[a-z]+:", target):
                yield page, target


def test_anchor_rule_matches_github():
    assert _anchor("KV core: one block pool for every KV cache group (`core/kv/`)") == (
        "kv-core-one-block-pool-for-every-kv-cache-group-corekv"
    )
    assert _anchor("Serving simulator: the paper's experiment") == "serving-simulator-the-papers-experiment"


def test_relative_links_resolve():
    broken = []
    links = list(_links())
    assert len(links) > 20, "the link scan found almost nothing: its pattern is wrong"
    for page, target in links:
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif fragment and fragment not in _anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
