"""The README and docs/ stay true to the repository: the README short and its first lines the set-up and test
commands CI reads; every repository path named in README.md and docs/*.md (links, images, `code`, commands) and in
the sources' docstrings exists, every link's #anchor too, and every README section cited by its title
(`README.md, "Training speed (H200)"`). URLs and placeholders (runs/RUN, <name>, *, ...) are not paths."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("src/", "scripts/", "tools/", "tests/", "conf/", "docs/")
TOP_FILES = {"train.py", "pyproject.toml", ".gitignore"}
TOP_DOC = re.compile(r"[A-Z]+\.md")  # README.md, CHANGELOG.md, ...: at the top of the repository
PLACEHOLDER = re.compile(r"[<>*{}$|]|\.\.\.|\bRUN\b|\bNAME\b|\bDIR\b|\bFILE\b|XXXX|/[a-z]\.\w+$")  # .../x.json
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
CITED_SECTION = re.compile(r"README(?:\.md)?(?:'s)?,?\s+\"([^\"]+)\"")
MAX_README_LINES = 250
SETUP = 'pip install torch==2.13.0 -e ".[test]"'
TESTS = "python -m pytest -q -n 2"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> list[str]:
    text = CODE.sub("", path.read_text()) if path.suffix == ".md" else ""
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def named_paths(text: str) -> set[str]:
    """Repository-looking paths in code spans, code blocks and commands: tokens starting at a known top folder or
    naming a top-level file, with trailing punctuation, `:line` and `::test` suffixes cut."""
    found = set()
    for span in CODE.findall(text):
        for token in re.split(r"[\s`'\"(),;=\[\]]+", span):
            token = token.split("::")[0].rstrip(".:,")
            token = re.sub(r":\d+(-\d+)?$", "", token)
            if PLACEHOLDER.search(token) or "//" in token:
                continue
            if token.startswith(ROOTS) or token in TOP_FILES or TOP_DOC.fullmatch(token):
                found.add(token)
    prose = re.sub(r"https?://\S+", "", text)
    found |= set(re.findall(r"(?<![\w/.])[A-Z]+\.md\b", prose))  # "the formula of DESIGN.md"
    return found


def source_cases():
    """Code and docstrings cite documents too: every `NAME.md` and `docs/*.md` a source file names."""
    for path in sorted(p for folder in ("src", "scripts", "tools") for p in (REPO / folder).rglob("*.py")):
        for name in sorted(set(re.findall(r"\b(docs/[\w./-]+\.md|[A-Z]+\.md)\b", path.read_text()))):
            yield pytest.param(path, "path", name, id=f"{path.relative_to(REPO)}:{name}")


def cases():
    yield from source_cases()
    for doc in DOCS:
        text = doc.read_text()
        for path in sorted(named_paths(text)):
            yield pytest.param(doc, "path", path, id=f"{doc.name}:{path}")
        for target in sorted(set(LINK.findall(CODE.sub("", text)))):
            if re.match(r"[a-z]+:", target) or PLACEHOLDER.search(target):
                continue
            yield pytest.param(doc, "link", target, id=f"{doc.name}:({target})")
        for section in sorted(set(CITED_SECTION.findall(text))):
            yield pytest.param(doc, "section", section, id=f"{doc.name}:README \"{section}\"")


@pytest.mark.parametrize("doc, kind, target", list(cases()))
def test_what_the_docs_name_exists(doc, kind, target):
    if kind == "path":
        assert (REPO / target).exists(), f"{doc.relative_to(REPO)} names {target}, which is not in the repository"
    elif kind == "link":
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.relative_to(REPO)} links to {target}: no such file"
        if anchor:
            assert anchor in {slug(h) for h in headings(path)}, f"{doc.relative_to(REPO)} links to {target}: no such section"
    else:
        assert target in headings(REPO / "README.md"), f"{doc.relative_to(REPO)} cites README's \"{target}\": no such section"


def test_the_checks_see_what_they_should():
    """The extraction itself, on a known text."""
    text = ("see `src/models/gpt2.py:12`, `python scripts/flops.py ctx=1` and `runs/RUN/metrics.jsonl`, "
            "`tests/xy.py::test_a`, `docs/results/x.json`, (README.md, \"Main overrides\") [a](docs/kernels.md#x) https://a.b/src/c.py https://x.y/NOTES.md")
    assert named_paths(text + " `DESIGN.md`") == {"src/models/gpt2.py", "scripts/flops.py", "tests/xy.py", "DESIGN.md",
                                                "README.md"}
    assert CITED_SECTION.findall(text) == ["Main overrides"]
    assert slug("Training speed (H200)") == "training-speed-h200"


def test_readme_is_short():
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}: move details into docs/)"


def test_the_run_folder_table_names_every_file_a_launch_leaves():
    """README's "What a run produces" table has a row for each file every launch writes once its checks pass
    (run_files.LAUNCH_FILES) and for the wandb id a logging run keeps (loggers.wandb_id_for), each said in words."""
    from longctx.train.run_files import LAUNCH_FILES

    text = (REPO / "README.md").read_text()
    table = text.split("## What a run produces", 1)[1].split("\n\n", 2)[1]
    rows = {name: line.split("|")[2].strip() for line in table.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([^`]+)`", line.split("|")[1])}
    for name in (*LAUNCH_FILES, "wandb_id"):
        assert name in rows and len(rows[name]) > 20, (name, sorted(rows))


def test_readme_starts_with_setup_and_tests():
    match = re.search(r"```[a-z]*\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert match, "README.md has no code block"
    lines = [line.split("#")[0].strip() for line in match.group(1).splitlines()]
    assert lines[:2] == [SETUP, TESTS]


def test_docs_pages_are_few_and_every_result_file_is_shown_or_read():
    """At most forty files and a dozen pages under docs/ (merge rather than add); under docs/results, every figure is
    shown by the README or a page, every record names a figure a page shows, and every npz sits beside its record."""
    import subprocess
    tracked = subprocess.run(["git", "ls-files", "docs"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    files = [Path(f) for f in tracked.stdout.split()]
    assert len(files) <= 40, f"docs/ holds {len(files)} tracked files (at most 40): merge or drop some"
    pages = [f for f in files if f.suffix == ".md"]
    assert len(pages) <= 12, f"docs/ holds {len(pages)} pages (at most 12): merge some"
    text = "\n".join((REPO / f).read_text() for f in [Path("README.md"), *pages])
    results = [f for f in files if f.parts[:2] == ("docs", "results")]
    for f in results:
        if f.suffix == ".png":
            assert f.name in text, f"{f}: no page or README shows it"
        elif f.suffix == ".npz":
            assert f.with_suffix(".json") in results, f"{f}: no record beside it"
        elif f.suffix == ".json":
            shown = [g.name for g in results if g.suffix == ".png" and g.name.startswith(f.stem)]
            assert shown and any(name in text for name in shown), f"{f}: no page shows a figure of it"
        else:
            raise AssertionError(f"{f}: docs/results holds records (json, npz) and figures (png) only")


RUN_NAME_EXAMPLE = re.compile(r"\b(?:gpt2|rwkv7)_[\w.-]*?_ctx\d+[\w.-]*")  # a run name as the docs write one
RUN_NAME_PARTS = re.compile(r"(?P<arch>gpt2|rwkv7)_(?P<tag>exp|linear|power_p\d+|window\d+)_d(?P<d>\d+)l(?P<l>\d+)_"
                            r"(?P<data>\w+?)_ctx(?P<ctx>\d+)_s(?P<seed>\d+)(?:_[\w.-]+)?")


def run_name_examples():
    sources = [*DOCS, *sorted(p for folder in ("src", "scripts") for p in (REPO / folder).rglob("*.py"))]
    for path in sources:
        for name in sorted(set(RUN_NAME_EXAMPLE.findall(path.read_text()))):
            yield pytest.param(path, name, id=f"{path.relative_to(REPO)}:{name}")


@pytest.mark.parametrize("path, name", list(run_name_examples()))
def test_run_name_examples_are_names_the_naming_gives(compose, path, name):
    """Every run name written in the docs and docstrings is <arch>_<attention tag>_d<d_model>l<layers>_<data>_ctx<ctx>
    _s<seed>[_<overrides>] and is the name src/naming.py gives the config it describes."""
    from longctx.naming import run_name

    parts = RUN_NAME_PARTS.fullmatch(name)
    assert parts, (f"{path.relative_to(REPO)}: {name} is not "
                   f"<arch>_<attention>_d<d_model>l<layers>_<data>_ctx<ctx>_s<seed>")
    tag = parts["tag"]
    attention = (["attention=power", f"p={tag[len('power_p'):]}"] if tag.startswith("power_p") else
                 ["attention=window", f"window={tag[len('window'):]}"] if tag.startswith("window") else
                 [f"attention={tag}"])
    data = [f"data={parts['data']}"] if (REPO / "conf" / "data" / f"{parts['data']}.yaml").exists() else []
    cfg = compose(f"arch={parts['arch']}", *attention, f"model.d_model={parts['d']}", f"model.n_layers={parts['l']}",
                  *data, f"ctx={parts['ctx']}", f"seed={parts['seed']}")
    base = name[:parts.end("seed")]
    if data:
        assert run_name(cfg, overrides=[]) == base
    else:  # a prepared dataset's folder name: the other parts must still be the naming's
        assert run_name(cfg, overrides=[]).replace(f"_{cfg.data.tag}_", f"_{parts['data']}_") == base


def test_the_package_version_is_the_changelogs_newest():
    """provenance.json records the installed package's version: it is the CHANGELOG's newest release, so a run's
    record names the release whose changes it ran with."""
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    newest = re.search(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), re.M).group(1)
    assert version == newest
