"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), stored in the LongCrawl64 layout.

A document of `doc_len` tokens opens with `n_pairs` key-value pairs, then asks for `n_queries` of the keys, each
query followed by its value, at positions drawn after the pairs; every other position holds one filler token:

    k_1 v_1 k_2 v_2 ... k_N v_N  f f q_1 v(q_1) f f f q_2 v(q_2) f ...

Keys are distinct within a document and drawn uniformly from `n_keys` ids; values uniformly (with repetition) from
`n_values` ids; a query asks a key of its own document (distinct keys while n_queries <= n_pairs). The value after
a query can only be predicted by recalling its pair, so recall needs state that grows with N: a softmax KV cache
holds every pair, a window only those inside it, a linear or power attention what its state can hold. Query slots
(two positions each) sit after the pairs; the slot of a query is uniform over the free slots (`distance=uniform`)
or drawn with probability proportional to j^(power_a - 1) for the j-th slot after the pairs (`distance=power`,
zoology's power law: most queries near the pairs, a long tail).

Token ids: keys 0..n_keys-1, values n_keys..n_keys+n_values-1, the filler n_keys+n_values, BOS n_keys+n_values+1
(vocab_size = n_keys + n_values + 2).

Layout written by `ensure_mqar` (folder name derived from a hash of the parameters):

    root/params.json
    root/train.zarr                 uint16 [n_train, doc_len]
    root/heldout.zarr               uint16 [n_heldout, doc_len]
    root/heldout_queries.zarr       int32  [n_heldout, 2, n_queries]  per query: the position of its value (the
                                    token to predict, from the prefix before it) and its distance to the pair's
                                    value, in tokens

Accuracy is measured at the query positions only: a prediction is right when the model's most likely next token
after the query key is the key's value (`query_accuracy`); the chance level of a guess among the values is
1 / n_values. Training, too, takes its loss at the query positions only by default (`data.loss_on=queries`, zoology's
labels): the other targets (random keys, values as they are listed, filler) carry no recall signal, and with them
in the loss a 2-layer model at ctx 4096 and N=64 stayed at chance for every attention (`query_targets`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr
from tqdm.auto import tqdm

from ._array import WRITE_EVERY_CHUNK
from ._tmpdir import generate_once

GENERATOR = "mqar"
IGNORE = -100  # a target the loss skips (torch's and FLA's cross-entropy ignore_index)
LOSS_ON = ("queries", "all")
VERSION = 1  # bump when the sampling procedure changes: a new folder is generated, nothing overwritten
DISTANCES = ("uniform", "power")
QUERIES_FILE = "heldout_queries.zarr"


def _check_positive(field: str, value, note: str = "") -> None:
    """ValueError naming `field` unless value is a positive integer (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{field}: must be a positive integer{note}, got {value!r}")


def _queries(n_pairs: int, n_queries: int | None) -> int:
    """data.n_queries, checked; null: one query a pair."""
    n_queries = n_pairs if n_queries is None else n_queries
    _check_positive("data.n_queries", n_queries, " (or null: one query a pair)")
    return n_queries


def generator_params(*, n_keys: int, n_values: int, n_pairs: int, n_queries: int | None, doc_len: int,
                     n_train: int, n_heldout: int, distance: str = "power", power_a: float = 0.01,
                     seed: int = 0) -> dict:
    """Check the parameters (ValueError naming the `data.` field) and return them as the dataset's record."""
    for name, v in (("n_keys", n_keys), ("n_values", n_values), ("n_pairs", n_pairs), ("doc_len", doc_len),
                    ("n_train", n_train), ("n_heldout", n_heldout)):
        _check_positive(f"data.{name}", v)
    n_queries = _queries(n_pairs, n_queries)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"data.gen_seed: must be a non-negative integer, got {seed!r}")
    if n_pairs > n_keys:
        raise ValueError(f"data.n_pairs={n_pairs}: more pairs than keys (data.n_keys={n_keys}); a document's keys "
                         f"are distinct")
    if n_keys + n_values + 2 > 65536:
        raise ValueError(f"data.n_keys + data.n_values = {n_keys + n_values}: the vocabulary (+ filler and BOS) "
                         f"must fit uint16 (at most 65534)")
    need = 2 * n_pairs + 2 * n_queries
    if need > doc_len:
        raise ValueError(f"data.n_pairs={n_pairs}, data.n_queries={n_queries}: {need} tokens of pairs and queries "
                         f"do not fit a document of doc_len={doc_len} (ctx); lower them or raise ctx")
    if distance not in DISTANCES:
        raise ValueError(f"data.distance: must be one of {', '.join(DISTANCES)}, got {distance!r}")
    if not (np.isfinite(float(power_a)) and 0 < float(power_a) <= 1):
        raise ValueError(f"data.power_a: must be in (0, 1], got {power_a!r}")
    return {"name": GENERATOR, "version": VERSION, "n_keys": int(n_keys), "n_values": int(n_values),
            "n_pairs": int(n_pairs), "n_queries": int(n_queries), "doc_len": int(doc_len), "n_train": int(n_train),
            "n_heldout": int(n_heldout), "distance": distance, "power_a": float(power_a), "seed": int(seed)}


def dense_ctx(n_pairs: int, n_queries: int | None = None, ctx: int | None = None) -> int:
    """The shortest power-of-two context that holds a document's pairs and queries (2 N + 2 Q tokens), at most ctx.
    The recall recipe's first stage trains there: nearly every position after the pairs is a query, so a token of
    training carries far more recall signal than at a long context, where most positions are filler
    (`${longctx.mqar_dense_ctx:N,Q,ctx}` in configs)."""
    _check_positive("data.n_pairs", n_pairs)
    n_queries = _queries(n_pairs, n_queries)
    if ctx is not None:
        _check_positive("ctx", ctx)
    dense = 1 << (2 * (int(n_pairs) + int(n_queries)) - 1).bit_length()
    return dense if ctx is None else min(dense, int(ctx))


def token_ids(params: dict) -> dict:
    k, v = params["n_keys"], params["n_values"]
    return {"filler": k + v, "bos": k + v + 1, "vocab_size": k + v + 2}


def _slot_weights(params: dict) -> np.ndarray:
    slots = (params["doc_len"] - 2 * params["n_pairs"]) // 2
    if params["distance"] == "uniform":
        return np.full(slots, 1.0 / slots)
    w = np.arange(1, slots + 1, dtype=np.float64) ** (params["power_a"] - 1.0)
    return w / w.sum()


def sample_documents(rng: np.random.Generator, n: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
    """n documents -> tokens (n, doc_len) int64 and queries (n, 2, n_queries) int64: each query's value position
    and its distance (in tokens) to the same key's value among the pairs."""
    N, Q, L = params["n_pairs"], params["n_queries"], params["doc_len"]
    k, filler = params["n_keys"], token_ids(params)["filler"]
    weights = _slot_weights(params)
    tokens = np.full((n, L), filler, dtype=np.int64)
    queries = np.empty((n, 2, Q), dtype=np.int64)
    for i in range(n):
        keys = rng.choice(k, size=N, replace=False)
        values = k + rng.integers(0, params["n_values"], size=N)
        tokens[i, 0:2 * N:2], tokens[i, 1:2 * N:2] = keys, values
        which = rng.choice(N, size=Q, replace=Q > N)                 # the pair each query asks
        slots = np.sort(rng.choice(len(weights), size=Q, replace=False, p=weights))
        key_pos = 2 * N + 2 * slots                                  # query key, then its value
        tokens[i, key_pos], tokens[i, key_pos + 1] = keys[which], values[which]
        queries[i, 0] = key_pos + 1
        queries[i, 1] = key_pos + 1 - (2 * which + 1)
    return tokens, queries


def query_accuracy(predicted: np.ndarray, tokens: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Per-document recall accuracy: the fraction of its queries whose value the prediction names.

    predicted (n, L): the model's next-token choice at every position (predicted[:, t] is its guess for
    tokens[:, t] from tokens[:, :t]); tokens (n, L); queries (n, 2, Q) as stored. -> (n,) float64.
    """
    pos = np.asarray(queries)[:, 0]
    rows = np.arange(pos.shape[0])[:, None]
    return (np.asarray(predicted)[rows, pos] == np.asarray(tokens)[rows, pos]).mean(axis=1)


def query_positions(targets: np.ndarray, n_keys: int, n_values: int, n_pairs: int) -> np.ndarray:
    """(n, doc_len) bool: the positions of the values asked by queries, found from the tokens alone (the train split
    stores no query record): a value id after the 2 * n_pairs tokens of the pairs. targets: whole documents from
    position 0 (the reader's targets; inputs are them shifted right behind BOS)."""
    targets = np.asarray(targets)
    is_value = (targets >= n_keys) & (targets < n_keys + n_values)
    return is_value & (np.arange(targets.shape[-1]) >= 2 * n_pairs)


def query_targets(batch: dict, n_keys: int, n_values: int, n_pairs: int) -> dict:
    """The batch with every target but the queried values set to IGNORE (data.loss_on=queries): the training loss
    is the NLL of the values after the query keys, as in zoology's MQAR labels."""
    import torch

    keep = torch.from_numpy(query_positions(batch["targets"].numpy(), n_keys, n_values, n_pairs))
    return dict(batch, targets=batch["targets"].masked_fill(~keep, IGNORE))


def dataset_dirname(params: dict) -> str:
    import hashlib

    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    return f"mqar-N{params['n_pairs']}-Q{params['n_queries']}-L{params['doc_len']}-{digest}"


def ensure_mqar(cache_dir, *, progress: bool = True, **kwargs) -> Path:
    """Return the root folder of the MQAR dataset with these parameters (`generator_params`' arguments),
    generating it on first use: deterministic from `seed`, written to a temporary folder and renamed into place,
    generated once by runs started together (the others wait, then read it)."""
    params = generator_params(**kwargs)
    return generate_once(cache_dir, dataset_dirname(params), params,
                         lambda folder, p: _generate(folder, p, progress=progress))


def _generate(out: Path, params: dict, *, progress: bool) -> None:
    L, Q = params["doc_len"], params["n_queries"]
    ids = token_ids(params)
    attrs = {"bos_id": ids["bos"], "vocab_size": ids["vocab_size"], "max_token_id": ids["filler"],
             "rolled": False, "generator": params}
    col_chunk = min(L, 2048)
    doc_chunk = max(1, min(512, (1 << 21) // col_chunk))
    block = max(16, min(512, (1 << 22) // L))  # documents per random stream: a function of doc_len only
    sizes = {"train": params["n_train"], "heldout": params["n_heldout"]}
    bar = tqdm(total=sum(sizes.values()), unit="doc", disable=not progress,
               desc=f"mqar N={params['n_pairs']} L={L}")
    with bar:
        for split_id, (split, n) in enumerate(sizes.items()):
            split_attrs = dict(attrs, **({"queries": QUERIES_FILE} if split == "heldout" else {}))
            tok = zarr.create_array(str(out / f"{split}.zarr"), shape=(n, L), chunks=(doc_chunk, col_chunk),
                                    dtype="uint16", attributes=split_attrs, config=WRITE_EVERY_CHUNK)
            qry = None
            if split == "heldout":
                qry = zarr.create_array(str(out / QUERIES_FILE), shape=(n, 2, Q), chunks=(doc_chunk, 2, Q),
                                        dtype="int32", config=WRITE_EVERY_CHUNK,
                                        attributes={"generator": params, "rows": ["value_position", "distance"],
                                                    "tokens": f"{split}.zarr"})
            for b, lo in enumerate(range(0, n, block)):
                hi = min(n, lo + block)
                tokens, queries = sample_documents(np.random.default_rng([params["seed"], split_id, b]), hi - lo,
                                                   params)
                tok[lo:hi] = tokens.astype(np.uint16)
                if qry is not None:
                    qry[lo:hi] = queries.astype(np.int32)
                bar.update(hi - lo)


def read_queries(root) -> np.ndarray:
    """The heldout split's queries (n_heldout, 2, n_queries) of a dataset `ensure_mqar` wrote."""
    return np.asarray(zarr.open_array(str(Path(root) / QUERIES_FILE), mode="r")[:]).astype(np.int64)
