"""Build a dataset in the LongCrawl64 layout from your own text (the engine of scripts/prepare_dataset.py).

Pipeline (streaming: memory stays O(one output chunk-row), whatever the corpus size):

1. read documents with `datasets.load_dataset(..., streaming=True)` — local text / json(l) / parquet / csv
   files, a folder of .txt files (one document per file), or a Hub dataset name when online;
2. tokenize (GPT-2 BPE via tiktoken when its vocabulary is available offline, else the byte-level
   fallback below), keep documents with at least `doc_len` tokens, truncate to `doc_len`, and append them
   to a temporary flat uint16 file on disk;
3. shuffle (a random permutation of the kept documents), split off `heldout` documents, roll, and write
   `train.zarr` / `heldout.zarr` `[N, doc_len]` uint16 in chunks of `chunk_docs x chunk_len`, one
   chunk-row at a time, gathered from the flat file through a memory map.

Roll (LongCrawl64 calls its documents "rolled"): each kept document keeps its first `doc_len - 1`
tokens, gets the EOT/BOS id appended, and is then rotated left by a random offset k, so the stored row is
`doc[k:] + [EOT] + doc[:k]`-shaped: the document's start sits at a uniformly random position and the EOT
marks the seam. `rolled=False` stores the first `doc_len` tokens as they are.

Offline tokenizer fallback ("bytes"): ids 0..255 are the UTF-8 bytes of the text, EOT/BOS is 256,
vocab_size 257. The arrays' attributes record `tokenizer`, `bos_id`, `vocab_size`, `max_token_id`,
`rolled`, and the preparation parameters, so the reader and `check_vocab` pick them up.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

TEXT_SUFFIXES = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
                 ".parquet": "parquet", ".csv": "csv"}
log = logging.getLogger("longctx.data.prepare")


# ----- tokenizers ------------------------------------------------------------------------------------
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; EOT/BOS 256; vocab_size 257. Needs nothing from the network."""
    name = "bytes"
    eot_id = 256
    vocab_size = 257

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8", errors="replace"), dtype=np.uint8).astype(np.uint16) for t in texts]


class TiktokenGPT2:
    """GPT-2 BPE (tiktoken, LongCrawl64's tokenizer): EOT 50256, vocab_size 50257."""
    name = "tiktoken-gpt2"

    def __init__(self):
        import tiktoken
        self.enc = tiktoken.get_encoding("gpt2")
        self.eot_id = self.enc.eot_token
        self.vocab_size = self.enc.n_vocab

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint16) for ids in self.enc.encode_ordinary_batch(texts)]


