"""What the report wrote: `.report_files.json` in --out maps every file it wrote to that file's sha256, the report's
files there by name, a --record pair elsewhere by absolute path (so no list is left beside records kept in a
repository). A later report replaces such a file only while it is unchanged (its own, not edited since), and
refuses any other file of its names.

Files are written so that a write cut short (Ctrl-C, a kill) leaves only files the list recognises: the list names
the new files' hashes first, then each file is renamed into place whole (`write_listed`)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from longctx.train.run_files import write_atomic

MANIFEST = ".report_files.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _key(out: Path, path: Path) -> str:
    """A file's entry in --out's list: its name when it is in --out, else its absolute path."""
    path = Path(path)
    return path.name if path.parent.resolve() == Path(out).resolve() else str(path.resolve())


def read_manifest(out: Path) -> dict[str, str]:
    """--out's list, {} when it has none (or one that is not a list of ours)."""
    try:
        listed = json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return listed if isinstance(listed, dict) else {}


def wrote(out: Path, path: Path) -> bool:
    """Whether the file at `path` is one a report with this --out wrote, unchanged since."""
    path = Path(path)
    return path.is_file() and read_manifest(out).get(_key(out, path)) == sha256(path.read_bytes())


def update_manifest(out: Path, written: dict[Path, str], dropped=()) -> None:
    """List the files `written` (path -> sha256) in --out's list, no longer listing the files `dropped`; other
    entries are kept."""
    gone = {_key(out, path) for path in dropped}
    listed = {k: v for k, v in read_manifest(out).items() if k not in gone}
    listed.update({_key(out, path): digest for path, digest in written.items()})
    write_atomic(Path(out) / MANIFEST, json.dumps(dict(sorted(listed.items())), indent=1) + "\n")


def write_listed(out: Path, files: dict[Path, bytes]) -> None:
    """Write each file (whole, in the order given) after listing them all in --out's list, so that an interrupted
    write leaves only files the list names."""
    update_manifest(out, {Path(path): sha256(data) for path, data in files.items()})
    for path, data in files.items():
        write_atomic(path, data)
