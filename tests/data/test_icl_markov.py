"""The in-context Markov dataset: chain statistics and the exact Bayes-optimal loss."""
import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from longctx.data import LongCrawl64, check_vocab, dataset_info, ensure_icl_markov, heldout_batch
from longctx.data.icl_markov import (bayes_nll, bayes_nll_mixture, recency_classes, recency_names, sample_chains,
                                     sample_mixture_chains, sample_mixture_matrices, sample_transition_matrices,
                                     on_size_ranges, size_offsets)


def mc_posterior_nll(tokens, vocab, alpha, t, rng, samples=200_000):
    """-ln p(x_t | x_<t) by Monte Carlo: draw the transition row of state x_{t-1} from its posterior
    Dirichlet(alpha + counts of transitions out of x_{t-1} in x_<t) and average its entry for x_t."""
    if t == 0:
        return np.log(vocab)  # the first state is uniform, whatever the matrix
    prev = tokens[:t]
    i, j = tokens[t - 1], tokens[t]
    counts = np.bincount(prev[1:][prev[:-1] == i], minlength=vocab)
    rows = rng.dirichlet(alpha + counts, size=samples)
    return -np.log(rows[:, j].mean())


@pytest.mark.parametrize("vocab,alpha", [(4, 1.0), (3, 0.3), (8, 2.0)])
def test_bayes_nll_matches_monte_carlo_posterior(vocab, alpha):
    rng = np.random.default_rng(0)
    P = sample_transition_matrices(rng, 3, vocab, alpha)
    x = sample_chains(rng, P, 300)
    exact = bayes_nll(x, vocab, alpha)
    for d in range(3):
        for t in [0, 1, 2, 3, 7, 40, 299]:
            mc = mc_posterior_nll(x[d], vocab, alpha, t, rng)
            # MC error of a mean of 2e5 Dirichlet entries: well under 1% relative in probability
            assert abs(mc - exact[d, t]) < 0.01, (d, t, mc, exact[d, t])


def test_bayes_nll_matches_prior_importance_sampling():
    """A second, conjugacy-free check on short prefixes: sample P from the prior, weight by the prefix's
    likelihood, and average P[x_{t-1}, x_t]."""
    rng = np.random.default_rng(1)
    vocab, alpha = 3, 0.7
    x = sample_chains(rng, sample_transition_matrices(rng, 1, vocab, alpha), 6)[0]
    exact = bayes_nll(x[None], vocab, alpha)[0]
    Ps = sample_transition_matrices(rng, 400_000, vocab, alpha)
    for t in range(1, 6):
        w = np.prod(Ps[:, x[:t - 1], x[1:t]], axis=1) if t > 1 else np.ones(len(Ps))
        pred = (w * Ps[:, x[t - 1], x[t]]).sum() / w.sum()
        assert abs(-np.log(pred) - exact[t]) < 0.02, (t, -np.log(pred), exact[t])


def test_chain_statistics():
    rng = np.random.default_rng(2)
    n, vocab, L = 400, 4, 2000
    P = sample_transition_matrices(rng, n, vocab, 1.0)
    np.testing.assert_allclose(P.sum(-1), 1.0)
    x = sample_chains(rng, P, L)
    assert x.min() >= 0 and x.max() < vocab
    # first state uniform
    first = np.bincount(x[:, 0], minlength=vocab) / n
    assert np.abs(first - 1 / vocab).max() < 0.08
    # empirical transition frequencies follow each document's own matrix
    counts = np.zeros((n, vocab, vocab))
    np.add.at(counts, (np.arange(n)[:, None], x[:, :-1], x[:, 1:]), 1)
    visits = counts.sum(-1, keepdims=True)
    emp = counts / np.maximum(visits, 1)
    err = np.abs(emp - P)[visits[..., 0] > 200]
    assert np.median(err) < 0.02 and err.max() < 0.15
    # the mean Bayes loss late in the document approaches the mean entropy rate of the true chains
    stationary = counts.sum(-1) / counts.sum((-1, -2))[:, None]
    H = -(stationary[:, :, None] * P * np.log(np.clip(P, 1e-300, None))).sum((-1, -2))
    late = bayes_nll(x, vocab, 1.0)[:, -500:].mean()
    assert H.mean() < late < H.mean() + 0.02
    # and Dirichlet(1) rows have the right mean entry
    assert abs(P.mean() - 1 / vocab) < 0.01


