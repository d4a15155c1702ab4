"""Build a dataset in the LongCrawl64 layout from your own text (the engine of scripts/prepare_dataset.py).

Two ways to make documents:

- `group_by="file"` (default; streaming: memory stays O(one output chunk-row), whatever the corpus size): read
  documents from local text files (one document per file, or per paragraph/line), json(l) / parquet / csv
  files (`datasets.load_dataset(..., streaming=True)`), or a Hub dataset name when online; keep those with at
  least `doc_len` tokens, truncated to `doc_len`; a random permutation splits off the heldout documents.
- `group_by="package"`: source and documentation trees (`longctx.data.corpus`): each package's files
  concatenated into one long text, cut into consecutive `doc_len`-token documents (the remainder, and packages
  shorter than `doc_len`, are dropped). The heldout split is made of whole packages (about `heldout_frac` of the
  text), so no package is in both; the tokenizer (default: byte-level BPE trained here, `tokenizer.json`) sees
  the training packages only. Package texts are held in memory (≈ the corpus size).

Then both: the documents go to a temporary flat uint16/uint32 file, each split is shuffled, rolled, and written
as `train.zarr` / `heldout.zarr` `[N, doc_len]` in chunks of `chunk_docs x chunk_len`, one chunk-row at a time.

Roll (LongCrawl64 calls its documents "rolled"): each document keeps its first `doc_len - 1` tokens, gets the
EOT/BOS id appended, and is then rotated left by a random offset k, so the stored row is
`doc[k:] + [EOT] + doc[:k]`-shaped: the document's start sits at a uniformly random position and the EOT
marks the seam. `rolled=False` stores the first `doc_len` tokens as they are.

Pack (`pack=True`, group_by="file"): documents of any length instead of those of at least `doc_len` tokens. Each
non-empty document becomes its first `doc_len - 1` tokens then the EOT/BOS id, and documents are laid one after
another into rows of `doc_len` tokens; one that does not fit in what is left of a row is cut at the row's end (the
rest dropped) and the next starts a new row, so every row starts with a document's first token and no document
spans two rows. Rows are not rolled. In the inputs (targets shifted right, BOS first) every document then starts at
a BOS: the loader's `data.pack=true` numbers them (`longcrawl64.packed_doc_ids`) and the models keep them apart.
The heldout split is whole rows; a last row that the documents do not fill is dropped. The arrays' `packed`
attribute records it.

Safety: every argument and path is checked before any work. The output is built in a hidden temporary folder
beside `out` and renamed into place; `overwrite` replaces only a folder that this module wrote (its
`prepare.json` manifest lists every entry, and the folder holds nothing else: in a split's folder, only its zarr
array's metadata and chunks), and never one that is, contains or lies inside an input. A text file that is not
UTF-8 is named in a warning and skipped.

The arrays' attributes record `tokenizer`, `bos_id`, `vocab_size`, `max_token_id`, `rolled`, the preparation
parameters, and `tokenizer_file` when the dataset carries its own tokenizer (`load_tokenizer` reads them).
"""
from __future__ import annotations

import codecs
import glob
import itertools
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ._array import WRITE_EVERY_CHUNK
from ._tmpdir import LOCK_NAME, release, writing_dir
from .corpus import CorpusStats, package_texts
from .tokenizer import TOKENIZER_FILE, BPETokenizer, ByteTokenizer, TiktokenGPT2

TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
                 ".parquet": "parquet", ".csv": "csv"}
TOKENIZERS = ("auto", "gpt2", "bytes", "bpe")
WRITTEN_BY = "longctx.data.prepare"
LEGACY_FILES = {"train.zarr", "heldout.zarr", "prepare.json"}  # what versions without a manifest wrote
# train.py trains on train.zarr and evaluates on heldout.zarr: a dataset lacking either is refused before any work
NEEDS_BOTH_SPLITS = " (training needs documents in both train.zarr and heldout.zarr)"
READ_CHARS = 1 << 16   # a text file is read this many characters at a time: its size never sets the memory
log = logging.getLogger("longctx.data.prepare")

__all__ = ["PrepareConfig", "prepare_dataset", "check_config", "get_tokenizer", "open_source",
           "ByteTokenizer", "TiktokenGPT2", "BPETokenizer"]


