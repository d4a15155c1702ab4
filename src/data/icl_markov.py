"""The bundled default dataset: in-context Markov chains, stored in the LongCrawl64 layout.

Every document draws its own transition matrix P (each row ~ Dirichlet(alpha * 1_k) over k = `vocab`
states), a first state uniformly, and then a chain of `doc_len` tokens. Nothing is shared across
documents, so a model can only lower its loss by inferring P from the document's own prefix: the data has
genuine long-range (in-context) structure and a known optimum. Because the rows are independent
Dirichlet, the Bayes-optimal next-token predictor is the posterior predictive

    p(x_t = j | x_<t) = (n_ij + alpha) / (n_i + k * alpha),   i = x_{t-1},

with n_ij the number of i->j transitions in x_<t (and n_i = sum_j n_ij); the first token is uniform, so
its optimal loss is ln k. `bayes_nll` returns -ln of that probability for every position.

Mixture of sizes (`state_counts`, the long-context variant). With one k, the optimum saturates once every row
has been seen a few times; a small k lets the in-context circuit form early but flattens early, a large k keeps
the optimum falling but gives no early signal. With `state_counts = (k_1, ..., k_m)` every document first draws
its size k_d uniformly from the list and then lives on the states 0..k_d-1 (vocab = max k). Its Bayes-optimal
predictor mixes the fixed-size predictors with the posterior over the size:

    p(x_t | x_<t) = sum_m w_m(x_<t) p_{k_m}(x_t | x_<t),   w_m ∝ prod_{s<t} p_{k_m}(x_s | x_<s)

(each p_{k_m} is the posterior predictive above with k = k_m, zero for a state >= k_m), computed exactly by
`bayes_nll_mixture`. Small documents teach the circuit early; large ones keep the optimum falling at long
positions.

Disjoint sizes (`disjoint_sizes`, vocab = sum of the sizes). With shared labels, a document's size has to be
inferred from its prefix (the largest state seen, how many first visits came without a larger one), and over
the first ~10 positions the optimum hinges on that inference. With disjoint labels every size lives on its own
range of states (size k_m on offset_m .. offset_m + k_m - 1, offsets the running sum of the sizes), so any one
token names its document's size: after the first token the optimum is the fixed-size posterior predictive, and
what is left to learn is counting transitions in context. The same `bayes_nll_mixture` covers both (a state
fits size m when it lies in m's range).

Layout written by `ensure_icl_markov` (folder name derived from a hash of the parameters):

    root/params.json
    root/train.zarr                 uint16 [n_train, doc_len]      ids 0..vocab-1
    root/heldout.zarr               uint16 [n_heldout, doc_len]
    root/heldout_bayes_nll.zarr     float32 [n_heldout, doc_len]   -ln p_bayes(x_t | x_<t), nats

Token ids are 0..vocab-1 and the BOS id is `vocab`, so the model's vocabulary is vocab + 1. The arrays'
attributes carry `bos_id`, `vocab_size`, `max_token_id`, `rolled` (false), `generator` (all parameters)
and, on heldout, `bayes_nll` (the relative path of its optimum).
"""
from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

import numpy as np
import zarr
from tqdm.auto import tqdm

from ._array import WRITE_EVERY_CHUNK
from ._tmpdir import generate_once

GENERATOR = "icl_markov"
VERSION = 2  # bump when the sampling procedure changes: a new folder is generated, nothing overwritten
# 2: a mixture document's first state is uniform over its k states (1 used the nonzero entries of row 0, which
#    Dirichlet(0.05) rows can underflow to exactly zero)


