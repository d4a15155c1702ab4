"""Helpers: token arrays in the LongCrawl64 layout, in zarr format v3 (zarr 3) and v2 (as zarr 2 wrote it)."""
import json

import numcodecs
import numpy as np
import zarr


def random_tokens(n, L, vocab=50257, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(n, L), dtype=np.uint16)


def write_v3(path, data, chunks, attrs=None):
    arr = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, attributes=attrs or {})
    arr[:] = data
    return path


def write_v2_like_zarr2(path, data, chunks, attrs=None):
    """Write a format-v2 array by hand, byte for byte the way zarr 2 lays it out (LongCrawl64's writer):
    `.zarray` JSON, `.zattrs`, and one Blosc(lz4, shuffle)-compressed C-order chunk per key "i.j",
    edge chunks padded to the full chunk shape. Independent of zarr 3's own v2 writer."""
    path.mkdir(parents=True)
    comp = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    meta = {"zarr_format": 2, "shape": list(data.shape), "chunks": list(chunks), "dtype": data.dtype.str,
            "compressor": comp.get_config(), "fill_value": 0, "filters": None, "order": "C"}
    (path / ".zarray").write_text(json.dumps(meta, indent=4))
    (path / ".zattrs").write_text(json.dumps(attrs or {}))
    cd, ct = chunks
    for i in range(0, data.shape[0], cd):
        for j in range(0, data.shape[1], ct):
            block = np.zeros(chunks, dtype=data.dtype)
            part = data[i:i + cd, j:j + ct]
            block[:part.shape[0], :part.shape[1]] = part
            (path / f"{i // cd}.{j // ct}").write_bytes(comp.encode(np.ascontiguousarray(block)))
    return path
