"""Every link in the docs resolves: a relative Markdown link names a file that exists and, with
an anchor, a heading (or an explicit ``<a id>``) of that file; a ``docs/….md#anchor`` or a
``bench/…`` path named in the code, the tests or the current docs exists. Scripts and docs move
(bench/ was regrouped, the GPU notebook moved to docs/history/); a reference left behind fails
here, not in a reader's hands."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([REPO / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("bench/**/*.md"),
                   *REPO.glob("tests/**/*.md")])
CODE = sorted([*REPO.glob("tuiprof/**/*.py"), *REPO.glob("tests/**/*.py"),
               *REPO.glob("bench/**/*.py"), *REPO.glob("bench/**/*.sh"), *REPO.glob("tests/**/*.sh")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
DOC_REF = re.compile(r"(?<![\w/.])(docs/[\w/.-]+\.md)(?:#([\w-]+))?")
BENCH_REF = re.compile(r"(?<![\w/.])(bench/[\w/.-]+\.(?:py|sh|md))")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    text = _prose(path.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a id=\"([^\"]+)\"", text))
    for h in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        s = _slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return frozenset(out)


def _check(target: Path, anchor: str | None, where: str) -> str | None:
    if not target.exists():
        return f"{where}: {target.relative_to(REPO) if target.is_relative_to(REPO) else target} does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{where}: no heading #{anchor} in {target.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("md", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_markdown_links_resolve(md):
    bad = []
    for link in LINK.findall(_prose(md.read_text())):
        if re.match(r"[a-z]+:", link):
            continue                                     # http:, https:, mailto:
        path, _, anchor = link.partition("#")
        target = (md.parent / path).resolve() if path else md
        if (why := _check(target, anchor or None, str(md.relative_to(REPO)))):
            bad.append(why)
    assert not bad, "\n".join(bad)


def test_doc_and_bench_paths_named_in_code_and_current_docs_exist():
    current_docs = [p for p in MARKDOWN if "history" not in p.parts]
    bad = []
    for f in CODE + current_docs:
        text = f.read_text(errors="replace")
        where = str(f.relative_to(REPO))
        for path, anchor in DOC_REF.findall(text):
            if (why := _check(REPO / path, anchor or None, where)):
                bad.append(why)
        for path in BENCH_REF.findall(text):
            if (why := _check(REPO / path, None, where)):
                bad.append(why)
    assert not bad, "\n".join(sorted(set(bad)))