def get_tokenizer(name: str = "auto"):
    """'gpt2' (tiktoken; fails with a hint if its vocabulary can't be loaded), 'bytes', or 'auto' (gpt2 if
    it loads, else bytes)."""
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
                sample_by: str = "document"):
    """A streaming iterable of raw text documents and a short description of where they come from."""
    import datasets

    p = Path(os.path.expanduser(source))
    if p.is_dir():
        files = sorted(f for f in glob.glob(str(p / "**" / "*"), recursive=True)
                       if Path(f).suffix.lower() in TEXT_SUFFIXES and Path(f).is_file())
        if not files:
            raise FileNotFoundError(f"input: {str(p)!r} holds no {', '.join(sorted(TEXT_SUFFIXES))} files")
        kinds = {TEXT_SUFFIXES[Path(f).suffix.lower()] for f in files}
        if len(kinds) > 1:
            raise ValueError(f"input: {str(p)!r} mixes file kinds {sorted(kinds)}; point at one kind")
        builder = kinds.pop()
    elif p.is_file():
        if p.suffix.lower() not in TEXT_SUFFIXES:
            raise ValueError(f"input: {str(p)!r} has suffix {p.suffix!r}; expected one of {sorted(TEXT_SUFFIXES)}")
        files, builder = [str(p)], TEXT_SUFFIXES[p.suffix.lower()]
    elif _looks_local(source):
        raise FileNotFoundError(f"input: {source!r} does not exist (a local path: no such file or folder)")
    else:  # a Hub dataset name
        try:
            ds = datasets.load_dataset(source, hf_config, split=split, streaming=True)
        except Exception as e:  # offline, no such dataset, gated: one line, not the Hub client's traceback
            raise RuntimeError(f"input: {source!r} is not a local file or folder, and the Hub dataset of that "
                               f"name could not be opened ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        return _texts(ds, text_field, source), f"hub:{source}" + (f"/{hf_config}" if hf_config else "")
    kwargs = {"sample_by": sample_by} if builder == "text" else {}
    ds = datasets.load_dataset(builder, data_files=files, split="train", streaming=True, **kwargs)
    field = "text" if builder == "text" else text_field
    return _texts(ds, field, source), f"{builder}:{len(files)} file(s) under {source}"


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
    for row in ds:
        if field not in row:
            raise ValueError(f"text_field: {field!r} is not a column of {source} (columns: {sorted(row)})")
        text = row[field]
        if isinstance(text, str):
            yield text


# ----- preparation -------------------------------------------------------------------------------------
@dataclass
class PrepareConfig:
    source: str
    out: str
    doc_len: int = 65536
    heldout_frac: float = 0.01
    heldout_docs: int | None = None
    tokenizer: str = "auto"
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


def prepare_dataset(cfg: PrepareConfig) -> dict:
    """Build `cfg.out/{train,heldout}.zarr` (+ `prepare.json`) and return the summary written there."""
    out = Path(os.path.expanduser(cfg.out))
    if cfg.doc_len < 2:
        raise ValueError(f"doc_len: must be >= 2, got {cfg.doc_len}")
    if out.exists() and not cfg.overwrite:
        raise FileExistsError(f"out: {str(out)!r} already exists; pass --overwrite to replace it")
    if not 0 <= cfg.heldout_frac < 1:
        raise ValueError(f"heldout_frac: must be in [0, 1), got {cfg.heldout_frac}")
    texts, described = open_source(cfg.source, text_field=cfg.text_field, split=cfg.split,
                                   hf_config=cfg.hf_config, sample_by=cfg.sample_by)  # a mistyped path fails first
    tok = get_tokenizer(cfg.tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        seen, kept = _tokenize_to_flat(texts, tok, cfg, tmp / "kept.u16")
        if kept == 0:
            raise ValueError(f"no document of {described} has >= doc_len={cfg.doc_len} tokens "
                             f"({seen} documents read, tokenizer {tok.name})")
        n_held = cfg.heldout_docs if cfg.heldout_docs is not None else max(1, round(cfg.heldout_frac * kept))
        if cfg.heldout_frac == 0 and cfg.heldout_docs is None:
            n_held = 0
        if not 0 <= n_held < kept:
            raise ValueError(f"heldout_docs={n_held} must leave at least one training document (kept {kept})")
        summary = _shuffle_roll_write(tmp, tmp / "kept.u16", kept, n_held, tok, cfg, described, seen)
        (tmp / "kept.u16").unlink()
        (tmp / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n")
        if out.exists():  # only reachable with overwrite=True; replace only after success
            shutil.rmtree(out)
        os.rename(tmp, out)
        _chmod_like_umask(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return summary


def _chmod_like_umask(path: Path) -> None:
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o777 & ~mask)  # mkdtemp made it private


def _tokenize_to_flat(texts, tok, cfg: PrepareConfig, flat: Path) -> tuple[int, int]:
    L = cfg.doc_len
    seen = kept = 0
    cut = 8 * L + 64
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
                    f.write(np.ascontiguousarray(ids[:L], dtype=np.uint16).tobytes())
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
    return seen, kept


def _shuffle_roll_write(root: Path, flat: Path, kept: int, n_held: int, tok, cfg: PrepareConfig,
                        described: str, seen: int) -> dict:
    import numcodecs
    import zarr

    L = cfg.doc_len
    docs = np.memmap(flat, dtype=np.uint16, mode="r", shape=(kept, L))
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(kept)
    splits = {"heldout": order[:n_held], "train": order[n_held:]}
    offsets = rng.integers(0, L, size=kept)
    params = {k: v for k, v in asdict(cfg).items() if k not in ("overwrite", "progress", "out")}
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
                                    dtype="uint16", zarr_format=cfg.zarr_format, **kw)
            for lo in range(0, len(idx), chunks[0]):
                rows = idx[lo:lo + chunks[0]]
                block = docs[np.sort(rows)][np.argsort(np.argsort(rows))]  # sorted reads from disk, original order
                if cfg.rolled:
                    block[:, -1] = tok.eot_id           # seam marker: doc[:L-1] + [EOT], then rotate left by k
                    for r, k in enumerate(offsets[rows].tolist()):
                        block[r] = np.concatenate([block[r, k:], block[r, :k]])
                arr[lo:lo + len(rows)] = block
                max_id = max(max_id, int(block.max()))
                bar.update(len(rows))
            arr.attrs.update({"bos_id": int(tok.eot_id), "vocab_size": int(tok.vocab_size),
                              "tokenizer": tok.name, "rolled": bool(cfg.rolled), "prepare": params,
                              "source": described})
    del docs
    for split in splits:
        if (root / f"{split}.zarr").exists():
            zarr.open_array(str(root / f"{split}.zarr"), mode="r+").attrs["max_token_id"] = max_id
    return {"source": described, "documents_read": seen, "documents_kept": kept,
            "train_docs": int(len(splits["train"])), "heldout_docs": int(n_held), "doc_len": L,
            "tokenizer": tok.name, "bos_id": int(tok.eot_id), "vocab_size": int(tok.vocab_size),
            "max_token_id": max_id, "rolled": bool(cfg.rolled), "params": params}
