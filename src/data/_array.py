"""Opening and validating token arrays in the LongCrawl64 layout.

A split is one zarr array `[num_docs, doc_len]` of unsigned token ids (uint16 for GPT-2 ids, the
LongCrawl64 dtype; uint32 allowed for larger vocabularies). Zarr format v2 (real LongCrawl64, written by
zarr 2) and v3 are both opened by `zarr.open_array`, which detects the format from the store.

Attributes we read when present (all optional; real LongCrawl64 has none):
    bos_id        id placed at inputs[:, 0]            (default 50256, GPT-2's <|endoftext|>)
    vocab_size    model vocabulary needed for this data (default 50257, GPT-2's)
    max_token_id  largest id in the array (lets `check_vocab` skip the scan)
    generator     dict of the parameters that generated the data (synthetic datasets)
    tokenizer     name of the tokenizer (prepared datasets)
    rolled        whether each document was cyclically rotated by a random offset (LongCrawl64: true)
    bayes_nll     path, relative to the array's parent folder, of a float32 [num_docs, doc_len] array
                  holding the Bayes-optimal per-token NLL of this split
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import zarr

GPT2_EOT = 50256
GPT2_VOCAB = 50257
TOKEN_DTYPES = (np.dtype("uint16"), np.dtype("uint32"))


def open_tokens(path, *, field: str = "data.path") -> zarr.Array:
    """Open one split's token array read-only; raise one clear error naming `field` if it is not usable."""
    if isinstance(path, zarr.Array):
        arr = path
    else:
        p = Path(os.path.expanduser(str(path)))
        if not p.exists():
            raise FileNotFoundError(f"{field}: {str(p)!r} does not exist")
        try:
            arr = zarr.open_array(str(p), mode="r")
        except Exception as e:  # zarr raises several types: group found, no metadata, bad json
            hint = ""
            if (p / "train.zarr").exists() or (p / "heldout.zarr").exists():
                hint = " (it is a dataset folder: point at one split, e.g. .../train.zarr)"
            raise ValueError(f"{field}: {str(p)!r} is not a zarr array{hint}: {e}") from None
    if arr.ndim != 2:
        raise ValueError(f"{field}: expected a 2-d array [num_docs, doc_len], got shape {tuple(arr.shape)} "
                         f"(rank {arr.ndim}) at {_where(arr)}")
    if np.dtype(arr.dtype) not in TOKEN_DTYPES:
        raise ValueError(f"{field}: expected dtype uint16 (or uint32) token ids, got dtype {arr.dtype} "
                         f"at {_where(arr)}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{field}: array is empty, shape {tuple(arr.shape)} at {_where(arr)}")
    return arr


def _where(arr: zarr.Array) -> str:
    try:
        return str(arr.store_path)
    except Exception:
        return "<zarr array>"


def array_attrs(arr: zarr.Array) -> dict:
    try:
        return dict(arr.attrs)
    except Exception:
        return {}


def array_dir(arr: zarr.Array) -> Path | None:
    """Local folder of a zarr array opened from a path (None for in-memory stores)."""
    root = getattr(arr.store, "root", None)
    if root is None:
        return None
    return Path(root) / arr.path if arr.path else Path(root)


def info(arr: zarr.Array) -> dict:
    attrs = array_attrs(arr)
    n, L = (int(s) for s in arr.shape)
    d = {
        "num_docs": n,
        "doc_len": L,
        "dtype": str(np.dtype(arr.dtype)),
        "chunks": tuple(int(c) for c in arr.chunks),
        "zarr_format": int(arr.metadata.zarr_format),
        "bos_id": int(attrs.get("bos_id", GPT2_EOT)),
        "vocab_size": int(attrs.get("vocab_size", GPT2_VOCAB)),
        "max_token_id": attrs.get("max_token_id"),
        "rolled": attrs.get("rolled"),
        "tokenizer": attrs.get("tokenizer"),
        "generator": attrs.get("generator"),
        "bayes_nll": None,
    }
    bayes = bayes_path(arr)
    d["bayes_nll"] = str(bayes) if bayes is not None else None
    return d


def bayes_path(arr: zarr.Array) -> Path | None:
    rel = array_attrs(arr).get("bayes_nll")
    where = array_dir(arr)
    if rel is None or where is None:
        return None
    p = (where.parent / rel)
    return p if p.exists() else None
