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
    packed        rows of packed variable-length documents, each its tokens then bos_id (prepare_dataset --pack)
    bayes_nll     path, relative to the array's parent folder, of a float32 [num_docs, doc_len] array
                  holding the Bayes-optimal per-token NLL of this split
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import zarr

GPT2_EOT = 50256
GPT2_VOCAB = 50257
TOKEN_DTYPES = (np.dtype("uint16"), np.dtype("uint32"))
# Zarr 3 skips writing chunks that hold only the fill value; our writers write every chunk, so that a chunk file
# missing from a dataset is always a damaged or partial copy, never a chunk of zeros
WRITE_EVERY_CHUNK = {"write_empty_chunks": True}


class ChunkError(ValueError):
    """A chunk of a token array is missing or cannot be decoded; the message names the array, the chunk and its file."""


def open_tokens(path, *, field: str = "data.path") -> zarr.Array:
    """Open one split's token array read-only; raise one clear error naming `field` if it is not usable."""
    if isinstance(path, zarr.Array):
        arr = path
    else:
        p = Path(os.path.expanduser(str(path)))
        if not p.exists():
            _refuse_split_as_folder(p, field)
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


def _refuse_split_as_folder(p: Path, field: str) -> None:
    """`p` (a split under a dataset folder) is missing because the folder given is itself one split's array
    (`data.path=ds/train.zarr`): say so and name the folder to give, rather than a path that was never meant."""
    given = next((a for a in p.parents if a.exists()), None)
    if given is not None and _is_array_dir(given):
        raise ValueError(f"{field}={str(given)!r}: is one split's zarr array, not a dataset folder; give the folder "
                         f"holding train.zarr and heldout.zarr: {field}={str(given.parent)!r}")


def _is_array_dir(p: Path) -> bool:
    """Whether `p` holds a zarr array's metadata (v2 `.zarray`, or a v3 `zarr.json` of node_type array)."""
    if (p / ".zarray").is_file():
        return True
    try:
        return json.loads((p / "zarr.json").read_text()).get("node_type") == "array"
    except (OSError, ValueError, AttributeError):
        return False


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


def _int_attr(arr: zarr.Array, attrs: dict, name: str, default: int, least: int) -> int:
    """An integer attribute of the array (its default when absent); ValueError naming the array and the attribute
    for anything else (a string, a float, a bool) or a value below `least`."""
    value = attrs.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{_where(arr)}: attribute {name}={value!r} is not an integer >= {least}")
    return value


def info(arr: zarr.Array) -> dict:
    attrs = array_attrs(arr)
    n, L = (int(s) for s in arr.shape)
    d = {
        "num_docs": n,
        "doc_len": L,
        "dtype": str(np.dtype(arr.dtype)),
        "chunks": tuple(int(c) for c in arr.chunks),
        "zarr_format": int(arr.metadata.zarr_format),
        "bos_id": _int_attr(arr, attrs, "bos_id", GPT2_EOT, least=0),
        "vocab_size": _int_attr(arr, attrs, "vocab_size", GPT2_VOCAB, least=1),
        "max_token_id": attrs.get("max_token_id"),
        "rolled": attrs.get("rolled"),
        "packed": bool(attrs.get("packed", False)),
        "tokenizer": attrs.get("tokenizer"),
        "generator": attrs.get("generator"),
        "bayes_nll": None,
    }
    bayes = bayes_path(arr)
    d["bayes_nll"] = str(bayes) if bayes is not None else None
    return d


# ----- chunks: presence and decoding, named -----------------------------------------------------------------
def _chunk_shape(arr: zarr.Array) -> tuple[int, int]:
    """Shape of one stored object (a shard when the array is sharded, else a chunk)."""
    shards = getattr(arr, "shards", None)
    return tuple(int(c) for c in (shards or arr.chunks))


