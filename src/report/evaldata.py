"""Which data a run trained and was evaluated on, as the report groups seeds and pairs runs by it.

A run's data identity (longctx.data.identity: the splits' token digests) is the one it recorded at its first launch
(<run_dir>/data_identity.json), else the one of its dataset when that is still on disk. A run with neither is known
by its config: an ICL Markov dataset by its generator parameters, with the document length it was generated for
(`data.doc_len: null` means max(1024, ctx)); a prepared dataset by its absolute `data.path`. Nothing is generated:
a dataset missing from disk is left to the config.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf

from longctx.data.icl_markov import dataset_dirname, generator_params
from longctx.data.identity import data_identity, read_identity
from longctx.train.data import icl_doc_len, icl_markov_params

ICL_MARKOV = "icl_markov"


def effective_doc_len(flat: dict, ctx: int) -> int | None:
    """The document length an ICL Markov run's data was generated with (None for other data)."""
    if flat.get("data.name") != ICL_MARKOV:
        return None
    return int(icl_doc_len(SimpleNamespace(doc_len=flat.get("data.doc_len")), ctx))


@functools.lru_cache(maxsize=64)
def _identity_of(train: str, heldout: str) -> dict | None:
    try:
        return data_identity(train, heldout)
    except (OSError, ValueError, KeyError):  # unreadable: the config stands for the data
        return None


def _icl_root(config: dict, flat: dict, ctx: int) -> Path | None:
    data = config.get("data") or {}
    cache = data.get("cache_dir") or config.get("cache_dir")
    if not isinstance(cache, str) or "${" in cache:
        return None
    try:  # the generator's arguments exactly as the trainer derives them (train.data.icl_markov_params)
        fields = {k[len("data."):]: v for k, v in flat.items() if k.startswith("data.")}
        params = generator_params(**icl_markov_params(OmegaConf.create(fields), ctx))
    except Exception:  # keys missing or of the wrong kind in an old or damaged config: the config stands for it
        return None
    return Path(os.path.expanduser(cache)) / dataset_dirname(params)


def identity_on_disk(config: dict, flat: dict, ctx: int) -> dict | None:
    """The identity of the dataset a run's config names, when it is on disk (None otherwise)."""
    if flat.get("data.name") == ICL_MARKOV:
        root = _icl_root(config, flat, ctx)
        if root is None or not (root / "params.json").is_file():
            return None
        train, heldout = root / "train.zarr", root / "heldout.zarr"
    else:
        path = (config.get("data") or {}).get("path")
        if not isinstance(path, str) or not path or "${" in path:
            return None
        root = Path(path).expanduser()
        train = root / str(flat.get("data.train_split", "train.zarr"))
        heldout = root / str(flat.get("data.heldout_split", "heldout.zarr"))
    if not (train.exists() and heldout.exists()):
        return None
    return _identity_of(str(train.resolve()), str(heldout.resolve()))


def run_identity(path: Path, config: dict, flat: dict, ctx: int) -> dict | None:
    """The run's recorded identity, else its dataset's on disk, else None (ValueError: a recorded one unreadable)."""
    return read_identity(path) or identity_on_disk(config, flat, ctx)


def data_items(path: Path, config: dict, flat: dict, ctx: int) -> tuple[dict, tuple]:
    """(config entries that tell the run's data apart, for its labels and groups; (key, value) items that tell its
    heldout documents apart, for pairing). With an identity: `data.id` (both splits' contents) and the heldout
    digest; without: the effective `data.doc_len` of ICL Markov data, the absolute `data.path` of a prepared one."""
    entries = {}
    doc_len = effective_doc_len(flat, ctx)
    if doc_len is not None:
        entries["data.doc_len"] = doc_len
    identity = run_identity(path, config, flat, ctx)
    if identity is not None:
        entries["data.id"] = identity["id"]
        heldout = identity["heldout"]
        return entries, (("data.heldout_digest", f"{heldout['digest'][:16]} ({heldout.get('hashed')}, tokenizer "
                                                 f"{heldout.get('attrs', {}).get('tokenizer')})"),)
    raw_path = (config.get("data") or {}).get("path")
    if doc_len is None and isinstance(raw_path, str) and raw_path:
        entries["data.path"] = str(Path(raw_path).expanduser().resolve())
    return entries, ()
