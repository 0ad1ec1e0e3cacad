"""The documentation's links: every relative link and image in README.md, docs/*.md and the READMEs under
reproduce/ and slurm/ points at a file that exists, and every #anchor at a heading of its target (GitHub's
heading ids). Parsed with markdown-it-py, so links inside code are not links and a link in a table is one."""

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("reproduce/**/README.md"),
        ROOT / "slurm" / "README.md",
    ]
)
MD = MarkdownIt("commonmark").enable("table")


def tokens(path: Path) -> list:
    return MD.parse(path.read_text())


def heading_ids(path: Path) -> set[str]:
    """The ids GitHub gives the headings of a page: lower case, punctuation dropped, spaces to hyphens,
    a repeated id numbered -1, -2, ..."""
    ids: set[str] = set()
    toks = tokens(path)
    for i, tok in enumerate(toks):
        if tok.type != "heading_open":
            continue
        text = "".join(child.content for child in toks[i + 1].children or [])
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in ids:
            n += 1
            candidate = f"{slug}-{n}"
        ids.add(candidate)
    return ids


def targets(path: Path) -> list[tuple[str, str]]:
    """(kind, target) of every link and image of a page."""
    found = []
    for tok in tokens(path):
        for child in tok.children or []:
            if child.type == "link_open":
                found.append(("link", child.attrGet("href")))
            elif child.type == "image":
                found.append(("image", child.attrGet("src")))
    return found


def problems(page: Path) -> list[str]:
    out = []
    for kind, target in targets(page):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue
        dest = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        where = f"{page.relative_to(ROOT)}: {kind} {target}"
        if not dest.exists():
            out.append(
                f"{where}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist"
            )
            continue
        if kind == "image" and ignored(dest):
            out.append(f"{where}: .gitignore excludes it")
        if parts.fragment and dest.suffix == ".md" and parts.fragment not in heading_ids(dest):
            out.append(
                f"{where}: no heading #{parts.fragment} in {dest.relative_to(ROOT)} "
                f"(its headings: {', '.join(sorted(heading_ids(dest)))})"
            )
    return out


def ignored(path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False).returncode == 0


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_of_the_docs_resolves(page):
    assert not problems(page), "\n".join(problems(page))


def test_every_docs_page_is_in_the_index_and_the_index_in_the_readme():
    linked = {(ROOT / "docs" / urlsplit(t).path).resolve() for _, t in targets(ROOT / "docs" / "README.md")}
    missing = [p.name for p in ROOT.glob("docs/*.md") if p.name != "README.md" and p.resolve() not in linked]
    assert not missing, f"docs/README.md: add a link to {', '.join(sorted(missing))}"
    readme = {urlsplit(t).path for _, t in targets(ROOT / "README.md")}
    assert "docs/README.md" in readme, "README.md: add a link to docs/README.md, the documentation's index"


def test_the_link_check_catches_a_broken_file_anchor_and_image(tmp_path, monkeypatch):
    """The checker itself: a page with one good link and three broken ones reports exactly the three."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# A title: `with code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-title-with-code) [ok](other.md#twice-1) [ok](#here)\n\n# Here\n\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) ![img](fig.png)\n\n"
        "`[not a link](missing.md)`\n"
    )
    found = problems(page)
    assert len(found) == 3, found
    assert "missing.md does not exist" in found[0] and "#nowhere" in found[1] and "fig.png" in found[2]


def _test_names() -> set[str]:
    """The suite's test modules and test functions, by the names the pages cite them."""
    import ast

    names = set()
    for module in (ROOT / "tests").glob("test_*.py"):
        names.add(module.stem)
        names.update(
            node.name
            for node in ast.walk(ast.parse(module.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
        )
    return names


def cited_tests_missing(page: Path, names: set[str]) -> list[str]:
    """The test names a page cites (``test_...``, a parameter id after it left out) that no test module or
    function has: a renamed or removed test the page still points a reader to."""
    cited = set(re.findall(r"\btest_[a-z0-9_]*[a-z0-9]\b", page.read_text()))
    return sorted(cited - names)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_a_page_cites_exists(page):
    missing = cited_tests_missing(page, _test_names())
    assert not missing, f"{page.relative_to(ROOT)} cites tests that do not exist: {', '.join(missing)}"


def test_the_cited_test_check_catches_a_renamed_test(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "`tests/test_symlinks.py::test_planted_events_symlink_is_refused` and test_docs_links, "
        "`test_every_test_a_page_cites_exists[README.md]`"
    )
    assert cited_tests_missing(page, _test_names()) == ["test_planted_events_symlink_is_refused"]