def test_ensure_creates_once_keyed_by_params(tmp_path):
    kw = dict(vocab=4, alpha=1.0, doc_len=64, n_train=600, n_heldout=40, seed=3)
    root = ensure_icl_markov(tmp_path, progress=False, **kw)
    assert json.loads((root / "params.json").read_text())["n_train"] == 600
    mtime = (root / "params.json").stat().st_mtime_ns
    assert ensure_icl_markov(tmp_path, progress=False, **kw) == root          # reused, not regenerated
    assert (root / "params.json").stat().st_mtime_ns == mtime
    other = ensure_icl_markov(tmp_path, progress=False, **{**kw, "alpha": 0.5})  # a changed param: new folder
    assert other != root and (root / "params.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []  # no temp left behind

    train = zarr.open_array(str(root / "train.zarr"), mode="r")
    held = zarr.open_array(str(root / "heldout.zarr"), mode="r")
    assert train.shape == (600, 64) and held.shape == (40, 64) and train.dtype == np.uint16
    assert train[:].max() < 4 and dict(train.attrs)["bos_id"] == 4
    info = dataset_info(root / "heldout.zarr")
    assert (info["vocab_size"], info["bos_id"], info["rolled"]) == (5, 4, False)
    assert info["generator"]["alpha"] == 1.0 and info["bayes_nll"].endswith("heldout_bayes_nll.zarr")
    assert check_vocab(root / "train.zarr", 5) == 3
    # stored optimum == recomputed from the stored tokens
    h = heldout_batch(root / "heldout.zarr", 48, 40)
    np.testing.assert_allclose(h["bayes_nll"].numpy(), bayes_nll(held[:, :48], 4, 1.0), rtol=1e-6)
    assert (h["inputs"][:, 0] == 4).all()
    # deterministic: same parameters elsewhere -> same bytes
    again = ensure_icl_markov(tmp_path / "elsewhere", progress=False, **kw)
    np.testing.assert_array_equal(zarr.open_array(str(again / "train.zarr"))[:], train[:])
    # the default reader serves it
    batch = next(iter(LongCrawl64(root / "train.zarr", 32, 8)))
    assert batch["inputs"].shape == (8, 32) and (batch["inputs"][:, 0] == 4).all()


def test_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    import longctx.data.icl_markov as icl

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(icl, "bayes_nll", boom)
    with pytest.raises(KeyboardInterrupt):
        ensure_icl_markov(tmp_path, vocab=4, alpha=1.0, doc_len=16, n_train=8, n_heldout=4, seed=0,
                          progress=False)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []  # only the writers' lock


def test_runs_started_together_generate_a_task_once(tmp_path, monkeypatch):
    import threading
    import time

    import longctx.data.icl_markov as icl
    calls, real = [], icl._generate

    def slow_generate(*a, **k):
        calls.append(1)
        time.sleep(0.3)  # both threads are inside ensure_icl_markov while the first writes
        return real(*a, **k)

    monkeypatch.setattr(icl, "_generate", slow_generate)
    kw = dict(vocab=4, alpha=1.0, doc_len=16, n_train=8, n_heldout=4, seed=0, progress=False)
    roots = []
    threads = [threading.Thread(target=lambda: roots.append(ensure_icl_markov(tmp_path, **kw))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(roots)) == 1 and (roots[0] / "params.json").exists()


def test_generation_is_fast(tmp_path):
    import time
    t0 = time.perf_counter()
    ensure_icl_markov(tmp_path, vocab=4, alpha=1.0, doc_len=1024, n_train=4096, n_heldout=256, seed=0,
                      progress=False)
    assert time.perf_counter() - t0 < 10  # ~0.3 s on 2 cores: 20k x 1024 tokens in about 1.5 s


@pytest.mark.parametrize("bad,match", [({"vocab": 1}, "data.vocab"), ({"alpha": 0.0}, "data.alpha"),
                                       ({"doc_len": 0}, "data.doc_len"), ({"seed": -1}, "data.gen_seed")])
def test_bad_params(tmp_path, bad, match):
    kw = dict(vocab=4, alpha=1.0, doc_len=16, n_train=8, n_heldout=4, seed=0)
    with pytest.raises(ValueError, match=match):
        ensure_icl_markov(tmp_path, progress=False, **{**kw, **bad})


# ----- the mixture of sizes (data=icl_markov_long) ----------------------------------------------------------

def test_mixture_with_one_size_is_the_single_size_optimum():
    rng = np.random.default_rng(3)
    x = sample_chains(rng, sample_transition_matrices(rng, 4, 6, 0.3), 200)
    np.testing.assert_allclose(bayes_nll_mixture(x, [6], 0.3), bayes_nll(x, 6, 0.3), rtol=1e-12, atol=1e-12)


def test_mixture_optimum_matches_prior_importance_sampling():
    """Independent of the closed form: draw (size, matrix) from the prior, weight by the prefix's likelihood
    (first state uniform over the document's states), and average the probability of the next state."""
    rng = np.random.default_rng(4)
    sizes, alpha = [2, 3, 5], 0.4
    k1, P = sample_mixture_matrices(rng, 1, sizes, alpha)
    x = sample_mixture_chains(rng, P, 7, k1)[0]
    exact = bayes_nll_mixture(x[None], sizes, alpha)[0]
    n = 300_000
    k, Ps = sample_mixture_matrices(rng, n, sizes, alpha)
    w = np.where(x[0] < k, 1.0 / k, 0.0)
    assert abs(-np.log(w.mean()) - exact[0]) < 0.01
    for t in range(1, 7):
        pred = (w * Ps[:, x[t - 1], x[t]]).sum() / w.sum()
        assert abs(-np.log(pred) - exact[t]) < 0.03, (t, -np.log(pred), exact[t])
        w = w * Ps[:, x[t - 1], x[t]]


def test_mixture_documents_stay_on_their_own_states():
    rng = np.random.default_rng(5)
    k, P = sample_mixture_matrices(rng, 300, [4, 16], 0.1)
    np.testing.assert_allclose(P.sum(-1), 1.0)
    x = sample_mixture_chains(rng, P, 400, k)
    assert set(np.unique(k)) == {4, 16}
    assert ((P[:, :, :4] > 0).sum(-1) <= k[:, None]).all() and (P[k == 4][:, :, 4:] == 0).all()
    assert (x.max(axis=1) < k).all()
    assert 0.35 < (k == 4).mean() < 0.65  # sizes drawn uniformly


@pytest.mark.parametrize("config", ["icl_markov_long", "icl_markov_long_disjoint"])
def test_long_task_optimum_still_falls_at_its_context(config):
    """The calibration target of the long-context task configs, from the exact optimum: the last bin of the
    Bayes curve at least 0.1 nats below the bin holding ctx/8 (so attention that reaches far keeps gaining)."""
    from omegaconf import OmegaConf

    from longctx.train.metrics import bin_curve, exponential_bins
    conf = Path(__file__).resolve().parents[2] / "conf" / "data"
    cfg = OmegaConf.merge(OmegaConf.load(conf / "icl_markov_long.yaml"), OmegaConf.load(conf / f"{config}.yaml"))
    counts, disjoint = sorted(cfg.state_counts), bool(cfg.get("disjoint_sizes", False))
    assert (sum(counts) if disjoint else max(counts)) == cfg.vocab
    rng = np.random.default_rng(6)
    ctx = cfg.doc_len
    sizes, P = sample_mixture_matrices(rng, 48, counts, cfg.alpha)
    x = on_size_ranges(sample_mixture_chains(rng, P, ctx, sizes), sizes, counts, disjoint)
    curve = bayes_nll_mixture(x, counts, cfg.alpha, disjoint).mean(0)
    bins = exponential_bins(ctx, 16)
    binned = bin_curve(curve, bins)
    at_eighth = next(i for i, (a, b) in enumerate(bins) if a <= ctx // 8 < b)
    assert binned[at_eighth] - binned[-1] >= 0.1, binned


def test_first_state_is_uniform_over_the_documents_own_states():
    """Dirichlet(0.01) rows hold exact zeros; the first state must still be uniform over all k states."""
    rng = np.random.default_rng(7)
    sizes, P = sample_mixture_matrices(rng, 16000, [8], 0.01)
    assert ((P[:, 0] > 0).sum(-1) < 8).mean() > 0.5  # the case that matters does occur
    first = sample_mixture_chains(rng, P, 1, sizes)[:, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=8) / len(first), 1 / 8, atol=0.015)


def test_disjoint_sizes_optimum_is_the_known_size_optimum():
    """With disjoint ranges the first token names the size: the mixture optimum must equal the fixed-size
    closed form on the document's own states, plus ln(number of sizes) at position 0."""
    rng = np.random.default_rng(8)
    counts, alpha = [3, 5, 8], 0.2
    sizes, P = sample_mixture_matrices(rng, 60, counts, alpha)
    local = sample_mixture_chains(rng, P, 50, sizes)
    np.testing.assert_array_equal(size_offsets(counts, True), [0, 3, 8])
    x = on_size_ranges(local, sizes, counts, True)
    assert ((x - local) == np.array([0, 3, 8])[np.searchsorted(counts, sizes)][:, None]).all()
    got = bayes_nll_mixture(x, counts, alpha, disjoint=True)
    for d in range(len(x)):
        want = bayes_nll(local[d:d + 1], int(sizes[d]), alpha)[0]
        want[0] += np.log(len(counts))
        np.testing.assert_allclose(got[d], want, rtol=1e-12, atol=1e-12)


def test_mixture_dataset_roundtrip(tmp_path):
    root = ensure_icl_markov(tmp_path, vocab=8, alpha=0.1, doc_len=64, n_train=40, n_heldout=20, seed=0,
                             state_counts=[4, 8], progress=False)
    params = json.loads((root / "params.json").read_text())
    assert params["state_counts"] == [4, 8]
    heldout = zarr.open_array(str(root / "heldout.zarr"), mode="r")[:]
    nll = zarr.open_array(str(root / "heldout_bayes_nll.zarr"), mode="r")[:]
    np.testing.assert_allclose(nll, bayes_nll_mixture(heldout.astype(np.int64), [4, 8], 0.1), rtol=1e-5)
    # the single-size folder is not reused for the mixture
    single = ensure_icl_markov(tmp_path, vocab=8, alpha=0.1, doc_len=64, n_train=40, n_heldout=20, seed=0,
                               progress=False)
    assert single != root
    with pytest.raises(ValueError, match="data.state_counts"):
        ensure_icl_markov(tmp_path, vocab=8, alpha=0.1, doc_len=64, state_counts=[4, 16], progress=False)


def test_disjoint_sizes_dataset(tmp_path):
    root = ensure_icl_markov(tmp_path, vocab=12, alpha=0.1, doc_len=64, n_train=40, n_heldout=30, seed=0,
                             state_counts=[4, 8], disjoint_sizes=True, progress=False)
    assert json.loads((root / "params.json").read_text())["disjoint_sizes"] is True
    heldout = zarr.open_array(str(root / "heldout.zarr"), mode="r")[:].astype(np.int64)
    nll = zarr.open_array(str(root / "heldout_bayes_nll.zarr"), mode="r")[:]
    small = heldout.max(axis=1) < 4
    assert small.any() and (~small).any()
    assert (heldout[~small].min(axis=1) >= 4).all() and heldout.max() < 12  # each document on one range
    np.testing.assert_allclose(nll, bayes_nll_mixture(heldout, [4, 8], 0.1, disjoint=True), rtol=1e-5)
    assert dataset_info(root / "train.zarr")["vocab_size"] == 13
    with pytest.raises(ValueError, match="data.vocab"):
        ensure_icl_markov(tmp_path, vocab=8, alpha=0.1, doc_len=64, state_counts=[4, 8], disjoint_sizes=True,
                          progress=False)
    with pytest.raises(ValueError, match="data.disjoint_sizes"):
        ensure_icl_markov(tmp_path, vocab=8, alpha=0.1, doc_len=64, disjoint_sizes=True, progress=False)
    with pytest.raises(ValueError, match="data.disjoint_sizes: must be true or false, got 'yes'"):
        ensure_icl_markov(tmp_path, vocab=12, alpha=0.1, doc_len=64, state_counts=[4, 8], disjoint_sizes="yes",
                          progress=False)


def test_trainer_runs_the_disjoint_task_against_its_closed_form_optimum(compose, tiny, tmp_path):
    """data=icl_markov_long_disjoint through the trainer: the data's 121 ids fit the model, and the logged optimum
    of position 0 is the closed form ln(number of sizes) + ln(k of the document's range), averaged over the
    evaluation documents."""
    from longctx.train.trainer import Trainer
    cfg = compose(*tiny, "data=icl_markov_long_disjoint", "data.doc_len=64", "trainer.max_steps=2",
                  "trainer.eval_every=2", f"run_dir={tmp_path / 'run'}")
    trainer = Trainer(cfg)
    assert trainer.splits.info["vocab_size"] == 121 and trainer.spec.vocab_size >= 121
    rec = trainer.fit()
    first = trainer.heldout["targets"][:, 0].numpy()
    k = np.array([8, 16, 32, 64])[np.searchsorted([8, 24, 56, 120], first, side="right")]
    assert rec["bayes_curve"][0][:2] == [0, 1]
    assert rec["bayes_curve"][0][2] == pytest.approx(np.mean(np.log(4) + np.log(k)), rel=1e-5)


# ----- what the prefix tells, and the optimum blind to the newest transitions -------------------------------

def test_blind_optimum_ends_at_the_no_transition_predictor_and_starts_at_the_optimum():
    rng = np.random.default_rng(11)
    x = sample_chains(rng, sample_transition_matrices(rng, 5, 6, 0.2), 40)
    np.testing.assert_array_equal(bayes_nll_mixture(x, [6], 0.2, blind=0), bayes_nll_mixture(x, [6], 0.2))
    # blind to every transition: each state is uniform over the k = 6 states, ln 6 everywhere (closed form)
    np.testing.assert_allclose(bayes_nll_mixture(x, [6], 0.2, blind=40), np.log(6), rtol=1e-12)


def test_blind_optimum_equals_the_single_size_optimum_with_its_counts_held_back():
    """Independent of the mixture code: the single-size posterior predictive (n_ij + alpha) / (n_i + k alpha) from
    the transitions that ended at positions <= t - m - 1, counted by hand."""
    rng = np.random.default_rng(12)
    k, alpha, m = 4, 0.3, 3
    x = sample_chains(rng, sample_transition_matrices(rng, 3, k, alpha), 30)
    got = bayes_nll_mixture(x, [k], alpha, blind=m)
    for d in range(3):
        for t in range(1, 30):
            seen = [(x[d, r - 1], x[d, r]) for r in range(1, t - m)]
            i, j = x[d, t - 1], x[d, t]
            n_ij = sum(a == i and b == j for a, b in seen)
            n_i = sum(a == i for a, _ in seen)
            assert abs(got[d, t] + np.log((n_ij + alpha) / (n_i + k * alpha))) < 1e-12, (d, t)


def test_a_blind_predictor_loses_most_where_the_newest_transitions_are_all_it_has():
    rng = np.random.default_rng(13)
    sizes, P = sample_mixture_matrices(rng, 256, [8, 16, 32, 64], 0.05)
    x = sample_mixture_chains(rng, P, 64, sizes)
    loss = bayes_nll_mixture(x, [8, 16, 32, 64], 0.05, blind=3) - bayes_nll_mixture(x, [8, 16, 32, 64], 0.05)
    assert loss.mean() > 0  # blindness costs on average (not at every token: a held-back count can mislead)
    cls = recency_classes(x)
    one_recent = np.isin(cls, [1, 2, 3])     # the only transition out of the current state ended 1-3 back
    one_older = np.isin(cls, [4, 5, 6])
    assert loss[one_recent].mean() > 0.3 and abs(loss[one_older].mean()) < 0.05
    with pytest.raises(ValueError, match=r"blind: must be a non-negative integer, got -1"):
        bayes_nll_mixture(x, [8, 16, 32, 64], 0.05, blind=-1)


def test_recency_classes_on_a_hand_written_chain():
    #        t: 0  1  2  3  4  5  6  7  8  9
    x = np.array([[0, 0, 1, 0, 2, 1, 0, 3, 3, 0]])
    # t=1: state 0, none before -> 0;  t=2: state 0, one (0->0 ended at 1), 1 back -> 1
    # t=3: state 1, none -> 0;  t=4: state 0, two (ended 1, 2), newest 2 back -> 6 + 2
    # t=5: state 2, none -> 0;  t=6: state 1, one (1->0 ended 3), 3 back -> 3
    # t=7: state 0, three, newest ended 4 -> 6 + 3;  t=8: state 3, none -> 0;  t=9: state 3, one, 1 back -> 1
    np.testing.assert_array_equal(recency_classes(x, max_dist=6), [[0, 0, 1, 0, 8, 0, 3, 9, 0, 1]])
    np.testing.assert_array_equal(recency_classes(x, max_dist=2), [[0, 0, 1, 0, 4, 0, 2, 4, 0, 1]])
    names = recency_names(2)
    assert names[0] == "no earlier transition" and names[2] == "one, ended 2+ back" and len(names) == 5
