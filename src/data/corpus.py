"""Long documents from source and documentation trees (prepare_dataset's `--group-by package`).

Every machine holds long, real, structured text offline: the Python packages of an environment
(`.../site-packages`), `/usr/share/doc`, source checkouts. Each direct child of an input folder is a *package*
(a folder, or a lone file such as `six.py`); a package's text is its files concatenated in a stable, import-like
order, each behind a header line naming it:

    ### file: numpy/__init__.py
    <the file>
    ### file: numpy/_globals.py
    ...

Order within a folder: `__init__.py`, then the other files by name, then the subfolders by name, depth first: a
package's entry point and the modules it imports sit before the subpackages that use them. A package name met
in several inputs is one package (its files in input order), so no package can land in both splits.

Files kept: text suffixes (SOURCE_SUFFIXES) and suffix-less files (README, copyright, ...), at most
`max_file_bytes` (larger files are mostly generated tables), without NUL bytes (binary), valid UTF-8 (a file
that is not is named in a warning and skipped), non-empty, and not a byte-identical copy of a file already kept
(the first copy, in package-name order, wins). Folders skipped: hidden ones, `__pycache__`, `*.dist-info`,
`*.egg-info`.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

SOURCE_SUFFIXES = {
    ".py", ".pyi", ".pyx", ".pxd", ".pxi", ".c", ".h", ".cc", ".cpp", ".hpp", ".cxx", ".cu", ".cuh", ".rs", ".go",
    ".java", ".js", ".ts", ".sh", ".f", ".f90", ".jl", ".lua", ".r", ".sql",
    ".md", ".rst", ".txt", ".tex", ".toml", ".cfg", ".ini", ".yaml", ".yml",
}
SKIP_DIR_SUFFIXES = (".dist-info", ".egg-info")
log = logging.getLogger("longctx.data.prepare")


@dataclass
class CorpusStats:
    packages_found: int = 0
    files_kept: int = 0
    files_duplicate: int = 0
    files_too_large: int = 0
    files_binary: int = 0
    files_not_utf8: list[str] = field(default_factory=list)


def _skip_dir(p: Path) -> bool:
    return p.name.startswith(".") or p.name == "__pycache__" or p.name.endswith(SKIP_DIR_SUFFIXES)


def _wanted_file(p: Path) -> bool:
    return not p.name.startswith(".") and (p.suffix.lower() in SOURCE_SUFFIXES or p.suffix == "")


def import_order(folder: Path) -> list[Path]:
    """The files of `folder`, `__init__.py` first, then files by name, then subfolders by name, depth first."""
    try:
        entries = sorted(folder.iterdir(), key=lambda e: e.name)
    except OSError as e:
        log.warning(f"input: skipping {str(folder)!r}: {e.strerror}")
        return []
    files = [e for e in entries if not e.is_symlink() and e.is_file() and _wanted_file(e)]
    files.sort(key=lambda e: (e.name != "__init__.py", e.name))
    out = list(files)
    for d in entries:
        if not d.is_symlink() and d.is_dir() and not _skip_dir(d):
            out.extend(import_order(d))
    return out


def find_packages(inputs: list[Path]) -> dict[str, list[tuple[Path, Path]]]:
    """package name -> [(file, the folder its header path is relative to)], names sorted."""
    packages: dict[str, list[tuple[Path, Path]]] = {}
    for root in inputs:
        for child in sorted(root.iterdir(), key=lambda e: e.name):
            if child.is_symlink():
                continue
            if child.is_dir() and not _skip_dir(child):
                files = import_order(child)
                name = child.name
            elif child.is_file() and _wanted_file(child):
                files, name = [child], child.stem
            else:
                continue
            if files:
                packages.setdefault(name, []).extend((f, root) for f in files)
    return dict(sorted(packages.items()))


def package_texts(inputs: list[Path], *, max_file_bytes: int, stats: CorpusStats):
    """Yield (package name, [one part per file]) in package-name order: deduplicated files, each behind its header
    line and ending in a newline; the package's text is the parts joined."""
    seen: set[bytes] = set()
    packages = find_packages(inputs)
    stats.packages_found = len(packages)
    for name, files in packages.items():
        parts = []
        for f, root in files:
            text = _read_file(f, max_file_bytes, seen, stats)
            if text is not None:
                newline = "" if text.endswith("\n") else "\n"
                parts.append(f"### file: {f.relative_to(root).as_posix()}\n{text}{newline}")
        if parts:
            yield name, parts


def _read_file(f: Path, max_file_bytes: int, seen: set[bytes], stats: CorpusStats) -> str | None:
    try:
        if f.stat().st_size > max_file_bytes:
            stats.files_too_large += 1
            return None
        data = f.read_bytes()
    except OSError as e:
        log.warning(f"input: skipping {str(f)!r}: {e.strerror}")
        return None
    if not data.strip():
        return None
    if b"\0" in data:
        stats.files_binary += 1
        return None
    digest = hashlib.sha256(data).digest()
    if digest in seen:
        stats.files_duplicate += 1
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        stats.files_not_utf8.append(str(f))
        log.warning(f"input: skipping {str(f)!r}: not UTF-8 (byte {data[e.start]:#04x} at offset {e.start})")
        return None
    seen.add(digest)
    stats.files_kept += 1
    return text