# ----- tokenizers ------------------------------------------------------------------------------------
def get_tokenizer(name: str = "auto"):
    """'gpt2' (tiktoken; fails with a hint if its vocabulary can't be loaded), 'bytes', or 'auto' (gpt2 if
    it loads, else bytes). ('bpe' is trained on the data: see prepare_dataset.)"""
    if name not in ("auto", "gpt2", "bytes"):
        raise ValueError(f"tokenizer: must be one of auto, gpt2, bytes; got {name!r}")
    if name == "bytes":
        return ByteTokenizer()
    try:
        return TiktokenGPT2()
    except Exception as e:
        cause = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if name == "gpt2":
            raise RuntimeError(
                "tokenizer=gpt2: tiktoken could not load the GPT-2 vocabulary (offline?). Run once with network "
                "access, or copy a tiktoken cache and set TIKTOKEN_CACHE_DIR to it; or use --tokenizer bytes. "
                f"Cause: {cause}") from None
        # Said at once, not only in the summary: a byte-level dataset (vocab 257) is a different experiment
        log.warning(f"tokenizer auto: the GPT-2 vocabulary (tiktoken) could not be loaded ({cause}); using the "
                    f"byte-level tokenizer (vocab 257). Pass --tokenizer gpt2 to stop instead, or --tokenizer "
                    f"bytes to choose it")
        return ByteTokenizer()


