"""What the README and docs/ point at exists, and their shell commands run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SOURCES = [
    path
    for folder in ("proto", "client", "daemon", "tests", "bench", "docs")
    for path in (ROOT / folder).rglob("*")
    if path.suffix in {".py", ".md"} and ".venv" not in path.parts
]


def test_every_spec_citation_names_a_section_of_docs_spec() -> None:
    """ "SPEC.md §N" anywhere in the code, tests and docs is a section of docs/SPEC.md."""
    spec = (ROOT / "docs" / "SPEC.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", spec, flags=re.M)}
    assert set(range(1, 11)) == sections
    cited = {
        (path.relative_to(ROOT).as_posix(), int(n))
        for path in [README, *SOURCES]
        for n in re.findall(r"SPEC\.md §(\d+)", path.read_text(errors="replace"))
    }
    assert len(cited) > 50  # the walk sees the citations
    assert [] == sorted((path, n) for path, n in cited if n not in sections)


def test_every_docs_page_cited_is_a_page_of_docs() -> None:
    """A docs page cited anywhere in the code, tests and docs is a file of docs/."""
    cited = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in [README, *SOURCES]
        for name in re.findall(r"docs/([A-Z][A-Z_]*\.md)", path.read_text(errors="replace"))
    }
    assert len(cited) > 20  # the walk sees the citations
    assert [] == sorted((path, name) for path, name in cited if not (ROOT / "docs" / name).exists())


def test_relative_links_of_the_readme_and_docs_lead_to_files() -> None:
    """Every [text](target) that is not a URL names a file of the repository."""
    broken = []
    for page in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append((page.name, target))
    assert [] == broken


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (code blocks left out)."""
    text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#+ (.*)$", text, flags=re.M)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings
    }


def test_links_to_a_heading_of_the_readme_and_docs_lead_to_one() -> None:
    """Every [text](page#anchor) and [text](#anchor) names a heading of that page."""
    broken = []
    for page in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or "#" not in target:
                continue
            name, anchor = target.split("#", 1)
            if anchor not in _anchors(page.parent / name if name else page):
                broken.append((page.name, target))
    assert [] == broken


def _shell_blocks(text: str) -> list[list[str]]:
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S)
    return [block.splitlines() for block in blocks]


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    following = re.search(r"^## ", text[start + len(heading) :], flags=re.M)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def test_readme_commands_name_programs_that_exist_where_they_are_run() -> None:
    """No bare ``python`` (a checkout's is .venv/bin/python); where ``ctxwin`` is, is said first.

    A fresh checkout has python3 but maybe no ``python``, and ``ctxwin`` is
    installed in .venv/bin, not on the PATH: the README says so before its
    first bare ``ctxwin`` command, and the command-line section's blocks
    activate .venv before they run one.
    """
    text = README.read_text()
    lines = [line for block in _shell_blocks(text) for line in block]
    assert [] == [line for line in lines if re.match(r"(sudo )?python\s", line)]
    commands = [
        block.start(1) + line.start()
        for block in re.finditer(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S)
        for line in re.finditer(r"^ctxwin ", block.group(1), flags=re.M)
    ]
    assert commands
    assert text.index("`.venv/bin/ctxwin`") < min(commands)
    bare = []
    for block in _shell_blocks(_section(text, "## Command line")):
        activated = False
        for line in block:
            activated = activated or line.startswith(". .venv/bin/activate")
            if line.startswith("ctxwin ") and not activated:
                bare.append(line)
    assert [] == bare
    scripts = [m for line in lines for m in re.findall(r"\.venv/bin/python (\S+\.py)", line)]
    assert scripts
    assert [] == [script for script in scripts if not (ROOT / script).is_file()]
