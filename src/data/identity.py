"""What data a run trains and evaluates on, as a record two runs (or a run and its resume) can compare.

A split's identity is its absolute path, shape, dtype and recorded attributes (tokenizer, generator parameters,
preparation parameters), the SHA-256 of its BPE tokenizer file where it has one (`tokenizer_sha256`: two BPEs of
one size share their name; not part of `id`), plus a SHA-256 of its tokens: of the whole array up to
`FULL_HASH_TOKENS` tokens, else of its first and last chunk-rows (`"hashed": "ends"`). A dataset replaced under the
same path, an ICL Markov dataset generated for another doc_len, or a prepared corpus from other text changes the
digest; a folder moved or mounted elsewhere does not (the path is recorded but not part of `id`).

    identity = data_identity(train_path, heldout_path)
    identity["id"], identity["heldout"]["digest"]

`same_eval_data(a, b)` is what the report asks before pairing two runs on "the same documents".
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ._array import info, open_tokens, read_region

FULL_HASH_TOKENS = 1 << 24  # 32 MiB of uint16: hashed whole in well under a second
IDENTITY_FILE = "data_identity.json"  # in a run folder, written at its first launch
_IDENTITY_ATTRS = ("vocab_size", "bos_id", "tokenizer", "generator", "rolled", "max_token_id")
NOT_IN_ID = ("path", "tokenizer_sha256")   # where the split lies; its BPE file's hash (the tokenizer's name is in)


def _digest_rows(arr, field: str) -> tuple[str, str]:
    n, length = (int(s) for s in arr.shape)
    h = hashlib.sha256(f"{arr.dtype}:{n}x{length}".encode())
    if n * length <= FULL_HASH_TOKENS:
        step = max(1, int(arr.chunks[0]))
        for lo in range(0, n, step):
            h.update(np.ascontiguousarray(read_region(arr, slice(lo, min(lo + step, n)), slice(0, length),
                                                      field=field)).tobytes())
        return h.hexdigest(), "all"
    rows = max(1, int(arr.chunks[0]))
    for lo in sorted({0, max(0, n - rows)}):
        h.update(np.ascontiguousarray(read_region(arr, slice(lo, min(lo + rows, n)), slice(0, length),
                                                  field=field)).tobytes())
    return h.hexdigest(), "ends"


def split_identity(path, *, field: str = "data.path") -> dict:
    """One split's identity: `path` (absolute), `shape`, `dtype`, the identifying attributes, `digest`, `hashed`."""
    from .tokenizer import file_sha256, tokenizer_file_of

    arr = open_tokens(path, field=field)
    meta = info(arr)
    digest, hashed = _digest_rows(arr, field)
    vocab = tokenizer_file_of(path)
    return {"path": str(Path(str(path)).expanduser().resolve()), "shape": [int(s) for s in arr.shape],
            "dtype": meta["dtype"], "attrs": {k: meta.get(k) for k in _IDENTITY_ATTRS},
            "digest": digest, "hashed": hashed, "tokenizer_sha256": file_sha256(vocab) if vocab else None}


def data_identity(train_path, heldout_path, *, field: str = "data.path") -> dict:
    """Both splits' identities and `id`, a short digest of their contents and attributes (not their paths)."""
    train, heldout = split_identity(train_path, field=field), split_identity(heldout_path, field=field)
    # the id of records written before the tokenizer file's hash was kept: that hash is recorded beside, not in it
    key = json.dumps([{k: v for k, v in s.items() if k not in NOT_IN_ID} for s in (train, heldout)], sort_keys=True,
                     default=str)
    return {"id": hashlib.sha256(key.encode()).hexdigest()[:16], "train": train, "heldout": heldout}


def same_eval_data(a: dict | None, b: dict | None) -> bool:
    """Whether two identities evaluate on the same heldout documents: the same tokens (the digest covers the
    dtype and shape) under the same tokenizer. Generator parameters that do not change the heldout tokens (e.g.
    the size of the training split) do not matter."""
    if not a or not b:
        return False
    x, y = a["heldout"], b["heldout"]
    return (x["digest"], x["hashed"], x["attrs"].get("tokenizer")) == (y["digest"], y["hashed"],
                                                                      y["attrs"].get("tokenizer"))


def read_identity(run_dir) -> dict | None:
    """The identity a run recorded at its first launch, or None for a run made before runs recorded one."""
    path = Path(run_dir) / IDENTITY_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: unreadable data identity ({type(err).__name__})") from None
    if not (isinstance(record, dict) and isinstance(record.get("id"), str)
            and all(isinstance(record.get(s), dict) and "digest" in record[s] for s in ("train", "heldout"))):
        raise ValueError(f"{path}: not a data identity record (needs id, train.digest, heldout.digest)")
    return record