def chunk_grid(arr: zarr.Array, rows, cols: slice) -> list[tuple[int, int]]:
    """Chunk coordinates covering rows (a slice or an index array) x the position slice `cols`."""
    cd, ct = _chunk_shape(arr)
    if isinstance(rows, slice):
        lo, hi, _ = rows.indices(int(arr.shape[0]))
        row_chunks = range(lo // cd, (hi - 1) // cd + 1) if hi > lo else range(0)
    else:
        row_chunks = np.unique(np.asarray(rows) // cd).tolist()
    c0, c1, _ = cols.indices(int(arr.shape[1]))
    col_chunks = range(c0 // ct, (c1 - 1) // ct + 1) if c1 > c0 else range(0)
    return [(int(i), int(j)) for i in row_chunks for j in col_chunks]


def chunk_file(arr: zarr.Array, coords: tuple[int, int]) -> Path | None:
    where = array_dir(arr)
    if where is None:
        return None
    return where / arr.metadata.encode_chunk_key(coords)


def check_chunks_present(arr: zarr.Array, rows, cols: slice, *, field: str = "data.path",
                         listing: set[str] | None = None) -> None:
    """Raise ChunkError naming the first chunk of the region that has no file (zarr would read it as the fill
    value, 0, silently). One directory listing when `listing` is None; nothing to do for in-memory arrays."""
    where = array_dir(arr)
    if where is None:
        return
    if listing is None:
        listing = _list_files(where)
    missing = [c for c in chunk_grid(arr, rows, cols) if arr.metadata.encode_chunk_key(c) not in listing]
    if missing:
        key = arr.metadata.encode_chunk_key(missing[0])
        more = f" (and {len(missing) - 1} more chunks)" if len(missing) > 1 else ""
        raise ChunkError(f"{field}: chunk {key!r} of {str(where)!r} is missing{more}: {str(where / key)!r} does "
                         f"not exist; the copy is damaged or partial (zarr would read it as token 0)")


def _list_files(root: Path) -> set[str]:
    out = set()
    for dirpath, _, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        out.update(prefix + f for f in files)
    return out


def read_region(arr: zarr.Array, rows, cols: slice, *, field: str = "data.path") -> np.ndarray:
    """`arr[rows, cols]` (rows: a slice or a sorted index array) as numpy, refusing missing chunks and naming the
    chunk, array and file of a chunk that fails to decode (zarr's own error names none of them)."""
    check_chunks_present(arr, rows, cols, field=field,
                         listing=None if array_dir(arr) is None else _present(arr, rows, cols))
    if _is_blosc(arr):
        _check_blosc_sizes(arr, rows, cols, field)
    try:
        if isinstance(rows, slice):
            return np.asarray(arr[rows, cols])
        return np.asarray(arr.oindex[rows, cols])
    except Exception as e:
        raise _decode_error(arr, rows, cols, field, e) from e


def _present(arr: zarr.Array, rows, cols: slice) -> set[str]:
    """The region's chunk keys that exist on disk (one stat per chunk: a read touches a few dozen)."""
    where = array_dir(arr)
    keys = (arr.metadata.encode_chunk_key(c) for c in chunk_grid(arr, rows, cols))
    return {k for k in keys if (where / k).exists()}


def _is_blosc(arr: zarr.Array) -> bool:
    """Blosc (LongCrawl64's compressor) decodes a truncated chunk into garbage without an error."""
    if array_dir(arr) is None:
        return False
    comp = getattr(arr.metadata, "compressor", None)                    # format v2
    codecs = getattr(arr.metadata, "codecs", ())                         # format v3
    return (getattr(comp, "codec_id", None) == "blosc"
            or any(type(c).__name__ == "BloscCodec" for c in codecs))


def _check_blosc_sizes(arr: zarr.Array, rows, cols: slice, field: str) -> None:
    """A Blosc frame records its own length (header bytes 12-15): a file of another size is damaged."""
    for coords in chunk_grid(arr, rows, cols):
        f = chunk_file(arr, coords)
        with open(f, "rb") as fh:
            header = fh.read(16)
            size = os.fstat(fh.fileno()).st_size
        recorded = int.from_bytes(header[12:16], "little") if len(header) == 16 else -1
        if recorded != size:
            key = arr.metadata.encode_chunk_key(coords)
            raise ChunkError(f"{field}: chunk {key!r} of {_where(arr)} cannot be decoded (Blosc frame of {recorded} "
                             f"bytes, file of {size}); file {str(f)!r} is damaged or truncated")


def _decode_error(arr: zarr.Array, rows, cols: slice, field: str, cause: Exception) -> Exception:
    """Find the chunk that fails alone and name it; else the original error, with the array named."""
    cd, ct = _chunk_shape(arr)
    for i, j in chunk_grid(arr, rows, cols):
        try:
            np.asarray(arr[i * cd:(i + 1) * cd, j * ct:(j + 1) * ct])
        except Exception as e:
            key = arr.metadata.encode_chunk_key((i, j))
            return ChunkError(f"{field}: chunk {key!r} of {_where(arr)} cannot be decoded ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); file {str(chunk_file(arr, (i, j)))!r} "
                              f"is damaged or truncated")
    return ChunkError(f"{field}: reading {_where(arr)} failed: {type(cause).__name__}: {cause}")


def own_file(folder: Path, name, attr: str, where) -> Path:
    """folder / name for a dataset attribute naming one of the dataset's own files (tokenizer_file, bayes_nll): a plain
    name beside its splits. ValueError naming the attribute for anything else (a path elsewhere, '..'): a dataset's
    attributes never make a run read, or copy into its folder, a file outside the dataset."""
    if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise ValueError(f"{where}: attribute {attr}={name!r} is not a file name beside the dataset's splits (a dataset "
                         f"names only its own files)")
    return Path(folder) / name


def bayes_path(arr: zarr.Array) -> Path | None:
    rel = array_attrs(arr).get("bayes_nll")
    where = array_dir(arr)
    if rel is None or where is None:
        return None
    p = own_file(where.parent, rel, "bayes_nll", where)
    return p if p.exists() else None
