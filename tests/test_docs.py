"""The README and docs/ stay true to the repository: the README short, its first lines the set-up and test
commands CI reads, and every file a document names present."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250
SETUP = 'pip install torch==2.13.0 -e ".[test]"'
TESTS = "python -m pytest -q"

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")              # [text](target) and ![alt](target)
# Repository paths in backticks: `docs/gpu.md`, `scripts/flops.py`, `src/train/stages.py` (up to a space)
CODE_PATH = re.compile(r"`((?:docs|scripts|src|conf|tests|tools)/[^`\s]+)")
PLACEHOLDER = re.compile(r"[<>*{}$]|\bRUN\b|\bNAME\b|\.\.\.|XXXX")


def first_code_block(text: str) -> str:
    match = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert match, "README.md has no code block"
    return match.group(1)


def named_paths(doc: Path) -> list[tuple[str, Path]]:
    """(as written, resolved) for every relative link or image of `doc`, and every repository path in backticks."""
    text = doc.read_text()
    found = []
    for target in LINK.findall(text):
        target = target.split("#")[0]
        if not target or re.match(r"[a-z]+:", target) or PLACEHOLDER.search(target):
            continue
        found.append((target, (doc.parent / target).resolve()))
    for target in CODE_PATH.findall(text):
        target = target.rstrip(".,;:)").split("#")[0].split("::")[0]
        if PLACEHOLDER.search(target):
            continue
        found.append((target, ROOT / target))
    return found


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}: move details into docs/)"


def test_readme_starts_with_setup_and_tests():
    lines = [line.split("#")[0].strip() for line in first_code_block(README.read_text()).splitlines()]
    assert lines[:2] == [SETUP, TESTS]


def test_link_checker_sees_links_and_code_paths(tmp_path):
    """The checker itself: it finds links, images and backticked paths, and skips URLs, anchors and placeholders."""
    doc = tmp_path / "d.md"
    doc.write_text("[a](other.md#x) ![b](img/p.png) [c](https://x.org/y) [d](#results) `docs/gpu.md`, "
                   "`runs/RUN/eval` `scripts/missing.py` `docs/<date>/x` `src/a.py::f`\n")
    assert [t for t, _ in named_paths(doc)] == ["other.md", "img/p.png", "docs/gpu.md", "scripts/missing.py",
                                                "src/a.py"]
    assert named_paths(doc)[0][1] == tmp_path / "other.md"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_path_exists(doc):
    missing = [written for written, path in named_paths(doc) if not path.exists()]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"