def _block_docs(doc_len: int) -> int:
    """Documents generated per random stream: a function of doc_len only (so the data never depends on
    chunking), small enough that a block's working set stays ~100-200 MB for long documents."""
    return max(16, min(512, (1 << 23) // doc_len))


def sample_transition_matrices(rng: np.random.Generator, n: int, vocab: int, alpha: float) -> np.ndarray:
    """(n, vocab, vocab) float64 row-stochastic matrices, every row ~ Dirichlet(alpha * ones(vocab))."""
    return rng.dirichlet(np.full(vocab, float(alpha)), size=(n, vocab))


def sample_chains(rng: np.random.Generator, P: np.ndarray, doc_len: int,
                  first: np.ndarray | None = None) -> np.ndarray:
    """Sample one chain per matrix. P (n, k, k) -> tokens (n, doc_len) int64; first state `first` (n,) or
    uniform over the k states.

    Vectorized over documents; the Python loop runs over positions only.
    """
    n, k, _ = P.shape
    cum = np.cumsum(P, axis=-1)
    cum[..., -1] = 1.0  # guard against rounding: u < 1 always lands in a state
    cum = cum.reshape(n * k, k)
    u = rng.random((doc_len, n))
    x = np.empty((doc_len, n), dtype=np.int64)
    x[0] = rng.integers(0, k, size=n) if first is None else first
    row_base = np.arange(n) * k
    for t in range(1, doc_len):
        rows = cum[row_base + x[t - 1]]                          # (n, k) cumulative probs of the current rows
        x[t] = (rows <= u[t, :, None]).sum(axis=1)               # inverse-CDF draw
    return np.ascontiguousarray(x.T)


def bayes_nll(tokens: np.ndarray, vocab: int, alpha: float) -> np.ndarray:
    """Exact Bayes-optimal per-token NLL (nats) of chains drawn from the prior above.

    tokens (n, L) ints in [0, vocab) -> (n, L) float64; position 0 is ln(vocab) (predicted from BOS).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    n, L = tokens.shape
    k = vocab
    out = np.empty((n, L), dtype=np.float64)
    out[:, 0] = np.log(k)
    counts = np.zeros(n * k * k, dtype=np.int64)  # n_ij per document, flattened (doc, i, j)
    totals = np.zeros(n * k, dtype=np.int64)      # n_i per document
    doc = np.arange(n)
    for t in range(1, L):
        i, j = tokens[:, t - 1], tokens[:, t]
        ij = (doc * k + i) * k + j
        di = doc * k + i
        out[:, t] = np.log(totals[di] + k * alpha) - np.log(counts[ij] + alpha)
        counts[ij] += 1
        totals[di] += 1
    return out


def sample_mixture_matrices(rng: np.random.Generator, n: int, state_counts,
                            alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """-> (sizes (n,) int64, P (n, K, K)), K = max(state_counts): document d draws k_d uniformly from
    `state_counts`, its rows 0..k_d-1 ~ Dirichlet(alpha) over states 0..k_d-1; rows >= k_d (never visited) are
    uniform over 0..k_d-1. The sizes are returned, not read back from P: a Dirichlet(0.05) row can hold exact
    zeros."""
    counts = np.asarray(state_counts, dtype=np.int64)
    K = int(counts.max())
    sizes = counts[rng.integers(0, len(counts), size=n)]
    P = np.zeros((n, K, K))
    for k in np.unique(sizes):
        docs = np.flatnonzero(sizes == k)
        P[docs, :k, :k] = rng.dirichlet(np.full(int(k), float(alpha)), size=(len(docs), int(k)))
        P[docs, k:, :k] = 1.0 / k
    return sizes, P


def sample_mixture_chains(rng: np.random.Generator, P: np.ndarray, doc_len: int, sizes: np.ndarray) -> np.ndarray:
    """Chains of `sample_mixture_matrices`' matrices on states 0..k_d-1: first state uniform over them."""
    first = np.floor(rng.random(len(P)) * sizes).astype(np.int64)
    return sample_chains(rng, P, doc_len, first=first)


def size_offsets(state_counts, disjoint: bool) -> np.ndarray:
    """First state id of each size: all 0 (shared labels) or the running sum of the sizes (disjoint ranges)."""
    counts = np.asarray(state_counts, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]) if disjoint else np.zeros_like(counts)


def on_size_ranges(x: np.ndarray, sizes: np.ndarray, state_counts, disjoint: bool) -> np.ndarray:
    """Chains on states 0..k_d-1 (n, L) -> the same chains on their sizes' ranges (`size_offsets`)."""
    counts = sorted(int(k) for k in state_counts)
    return x + size_offsets(counts, disjoint)[np.searchsorted(counts, sizes)][:, None]


def bayes_nll_mixture(tokens: np.ndarray, state_counts, alpha: float, disjoint: bool = False,
                      blind: int = 0) -> np.ndarray:
    """Exact Bayes-optimal per-token NLL (nats) under the mixture of sizes (module docstring).

    tokens (n, L) ints, each document on the states of one size: 0..k-1, or with `disjoint` its size's own
    range (`size_offsets`) -> (n, L) float64.
    blind: 0 (the optimum) or m > 0: the same predictor made blind to the newest m transitions, the NLL of
    predicting x_t from the counts of the transitions that ended at positions <= t - m - 1 only (a model that cannot
    read its last m tokens' transitions; docs/experiments.md measures softmax attention against it).
    """
    if isinstance(blind, bool) or not isinstance(blind, (int, np.integer)) or blind < 0:
        raise ValueError(f"blind: must be a non-negative integer, got {blind!r}")
    tokens = np.asarray(tokens, dtype=np.int64)
    sizes = np.asarray(state_counts, dtype=np.float64)
    lo = size_offsets(state_counts, disjoint).astype(np.float64)
    hi = lo + sizes
    n, L = tokens.shape
    K = int(hi.max())

    def fits(states):  # (n,) -> (n, m): the state lies in size m's range
        return (states[:, None] >= lo[None, :]) & (states[:, None] < hi[None, :])

    out = np.empty((n, L), dtype=np.float64)
    log_w = np.full((n, len(sizes)), -np.log(len(sizes)))          # log prior of each size, then posterior
    log_p = np.where(fits(tokens[:, 0]), -np.log(sizes)[None, :], -np.inf)  # first state uniform over k states
    out[:, 0] = -_logsumexp(log_w + log_p)
    log_w = log_w + log_p
    counts = np.zeros(n * K * K, dtype=np.int64)
    totals = np.zeros(n * K, dtype=np.int64)
    doc = np.arange(n)
    pending = collections.deque()  # transitions not yet counted (only `blind` > 0 holds any back)
    for t in range(1, L):
        i, j = tokens[:, t - 1], tokens[:, t]
        ij = (doc * K + i) * K + j
        di = doc * K + i
        with np.errstate(divide="ignore"):
            log_p = np.where(fits(i) & fits(j), np.log(counts[ij] + alpha)[:, None]
                             - np.log(totals[di][:, None] + sizes[None, :] * alpha), -np.inf)
        out[:, t] = _logsumexp(log_w) - _logsumexp(log_w + log_p)
        log_w = log_w + log_p
        log_w -= log_w.max(axis=1, keepdims=True)  # keep the weights in range; only their ratios matter
        pending.append((ij, di))
        if len(pending) > blind:  # the transition that ended `blind` positions ago becomes visible
            ij, di = pending.popleft()
            counts[ij] += 1
            totals[di] += 1
    return out


def recency_classes(tokens: np.ndarray, max_dist: int = 6) -> np.ndarray:
    """What the prefix tells about each position's row, (n, L) ints -> (n, L) int64 class codes:
    0 at position 0 and wherever the current state x_{t-1} has no earlier transition out of it; otherwise
    c * (max_dist) + min(d, max_dist) with c = 0 for exactly one earlier transition and 1 for two or more, and d >= 1
    how many positions ago the newest of them ended (d = 1: x_{t-2} = x_{t-1}, a self-loop just taken).
    `recency_names(max_dist)` names the codes."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n, L = tokens.shape
    out = np.zeros((n, L), dtype=np.int64)
    K = int(tokens.max()) + 1 if tokens.size else 1
    seen = np.zeros((n, K), dtype=np.int64)      # transitions out of each state so far
    newest = np.zeros((n, K), dtype=np.int64)    # position where the newest of them ended
    doc = np.arange(n)
    for t in range(1, L):
        i = tokens[:, t - 1]
        k, d = seen[doc, i], t - newest[doc, i]
        out[:, t] = np.where(k == 0, 0, (k >= 2) * max_dist + np.minimum(d, max_dist))
        seen[doc, i] += 1
        newest[doc, i] = t
    return out


def recency_names(max_dist: int = 6) -> list[str]:
    """Labels of `recency_classes`' codes, by code."""
    last = lambda d: f"{d}+" if d == max_dist else str(d)  # noqa: E731
    return (["no earlier transition"] + [f"one, ended {last(d)} back" for d in range(1, max_dist + 1)]
            + [f"two or more, newest {last(d)} back" for d in range(1, max_dist + 1)])


def _logsumexp(a: np.ndarray) -> np.ndarray:
    """log(sum(exp(a), axis=1)) with -inf entries allowed (each row has at least one finite entry)."""
    top = a.max(axis=1)
    return top + np.log(np.exp(a - top[:, None]).sum(axis=1))


def generator_params(*, vocab: int, alpha: float, doc_len: int, n_train: int, n_heldout: int,
                     seed: int, state_counts=None, disjoint_sizes: bool = False) -> dict:
    if not isinstance(disjoint_sizes, (bool, np.bool_)):
        raise ValueError(f"data.disjoint_sizes: must be true or false, got {disjoint_sizes!r}")
    if disjoint_sizes and state_counts is None:
        raise ValueError("data.disjoint_sizes: true needs data.state_counts (a mixture of sizes)")
    if state_counts is not None:
        counts = list(state_counts)
        if not counts or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 2
                                 for k in counts):
            raise ValueError(f"data.state_counts: must be a non-empty list of integers >= 2, got {state_counts!r}")
        if disjoint_sizes and sum(counts) != vocab:
            raise ValueError(f"data.vocab: with data.disjoint_sizes every size has its own states, so vocab must "
                             f"be the sum of data.state_counts={state_counts!r} ({sum(counts)}), got {vocab!r}")
        if not disjoint_sizes and max(counts) != vocab:
            raise ValueError(f"data.state_counts: its largest size must equal data.vocab={vocab!r} (the "
                             f"model's vocabulary covers every document), got {state_counts!r}")
    if not (isinstance(vocab, (int, np.integer)) and 2 <= vocab <= 65535):
        raise ValueError(f"data.vocab: must be an integer in [2, 65535], got {vocab!r}")
    if not (float(alpha) > 0 and np.isfinite(float(alpha))):
        raise ValueError(f"data.alpha: must be a positive number, got {alpha!r}")
    for name, v in (("doc_len", doc_len), ("n_train", n_train), ("n_heldout", n_heldout)):
        if not (isinstance(v, (int, np.integer)) and v >= 1):
            raise ValueError(f"data.{name}: must be a positive integer, got {v!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"data.gen_seed: must be a non-negative integer, got {seed!r}")
    params = {"name": GENERATOR, "version": VERSION, "vocab": int(vocab), "alpha": float(alpha),
              "doc_len": int(doc_len), "n_train": int(n_train), "n_heldout": int(n_heldout), "seed": int(seed)}
    if state_counts is not None:  # absent for one size, so the single-size datasets keep their folders
        params["state_counts"] = sorted(int(k) for k in state_counts)
    if disjoint_sizes:  # absent when false, so the shared-label mixtures keep their folders
        params["disjoint_sizes"] = True
    return params


def dataset_dirname(params: dict) -> str:
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    sizes = ("dmix" if params.get("disjoint_sizes") else "mix") if "state_counts" in params else ""
    return f"icl_markov-k{sizes}{params['vocab']}-a{params['alpha']:g}-L{params['doc_len']}-{digest}"


def ensure_icl_markov(cache_dir, *, vocab: int = 4, alpha: float = 1.0, doc_len: int = 1024,
                      n_train: int = 16384, n_heldout: int = 512, seed: int = 0, state_counts=None,
                      disjoint_sizes: bool = False, progress: bool = True) -> Path:
    """Return the root folder of the in-context Markov dataset, generating it on first use.

    Args:
        cache_dir: folder that holds generated datasets (created if missing).
        vocab: number of Markov states k; token ids 0..k-1, BOS id k, model vocab_size k + 1. Default 4.
        alpha: Dirichlet concentration of every transition row. Default 1.0 (uniform over the simplex).
        doc_len: tokens per document. Default 1024.
        n_train, n_heldout: documents in each split. Defaults 16384 and 512.
        seed: base random seed. Default 0.
        state_counts: None (every document has `vocab` states) or a list of sizes, the largest equal to
            `vocab`: each document draws its size uniformly from it (the long-context mixture, module docstring).
        disjoint_sizes: give every size its own range of states (vocab = the sum of the sizes), so that any
            token names its document's size. Default False (every size on states 0..k-1).
        progress: show a tqdm bar while generating.
    Returns:
        `root` with `root/train.zarr`, `root/heldout.zarr`, `root/heldout_bayes_nll.zarr`, `root/params.json`.
        The folder name is derived from a hash of all parameters: a changed parameter generates a new
        folder and never overwrites an existing one. Generation writes to a temporary folder in
        `cache_dir` and renames it into place, so an interrupted run leaves no partial dataset.

    Example:
        >>> root = ensure_icl_markov("~/.cache/longctx", vocab=4, alpha=1.0, doc_len=256, n_train=1024,
        ...                          n_heldout=64)
        >>> LongCrawl64(root / "train.zarr", context_length=256, docs_per_batch=32)
    """
    params = generator_params(vocab=vocab, alpha=alpha, doc_len=doc_len, n_train=n_train,
                              n_heldout=n_heldout, seed=seed, state_counts=state_counts,
                              disjoint_sizes=disjoint_sizes)
    return generate_once(cache_dir, dataset_dirname(params), params,
                         lambda folder, p: _generate(folder, p, progress=progress))


def _generate(out: Path, params: dict, *, progress: bool) -> None:
    k, alpha, L = params["vocab"], params["alpha"], params["doc_len"]
    mixture = params.get("state_counts")
    disjoint = bool(params.get("disjoint_sizes"))
    sizes = {"train": params["n_train"], "heldout": params["n_heldout"]}
    col_chunk = min(L, 2048)
    # the mixture's matrices are (block, k, k) float64: bound them to ~256 MB
    K = k if mixture is None else max(mixture)
    block = _block_docs(L) if mixture is None else max(16, min(_block_docs(L), (1 << 25) // (K * K)))
    doc_chunk = max(1, min(512, (1 << 21) // col_chunk))  # ~4 MB uncompressed chunks
    attrs = {"bos_id": k, "vocab_size": k + 1, "max_token_id": k - 1, "rolled": False, "generator": params}
    bar = tqdm(total=sum(sizes.values()) * L, unit="tok", unit_scale=True, disable=not progress,
               desc=f"icl_markov k={k} alpha={alpha:g} L={L}")
    with bar:
        for split_id, (split, n) in enumerate(sizes.items()):
            split_attrs = dict(attrs)
            if split == "heldout":
                split_attrs["bayes_nll"] = "heldout_bayes_nll.zarr"
            tok = zarr.create_array(str(out / f"{split}.zarr"), shape=(n, L), chunks=(doc_chunk, col_chunk),
                                    dtype="uint16", attributes=split_attrs, config=WRITE_EVERY_CHUNK)
            nll = None
            if split == "heldout":
                nll = zarr.create_array(str(out / "heldout_bayes_nll.zarr"), shape=(n, L),
                                        chunks=(doc_chunk, col_chunk), dtype="float32", config=WRITE_EVERY_CHUNK,
                                        attributes={"generator": params, "units": "nats",
                                                    "tokens": f"{split}.zarr"})
            for b, lo in enumerate(range(0, n, block)):
                hi = min(n, lo + block)
                rng = np.random.default_rng([params["seed"], split_id, b])
                if mixture is None:
                    x = sample_chains(rng, sample_transition_matrices(rng, hi - lo, k, alpha), L)
                else:
                    doc_sizes, P = sample_mixture_matrices(rng, hi - lo, mixture, alpha)
                    x = on_size_ranges(sample_mixture_chains(rng, P, L, doc_sizes), doc_sizes, mixture, disjoint)
                tok[lo:hi] = x.astype(np.uint16)
                if nll is not None:
                    best = bayes_nll(x, k, alpha) if mixture is None else bayes_nll_mixture(x, mixture, alpha, disjoint)
                    nll[lo:hi] = best.astype(np.float32)
                bar.update((hi - lo) * L)