# ----- sources -----------------------------------------------------------------------------------------
def open_source(source: str, *, text_field: str = "text", split: str = "train", hf_config: str | None = None,
                sample_by: str = "document", skipped: list | None = None, max_chars: int | None = None,
                seen: set | None = None):
    """A streaming iterable of raw text documents and a short description of where they come from. Text files
    that are not UTF-8 are skipped with a warning naming them (and appended to `skipped`). Text files are read a
    block at a time; a document of one is cut at `max_chars` characters (None: never). Each real file is read once:
    a file reached again (a link to a folder above it, an input named twice: `seen` holds the real paths read by
    the inputs before) is left out, so no document is duplicated (nor stands in both splits)."""
    seen = set() if seen is None else seen
    p = Path(os.path.expanduser(source))
    if p.is_dir():
        found = sorted(f for f in glob.glob(str(p / "**" / "*"), recursive=True)
                       if Path(f).suffix.lower() in TEXT_SUFFIXES and Path(f).is_file())
        files = []
        for f in found:
            real = os.path.realpath(f)
            if real not in seen:
                seen.add(real)
                files.append(f)
        if found and not files:
            raise ValueError(f"input: {str(p)!r}: every file in it was already read by an earlier input; name each "
                             f"folder once")
        if not files:
            raise FileNotFoundError(f"input: {str(p)!r} holds no {', '.join(sorted(TEXT_SUFFIXES))} files")
        kinds = {TEXT_SUFFIXES[Path(f).suffix.lower()] for f in files}
        if len(kinds) > 1:
            raise ValueError(f"input: {str(p)!r} mixes file kinds {sorted(kinds)}; point at one kind")
        builder = kinds.pop()
    elif p.is_file():
        if p.suffix.lower() not in TEXT_SUFFIXES:
            raise ValueError(f"input: {str(p)!r} has suffix {p.suffix!r}; expected one of {sorted(TEXT_SUFFIXES)}")
        if os.path.realpath(p) in seen:
            raise ValueError(f"input: {str(p)!r} was already read by an earlier input; name each file once")
        seen.add(os.path.realpath(p))
        files, builder = [str(p)], TEXT_SUFFIXES[p.suffix.lower()]
    elif _looks_local(source):
        raise FileNotFoundError(f"input: {source!r} does not exist (a local path: no such file or folder)")
    else:  # a Hub dataset name
        import datasets
        try:
            ds = datasets.load_dataset(source, hf_config, split=split, streaming=True)
        except Exception as e:  # offline, no such dataset, gated: one line, not the Hub client's traceback
            raise RuntimeError(f"input: {source!r} is not a local file or folder, and the Hub dataset of that "
                               f"name could not be opened ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        return _texts(ds, text_field, source), f"hub:{source}" + (f"/{hf_config}" if hf_config else "")
    described = f"{builder}:{len(files)} file(s) under {source}"
    if builder == "text":
        return _text_files(files, sample_by, [] if skipped is None else skipped, max_chars), described
    import datasets
    ds = datasets.load_dataset(builder, data_files=files, split="train", streaming=True)
    return _texts(ds, text_field, source), described


def _text_files(files: list[str], sample_by: str, skipped: list, max_chars: int | None = None):
    """Documents of text files, read as the `datasets` text builder reads them (universal newlines; a paragraph
    ends at a blank line), but a file that is not UTF-8 is named and skipped instead of ending the corpus. Each
    file is read twice, a block at a time: once to check it is UTF-8 (a bad byte anywhere skips the whole file),
    once for its documents."""
    sep = {"document": None, "paragraph": "\n\n", "line": "\n"}[sample_by]
    for f in files:
        bad = _first_non_utf8(f)
        if bad is not None:
            skipped.append(f)
            log.warning(f"input: skipping {f!r}: not UTF-8 (byte {bad[1]:#04x} at offset {bad[0]})")
            continue
        pieces = _pieces(f, sep, max_chars)
        yield from (t for t in pieces if t) if sample_by == "paragraph" else pieces


def _first_non_utf8(path: str) -> tuple[int, int] | None:
    """(offset, value) of the first byte of `path` that is not UTF-8, or None."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes handed to the decoder; it holds back an incomplete sequence at a block's end
    with open(path, "rb") as f:
        while True:
            block = f.read(READ_CHARS)
            held = len(decoder.getstate()[0])
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:  # e.object is the held bytes + this block
                return offset - held + e.start, e.object[e.start]
            if not block:
                return None
            offset += len(block)


def _pieces(path: str, sep: str | None, max_chars: int | None):
    """The text of `path` (UTF-8, universal newlines) split at `sep` as `str.split` splits (None: one piece), read
    READ_CHARS at a time; a piece longer than `max_chars` is cut there (the rest is read past, never held)."""
    with open(path, encoding="utf-8", newline=None) as f:
        if sep is None:
            yield f.read(-1 if max_chars is None else max_chars)
            return
        head, tail = None, ""  # head: the kept start of a piece that outgrew max_chars; tail: text not yet split
        while True:
            block = f.read(READ_CHARS)
            parts = (tail + block).split(sep)
            done = parts if not block else parts[:-1]
            for part in done:
                piece = part if head is None else head + part
                yield piece if max_chars is None else piece[:max_chars]
                head = None
            if not block:
                return
            tail = parts[-1]
            if max_chars is not None and len(tail) > max_chars + len(sep):
                head = head if head is not None else tail[:max_chars]
                tail = tail[len(tail) - len(sep) + 1:]  # the start of a separator that the next block completes


def _looks_local(source: str) -> bool:
    """A path, not a Hub name ('owner/name' or a bare canonical name, neither with a file extension): starts
    with . / ~, has more than one separator or a backslash, or ends in a file extension (corpus.jsnol)."""
    if source.startswith((".", "/", "~")) or "\\" in source or source.count("/") > 1 or (os.sep != "/" and os.sep in source):
        return True
    name = source.rsplit("/", 1)[-1]
    suffix = Path(name).suffix.lower()
    return suffix in TEXT_SUFFIXES or suffix in (".gz", ".zst", ".bz2", ".xz") or (
        "/" not in source and suffix[1:].isalpha() and 1 <= len(suffix) - 1 <= 7)


def _texts(ds, field: str, source: str):
    rows = iter(ds)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except UnicodeDecodeError as e:
            raise ValueError(f"input: {source!r} holds text that is not UTF-8 ({e.reason} at byte {e.start})") from None
        if field not in row:
            raise ValueError(f"text_field: {field!r} is not a column of {source} (columns: {sorted(row)})")
        text = row[field]
        if isinstance(text, str):
            yield text


# ----- configuration and its checks --------------------------------------------------------------------
@dataclass
class PrepareConfig:
    source: str | list[str]          # one input or several (`--input A B ...`)
    out: str
    doc_len: int = 65536
    heldout_frac: float = 0.01
    heldout_docs: int | None = None
    tokenizer: str = "auto"          # auto: gpt2 else bytes (group_by=file); bpe (group_by=package)
    rolled: bool = True
    seed: int = 0
    chunk_docs: int = 2048
    chunk_len: int = 2048
    zarr_format: int = 3
    text_field: str = "text"
    split: str = "train"
    hf_config: str | None = None
    sample_by: str = "document"
    max_docs: int | None = None
    batch_docs: int = 64
    overwrite: bool = False
    progress: bool = True
    group_by: str = "file"           # file | package (longctx.data.corpus)
    vocab_size: int = 16384          # of the bpe tokenizer
    max_file_bytes: int = 1 << 20    # group_by=package: larger files are skipped
    pack: bool = False               # rows of packed variable-length documents (module docstring)
    inputs: list[str] = field(init=False, default_factory=list)

    def __post_init__(self):
        self.inputs = [self.source] if isinstance(self.source, (str, os.PathLike)) else list(self.source)
        self.inputs = [str(s) for s in self.inputs]


def _int(name: str, v, lo: int, hi: int | None = None, *, none_ok: bool = False, why: str = "") -> None:
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or (hi is not None and v > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be an integer {bound}{why}, got {v!r}")


def check_config(cfg: PrepareConfig) -> Path:
    """Every argument and path of `cfg`, checked before any work; returns the output folder. Raises ValueError /
    FileNotFoundError / FileExistsError with one line naming the argument."""
    _int("doc_len (--doc-len)", cfg.doc_len, 2)
    _int("chunk_docs (--chunk-docs)", cfg.chunk_docs, 1)
    _int("chunk_len (--chunk-len)", cfg.chunk_len, 1)
    _int("batch_docs", cfg.batch_docs, 1)
    _int("max_docs (--max-docs)", cfg.max_docs, 1, none_ok=True)
    _int("heldout_docs (--heldout-docs)", cfg.heldout_docs, 1, none_ok=True, why=NEEDS_BOTH_SPLITS)
    _int("vocab_size (--vocab-size)", cfg.vocab_size, 258, 65536)
    _int("max_file_bytes (--max-file-bytes)", cfg.max_file_bytes, 1)
    _int("seed (--seed)", cfg.seed, 0)
    if isinstance(cfg.heldout_frac, bool) or not isinstance(cfg.heldout_frac, (int, float)) \
            or not (0 < cfg.heldout_frac < 1 or cfg.heldout_docs is not None and 0 <= cfg.heldout_frac < 1):
        raise ValueError(f"heldout_frac (--heldout-frac): must be in (0, 1){NEEDS_BOTH_SPLITS}, "
                         f"got {cfg.heldout_frac!r}")
    if cfg.zarr_format not in (2, 3):
        raise ValueError(f"zarr_format (--zarr-format): must be 2 or 3, got {cfg.zarr_format!r}")
    if cfg.tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer: must be one of {', '.join(TOKENIZERS)}; got {cfg.tokenizer!r}")
    if cfg.group_by not in ("file", "package"):
        raise ValueError(f"group_by (--group-by): must be file or package, got {cfg.group_by!r}")
    if cfg.sample_by not in ("document", "paragraph", "line"):
        raise ValueError(f"sample_by (--sample-by): must be document, paragraph or line, got {cfg.sample_by!r}")
    if not isinstance(cfg.pack, bool):
        raise ValueError(f"pack (--pack): must be true or false, got {cfg.pack!r}")
    if cfg.pack and cfg.group_by != "file":
        raise ValueError(f"pack (--pack): needs --group-by file (documents of their own lengths); got --group-by "
                         f"{cfg.group_by}")
    if cfg.tokenizer == "bpe" and cfg.group_by != "package":
        raise ValueError("tokenizer=bpe: needs --group-by package (the tokenizer is trained on the training split, "
                         "which that mode fixes before tokenizing)")
    if not cfg.inputs:
        raise ValueError("input (--input): no input given")
    local = []
    for src in cfg.inputs:
        p = Path(os.path.expanduser(src))
        if cfg.group_by == "package":
            if not p.is_dir():
                raise FileNotFoundError(f"input: {src!r} is not a folder (--group-by package reads source or "
                                        f"documentation trees)")
        elif not p.exists():
            if _looks_local(src):
                raise FileNotFoundError(f"input: {src!r} does not exist (a local path: no such file or folder)")
            continue  # a Hub name
        local.append(p)
    out = Path(os.path.expanduser(str(cfg.out)))
    _check_out(out, local, cfg.overwrite)
    return out


def _check_out(out: Path, inputs: list[Path], overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise FileExistsError(f"out: {str(out)!r} exists and is not a folder; choose a folder path")
    r_out = out.resolve()
    for p in inputs:
        r_in = p.resolve()
        if r_out == r_in:
            raise ValueError(f"out: {str(out)!r} is the input {str(p)!r}; choose a folder outside the input")
        if r_out in r_in.parents:
            raise ValueError(f"out: {str(out)!r} contains the input {str(p)!r}; choose a folder outside the input")
        if r_in in r_out.parents:
            raise ValueError(f"out: {str(out)!r} lies inside the input {str(p)!r}; choose a folder outside the input")
    if out.exists():
        if not overwrite:
            raise FileExistsError(f"out: {str(out)!r} already exists; pass --overwrite to replace it")
        _check_replaceable(out)
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise FileExistsError(f"out: {str(ancestor)!r} is a file, so {str(out)!r} cannot be created")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"out: cannot write in {str(ancestor)!r} (permission denied)")


def _check_replaceable(out: Path) -> None:
    """--overwrite replaces only a dataset this module wrote, holding nothing else (or an empty folder)."""
    if not any(out.iterdir()):
        return
    try:
        manifest = json.loads((out / "prepare.json").read_text())
    except (OSError, ValueError):
        manifest = None
    ours = isinstance(manifest, dict) and (manifest.get("written_by") == WRITTEN_BY
                                           or {"documents_kept", "params"} <= set(manifest))
    if not ours:
        raise FileExistsError(f"out: {str(out)!r} is not a dataset written by prepare_dataset (no prepare.json of "
                              f"its own); --overwrite replaces only those: choose another --out")
    extra = _foreign_files(out, set(manifest.get("files", LEGACY_FILES)))
    if extra:
        raise FileExistsError(f"out: {str(out)!r} holds files prepare_dataset did not write "
                              f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''}); refusing to replace it: "
                              f"move them out of it or choose another --out")


def _foreign_files(out: Path, listed: set[str]) -> list[str]:
    """Paths under `out` (relative to it) that removing it would lose besides what this module wrote: entries the
    manifest does not list, links (never written here), and inside a listed folder anything but its zarr array."""
    found = []
    for e in sorted(out.iterdir()):
        if e.name not in listed or e.is_symlink():
            found.append(e.name)
        elif e.is_dir():
            found += [f"{e.name}/{rel}" for rel in _not_array_files(e)]
    return found


def _not_array_files(folder: Path) -> list[str]:
    """Files and links in `folder` (relative paths) that are neither the metadata nor a chunk of the zarr array
    stored there: all of them when no array can be opened there, and any folder that cannot be read (unchecked)."""
    keys = _array_keys(folder)
    found, unreadable = [], []
    for top, dirs, files in os.walk(folder, onerror=unreadable.append):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, folder)
            if rel.replace(os.sep, "/") not in keys or os.path.islink(path):
                found.append(rel)
    return sorted(found + [os.path.relpath(e.filename, folder) for e in unreadable])


def _array_keys(folder: Path) -> set[str]:
    """The metadata files and every chunk key of the zarr array in `folder` (empty if none opens): exactly what
    `_shuffle_roll_write` wrote there, since it writes every chunk."""
    import zarr

    try:
        arr = zarr.open_array(str(folder), mode="r")
    except Exception:  # zarr raises several types: no metadata, bad json, a group
        return set()
    meta = {"zarr.json"} if arr.metadata.zarr_format == 3 else {".zarray", ".zattrs"}
    grid = itertools.product(*(range(n) for n in arr.cdata_shape))
    return meta | {arr.metadata.encode_chunk_key(c) for c in grid}


# ----- preparation -------------------------------------------------------------------------------------
def prepare_dataset(cfg: PrepareConfig) -> dict:
    """Build `cfg.out/{train,heldout}.zarr` (+ `prepare.json`, + `tokenizer.json` for bpe) and return the summary
    written to `prepare.json`."""
    out = check_config(cfg)
    start = time.perf_counter()
    skipped: list[str] = []
    if cfg.group_by == "file":  # open the source first: a bad Hub name fails before anything is written
        seen: set[str] = set()  # real paths: a file reached twice is read once
        sources = [open_source(s, text_field=cfg.text_field, split=cfg.split, hf_config=cfg.hf_config,
                               sample_by=cfg.sample_by, skipped=skipped, max_chars=_read_chars(cfg.doc_len),
                               seen=seen)
                   for s in cfg.inputs]
        tok = get_tokenizer(cfg.tokenizer)
    else:  # bpe is trained later, on the training packages
        tok = get_tokenizer(cfg.tokenizer) if cfg.tokenizer in ("gpt2", "bytes") else None
    out.parent.mkdir(parents=True, exist_ok=True)
    with writing_dir(out.parent, out.name) as tmp:
        if cfg.group_by == "file":
            summary = _prepare_files(tmp, sources, tok, cfg, skipped)
        else:
            summary = _prepare_packages(tmp, cfg, tok)
        summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["written_by"] = WRITTEN_BY
        summary["files"] = sorted([*(e.name for e in tmp.iterdir() if e.name != LOCK_NAME),
                                   "prepare.json"])
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n")
        release(tmp)
        if out.exists():  # replaced after success, with overwrite=True, when this module wrote it
            if not cfg.overwrite:   # another prepare wrote it while this one worked: its dataset is never removed
                shutil.rmtree(tmp, ignore_errors=True)
                raise FileExistsError(f"out={str(out)!r}: written by another run while this one worked; nothing "
                                      f"replaced (pass --overwrite to replace it, or give another --out)")
            _check_replaceable(out)  # again: files may have been added while we worked
            shutil.rmtree(out)
        os.rename(tmp, out)
        _chmod_like_umask(out)
    return summary


def _chmod_like_umask(path: Path) -> None:
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)  # mkdtemp made it private


def _prepare_files(tmp: Path, sources, tok, cfg: PrepareConfig, skipped: list) -> dict:
    flat = tmp / "kept.tokens"
    texts = (t for it, _ in sources for t in it)
    described = "; ".join(d for _, d in sources)
    seen, kept, packed = (_pack_to_flat if cfg.pack else _tokenize_to_flat)(texts, tok, cfg, flat)
    if kept == 0 and cfg.pack:
        raise ValueError(f"no document of {described} holds a token ({seen} documents read)")
    if kept == 0:
        raise ValueError(f"no document of {described} has >= doc_len={cfg.doc_len} tokens "
                         f"({seen} documents read, tokenizer {tok.name})")
    n_held = _heldout_count(cfg, kept)
    order = np.random.default_rng(cfg.seed).permutation(kept)
    summary = _shuffle_roll_write(tmp, flat, kept, order[:n_held], order[n_held:], tok, cfg, described)
    flat.unlink()
    summary.update(documents_read=seen, documents_kept=kept, files_not_utf8=skipped)
    if cfg.pack:  # documents_kept counts rows; these the documents packed into them
        summary.update(packed_documents=packed)
    return summary


def _heldout_count(cfg: PrepareConfig, kept: int) -> int:
    """Documents of `kept` to hold out: at least one (check_config), and fewer than kept, which only the count of
    documents kept can tell."""
    if cfg.heldout_docs is not None:
        n, given = cfg.heldout_docs, f"heldout_docs (--heldout-docs)={cfg.heldout_docs}"
    else:
        n, given = max(1, round(cfg.heldout_frac * kept)), f"heldout_frac (--heldout-frac)={cfg.heldout_frac}"
    if n >= kept:
        raise ValueError(f"{given} holds out {n} of the {kept} documents kept, leaving none to train on; "
                         f"lower it or add documents")
    return n


def _pack_to_flat(texts, tok, cfg: PrepareConfig, flat: Path) -> tuple[int, int, int]:
    """pack=True: every non-empty document (its first doc_len - 1 tokens, then EOT) laid into rows of doc_len
    tokens, cut at a row's end (module docstring). Returns (documents read, rows written, documents packed)."""
    L = cfg.doc_len
    cut = _prefix_chars(L)
    seen = rows = docs = 0
    row, fill = np.empty(L, dtype=_dtype(tok)), 0
    bar = tqdm(desc="tokenizing", unit="doc", disable=not cfg.progress)
    with open(flat, "wb") as f, bar:
        batch: list[str] = []

        def flush() -> bool:
            """Pack the batch; False once max_docs rows are written."""
            nonlocal rows, docs, fill
            for text, ids in zip(batch, tok.encode_batch([t[:cut] for t in batch])):
                if len(ids) < L - 1 and len(text) > cut:  # unusually long tokens: tokenize the whole text
                    ids = tok.encode_batch([text])[0]
                if len(ids) == 0:
                    continue
                doc = np.append(np.asarray(ids[:L - 1]), tok.eot_id)
                n = min(len(doc), L - fill)
                row[fill:fill + n] = doc[:n]
                fill += n
                docs += 1
                if fill == L:
                    f.write(row.tobytes())
                    rows, fill = rows + 1, 0
                    if cfg.max_docs is not None and rows >= cfg.max_docs:
                        return False
            batch.clear()
            bar.set_postfix(rows=rows)
            return True

        for text in texts:
            seen += 1
            bar.update(1)
            if text.strip():
                batch.append(text)
            if len(batch) >= cfg.batch_docs and not flush():
                return seen, rows, docs
        flush()  # a last row left partly filled is dropped (padding would be documents of EOT alone)
    return seen, rows, docs - (fill > 0) * _docs_in(row[:fill], tok.eot_id)


def _docs_in(tokens: np.ndarray, eot_id: int) -> int:
    """Documents that begin in a packed row's first tokens (each ends at an EOT, the last one maybe cut)."""
    return int((tokens == eot_id).sum()) + int(len(tokens) > 0 and tokens[-1] != eot_id)


def _tokenize_to_flat(texts, tok, cfg: PrepareConfig, flat: Path) -> tuple[int, int, int]:
    L = cfg.doc_len
    seen = kept = 0
    cut = _prefix_chars(L)
    bar = tqdm(desc="tokenizing", unit="doc", disable=not cfg.progress)
    with open(flat, "wb") as f, bar:
        batch: list[str] = []

        def flush():
            nonlocal kept
            prefixes = [t[:cut] for t in batch]
            for text, ids in zip(batch, tok.encode_batch(prefixes)):
                if len(ids) < L and len(text) > cut:  # unusually long tokens: tokenize the whole text
                    ids = tok.encode_batch([text])[0]
                if len(ids) >= L:
                    f.write(np.ascontiguousarray(ids[:L], dtype=_dtype(tok)).tobytes())
                    kept += 1
            batch.clear()
            bar.set_postfix(kept=kept)

        for text in texts:
            seen += 1
            bar.update(1)
            # every token covers >= 1 UTF-8 byte, so shorter texts can't reach doc_len: skip the tokenizer.
            # Long texts are tokenized from a prefix that almost surely holds doc_len tokens (8 chars per
            # token; GPT-2 averages ~4), which keeps tokenizing cheap; flush() falls back to the full text.
            if len(text) < L and len(text.encode("utf-8", errors="replace")) < L:
                continue
            batch.append(text)
            if len(batch) >= cfg.batch_docs:
                flush()
            if cfg.max_docs is not None and kept + len(batch) >= cfg.max_docs:
                break
        flush()
    if cfg.max_docs is not None:
        kept = min(kept, cfg.max_docs)
    return seen, kept, kept


def _prefix_chars(doc_len: int) -> int:
    """Characters of a text tokenized first: doc_len tokens unless they average more than 8 characters."""
    return 8 * doc_len + 64


def _read_chars(doc_len: int) -> int:
    """Characters of a text file's document read at most (the rest is never held): 4 prefixes, for the texts whose
    prefix holds fewer than doc_len tokens."""
    return 4 * _prefix_chars(doc_len)


def _dtype(tok) -> np.dtype:
    return np.dtype(np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32)


def _prepare_packages(tmp: Path, cfg: PrepareConfig, tok) -> dict:
    """Source trees -> packages -> split by package -> tokenizer on the train packages -> documents."""
    L = cfg.doc_len
    stats = CorpusStats()
    roots = [Path(os.path.expanduser(s)) for s in cfg.inputs]
    texts = dict(tqdm(package_texts(roots, max_file_bytes=cfg.max_file_bytes, stats=stats), desc="reading packages",
                      unit="pkg", disable=not cfg.progress))
    # tokens <= UTF-8 bytes for every tokenizer here, so a package of fewer bytes cannot fill one document
    nbytes = {name: sum(len(t.encode("utf-8")) for t in parts) for name, parts in texts.items()}
    eligible = [name for name in texts if nbytes[name] >= L]
    if not eligible:
        links = sum(1 for root in roots for child in root.iterdir() if child.is_symlink())
        unfollowed = (f"; {links} symbolic link{'s' * (links != 1)} in the inputs, never followed: give the folders "
                      f"they point to as inputs") if links else ""
        raise ValueError(f"input: no package of {', '.join(cfg.inputs)} holds >= doc_len={L} bytes of text "
                         f"({len(texts)} packages with text){unfollowed}")
    rng = np.random.default_rng(cfg.seed)
    shuffled = [eligible[i] for i in rng.permutation(len(eligible))]
    target = cfg.heldout_frac * sum(nbytes[n] for n in eligible)
    # whole packages in a random order, skipping those that would overshoot twice the target (one package can be
    # a quarter of a corpus); the smallest one if none fits
    heldout, held_bytes = [], 0
    for name in shuffled:
        if held_bytes >= target and heldout:
            break
        if held_bytes + nbytes[name] <= 2 * target:
            heldout.append(name)
            held_bytes += nbytes[name]
    if not heldout:
        heldout = [min(shuffled, key=lambda n: nbytes[n])]
    train = [n for n in shuffled if n not in set(heldout)]
    if not train:
        raise ValueError(f"heldout: the heldout packages would take all {len(eligible)} packages long enough for "
                         f"one document; lower --heldout-frac or add inputs")
    if tok is None:  # bpe (also what auto means here)
        tok = BPETokenizer.train((part for n in sorted(train) for part in texts[n]), cfg.vocab_size)
        tok.save(tmp / TOKENIZER_FILE)
    flat = tmp / "kept.tokens"
    tokens = {"train": 0, "heldout": 0}
    docs_of = {"train": 0, "heldout": 0}
    packages_with_docs = {"train": 0, "heldout": 0}
    package_tokens: dict[str, int] = {}
    with open(flat, "wb") as f:
        for split, names in (("heldout", heldout), ("train", train)):
            for name in tqdm(names, desc=f"tokenizing {split}", unit="pkg", disable=not cfg.progress):
                # file by file (the tokenizer runs a batch in parallel; batches of files bound its memory); a part
                # ends in a newline and the next starts with a header, so no token spans two files
                parts = texts.pop(name)
                ids = np.concatenate([a for lo in range(0, len(parts), 256)
                                      for a in tok.encode_batch(parts[lo:lo + 256])])
                n = len(ids) // L
                if split == "heldout" and cfg.heldout_docs is not None:
                    n = min(n, cfg.heldout_docs - docs_of["heldout"])
                tokens[split] += len(ids)
                package_tokens[name] = len(ids)
                if n > 0:
                    f.write(np.ascontiguousarray(ids[:n * L], dtype=_dtype(tok)).tobytes())
                    docs_of[split] += n
                    packages_with_docs[split] += 1
    n_held, n_train = docs_of["heldout"], docs_of["train"]
    if cfg.heldout_docs is not None and n_held < cfg.heldout_docs:
        raise ValueError(f"heldout_docs (--heldout-docs): {cfg.heldout_docs} asked, but the heldout packages "
                         f"({', '.join(heldout[:5])}{', ...' if len(heldout) > 5 else ''}) make {n_held} documents "
                         f"of {L} tokens; raise --heldout-frac")
    if n_held == 0:  # packages of enough bytes, but fewer tokens: the dataset would lack its heldout split
        raise ValueError(f"heldout_frac (--heldout-frac)={cfg.heldout_frac}: the heldout packages "
                         f"({', '.join(heldout[:5])}{', ...' if len(heldout) > 5 else ''}) make no document of {L} "
                         f"tokens (tokenizer {tok.name}); raise --heldout-frac")
    if n_train == 0:
        raise ValueError(f"no training package holds >= doc_len={L} tokens (tokenizer {tok.name})")
    described = f"packages of {', '.join(cfg.inputs)}"
    summary = _shuffle_roll_write(tmp, flat, n_held + n_train, np.arange(n_held), np.arange(n_held, n_held + n_train),
                                  tok, cfg, described)
    flat.unlink()
    summary.update(
        group_by="package", packages_found=stats.packages_found, packages_long_enough=len(eligible),
        train_packages=packages_with_docs["train"], heldout_packages=sorted(heldout),
        files_kept=stats.files_kept, files_duplicate=stats.files_duplicate, files_too_large=stats.files_too_large,
        files_binary=stats.files_binary, files_not_utf8=stats.files_not_utf8,
        tokens_train_packages=tokens["train"], tokens_heldout_packages=tokens["heldout"],
        tokens_in_documents=(n_held + n_train) * L, documents_kept=n_held + n_train,
        package_tokens=dict(sorted(package_tokens.items())))
    return summary


def _shuffle_roll_write(root: Path, flat: Path, kept: int, heldout_idx: np.ndarray, train_idx: np.ndarray, tok,
                        cfg: PrepareConfig, described: str) -> dict:
    """Write each split's documents (rows of the flat file) in a random order, rolled, as chunked zarr."""
    import numcodecs
    import zarr

    L = cfg.doc_len
    dtype = _dtype(tok)
    docs = np.memmap(flat, dtype=dtype, mode="r", shape=(kept, L))
    rng = np.random.default_rng([cfg.seed, 1])
    splits = {"heldout": rng.permutation(heldout_idx), "train": rng.permutation(train_idx)}
    offsets = rng.integers(0, L, size=kept)
    params = {k: v for k, v in asdict(cfg).items() if k not in ("overwrite", "progress", "out", "source")}
    attrs = {"bos_id": int(tok.eot_id), "vocab_size": int(tok.vocab_size), "tokenizer": tok.name,
             "rolled": bool(cfg.rolled and not cfg.pack), "packed": bool(cfg.pack), "prepare": params,
             "source": described}
    if isinstance(tok, BPETokenizer):
        attrs["tokenizer_file"] = TOKENIZER_FILE
    max_id = 0
    bar = tqdm(total=kept, desc="shuffle+roll+write", unit="doc", disable=not cfg.progress)
    with bar:
        for split, idx in splits.items():
            if len(idx) == 0:
                continue
            chunks = (min(cfg.chunk_docs, len(idx)), min(cfg.chunk_len, L))
            kw = {}
            if cfg.zarr_format == 2:  # LongCrawl64's exact format: v2, Blosc(lz4, shuffle) as zarr 2 wrote it
                kw["compressors"] = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
            arr = zarr.create_array(str(root / f"{split}.zarr"), shape=(len(idx), L), chunks=chunks,
                                    dtype=dtype, zarr_format=cfg.zarr_format, config=WRITE_EVERY_CHUNK, **kw)
            for lo in range(0, len(idx), chunks[0]):
                rows = idx[lo:lo + chunks[0]]
                block = docs[np.sort(rows)][np.argsort(np.argsort(rows))]  # sorted reads from disk, original order
                if cfg.rolled and not cfg.pack:  # packed rows keep their documents in place
                    block[:, -1] = tok.eot_id           # seam marker: doc[:L-1] + [EOT], then rotate left by k
                    for r, k in enumerate(offsets[rows].tolist()):
                        block[r] = np.concatenate([block[r, k:], block[r, :k]])
                arr[lo:lo + len(rows)] = block
                max_id = max(max_id, int(block.max()))
                bar.update(len(rows))
            arr.attrs.update(attrs)
    del docs
    for split in splits:
        if (root / f"{split}.zarr").exists():
            zarr.open_array(str(root / f"{split}.zarr"), mode="r+").attrs["max_token_id"] = max_id
    summary = {"source": described, "train_docs": int(len(splits["train"])), "heldout_docs": int(len(heldout_idx)),
               "doc_len": L, "tokenizer": tok.name, "bos_id": int(tok.eot_id), "vocab_size": int(tok.vocab_size),
               "max_token_id": max_id, "rolled": bool(cfg.rolled and not cfg.pack), "packed": bool(cfg.pack),
               "params": params}
    if isinstance(tok, BPETokenizer):
        summary["tokenizer_file"] = TOKENIZER_FILE
    return summary


if __name__ == "__main__":   # the library behind the command, which lives in scripts/: said, never a silent no-op
    import sys

    print("longctx.data.prepare is the library behind scripts/prepare_dataset.py; run: python "
          "scripts/prepare_dataset.py --help", file=sys.stderr)
    sys.exit(2)
