"""Bootstrap intervals of the ICL metrics against closed forms: the interval of a mean has the normal width
2 * 1.96 * sigma / sqrt(n) and covers the true mean ~95% of the time; a paired difference of correlated runs is
narrower than the unpaired one by sqrt(1 - rho); the statistics equal longctx.train.metrics' on the mean curve."""
from __future__ import annotations

import numpy as np
import pytest

from longctx.report.stats import (
    DocBins, bootstrap, last_fraction_weights, load_doc_bins, paired_difference, paired_seed_difference,
    resample_weights, seed_aggregate, seed_pairs_agreeing, unpaired_difference)
from longctx.train.metrics import best_bin, exponential_bins, icl_summary


def docbins(loss, bayes=None, edges=None, doc_index=None) -> DocBins:
    loss = np.atleast_2d(np.asarray(loss, np.float64).T).T  # (n_docs,) -> (n_docs, 1)
    n_docs, n_bins = loss.shape
    edges = np.array([[i, i + 1] for i in range(n_bins)]) if edges is None else np.asarray(edges)
    doc_index = np.arange(n_docs) if doc_index is None else np.asarray(doc_index)
    return DocBins(loss=loss, edges=edges, doc_index=doc_index, bayes=bayes)


def test_resample_weights_are_counts_of_draws_with_replacement():
    w = resample_weights(50, 400, seed=3)
    assert w.shape == (401, 50)
    np.testing.assert_allclose(w[0], 1 / 50)                          # row 0: every document once
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    counts = w[1:] * 50
    np.testing.assert_allclose(counts, np.round(counts))
    # multinomial(n, 1/n): each count has mean 1 and variance 1 - 1/n
    assert counts.mean() == pytest.approx(1.0, abs=0.01)
    assert counts.var() == pytest.approx(1 - 1 / 50, rel=0.05)
    np.testing.assert_array_equal(w, resample_weights(50, 400, seed=3))  # a fixed seed: the same resamples


def test_interval_of_a_mean_has_the_normal_width():
    rng = np.random.default_rng(0)
    n, sigma = 256, 0.5
    loss = rng.normal(2.0, sigma, size=n)
    iv = bootstrap(docbins(loss), "curve", n_boot=4000)
    assert iv.estimate == pytest.approx(loss.mean())
    sample_sigma = loss.std()  # the bootstrap's own sigma: the plug-in one
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * sample_sigma / np.sqrt(n), rel=0.06)
    assert iv.low < loss.mean() < iv.high


def test_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    n, mu, draws = 200, 1.3, 400
    covered = 0
    for i in range(draws):
        loss = rng.normal(mu, 0.3, size=n)
        iv = bootstrap(docbins(loss), "curve", n_boot=500, seed=i)
        covered += iv.low <= mu <= iv.high
    # binomial(400, 0.95) has sd 1.1%: 0.91..0.98 holds the percentile bootstrap's (slightly low) coverage
    assert 0.91 <= covered / draws <= 0.98


@pytest.mark.parametrize("rho", [0.5, 0.75, 0.9])
def test_paired_interval_is_narrower_by_sqrt_one_minus_rho(rho):
    """var(a - b) = 2 sigma^2 (1 - rho) paired, 2 sigma^2 unpaired: the widths' ratio is sqrt(1 - rho)."""
    rng = np.random.default_rng(2)
    n, sigma = 2000, 0.4
    cov = sigma ** 2 * np.array([[1, rho], [rho, 1]])
    ab = rng.multivariate_normal([1.50, 1.45], cov, size=n)
    a, b = docbins(ab[:, 0]), docbins(ab[:, 1])
    paired = paired_difference(a, b, "curve", n_boot=3000)
    unpaired = unpaired_difference(a, b, "curve", n_boot=3000)
    assert paired.estimate == pytest.approx(ab[:, 0].mean() - ab[:, 1].mean())
    assert unpaired.estimate == pytest.approx(paired.estimate)
    ratio = (paired.high - paired.low) / (unpaired.high - unpaired.low)
    sample_rho = np.corrcoef(ab.T)[0, 1]
    assert ratio == pytest.approx(np.sqrt(1 - sample_rho), rel=0.08)
    assert paired.high - paired.low == pytest.approx(
        2 * 1.96 * np.std(ab[:, 0] - ab[:, 1]) / np.sqrt(n), rel=0.06)


def test_paired_difference_refuses_other_documents_naming_the_runs():
    a = docbins(np.ones(8), doc_index=np.arange(8))
    b = docbins(np.ones(8), doc_index=np.arange(1, 9))
    with pytest.raises(ValueError, match="runA and runB: evaluated on different heldout documents"):
        paired_difference(a, b, "curve", "runA", "runB")
    c = docbins(np.ones((8, 2)), edges=[[0, 1], [1, 3]])
    with pytest.raises(ValueError, match="runA and runC: different ICL bins"):
        paired_difference(docbins(np.ones((8, 2))), c, "curve", "runA", "runC")


def synthetic_eval(rng, n_docs=64, ctx=512, num_bins=12, offset=0.1):
    """Per-position losses of n_docs documents -> the per-document record and the per-position mean curves."""
    pos = np.arange(ctx)
    bayes_pp = 1.0 + 2.0 / np.sqrt(pos + 1.0) + rng.normal(0, 0.05, size=(n_docs, ctx))
    loss_pp = bayes_pp + offset + rng.normal(0, 0.3, size=(n_docs, ctx)) + 0.3 * np.exp(-pos / 50)
    edges = np.array(exponential_bins(ctx, num_bins))
    binned = lambda x: np.stack([x[:, a:b].mean(axis=1) for a, b in edges], axis=1)  # noqa: E731
    return DocBins(loss=binned(loss_pp), edges=edges, doc_index=np.arange(n_docs), bayes=binned(bayes_pp)), \
        loss_pp.mean(axis=0), bayes_pp.mean(axis=0)


def test_statistics_on_all_documents_equal_the_trainers_summary():
    """The estimate (row 0, every document once) of each statistic is what icl_summary logs from the mean
    per-position curve. The last-10% mean comes from bins: exact when the last 10% is whole bins (checked against
    icl_summary's), otherwise each overlapping bin weighted by its share of those positions."""
    rec, loss_pp, bayes_pp = synthetic_eval(np.random.default_rng(4))
    summary = icl_summary(loss_pp, 12, bayes_pp)
    np.testing.assert_allclose(bootstrap(rec, "curve", 10).estimate, [v for *_, v in summary["icl_curve"]])
    assert bootstrap(rec, "best_context_loss", 10).estimate == pytest.approx(summary["best_context_loss"])
    assert bootstrap(rec, "best_context_gap", 10).estimate == pytest.approx(summary["best_context_gap"])
    assert bootstrap(rec, "last_bin_gap", 10).estimate == pytest.approx(summary["last_bin_gap"])
    # bins [0, 460), [460, 512): the last 10% (52 positions) is the last bin exactly
    edges = np.array([[0, 460], [460, 512]])
    two = DocBins(loss=np.stack([np.full(3, loss_pp[:460].mean()), np.full(3, loss_pp[460:].mean())], 1),
                  edges=edges, doc_index=np.arange(3))
    assert bootstrap(two, "last10_loss", 10).estimate == pytest.approx(summary["last10_loss"])
    np.testing.assert_allclose(last_fraction_weights(np.array([[0, 400], [400, 480], [480, 512]])),
                               [0, 20 / 52, 32 / 52])


def test_best_bin_of_each_resample_is_the_trainers_best_bin():
    rec, *_ = synthetic_eval(np.random.default_rng(5), n_docs=16, offset=0.0)
    w = resample_weights(rec.n_docs, 50, seed=1)
    from longctx.report.stats import best_bins
    curves = w @ rec.loss
    bins = [tuple(e) for e in rec.edges]
    from longctx.eval.metrics import min_positions_for
    assert list(best_bins(curves, rec.edges)) == [best_bin(c, bins, min_positions_for(bins[-1][1])) for c in curves]


def test_best_bin_never_takes_a_bin_no_packed_document_reaches():
    """Packed documents shorter than every wide bin: NaN wide bins; the best context is the lowest reached bin (of
    any width), in the trainer's best_bin and in the report's best_bins alike; a reached wide bin comes first."""
    from longctx.report.stats import best_bins
    bins = [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128)]
    edges = np.array(bins)
    short = np.array([3.0, 2.5, 2.0, 2.2, np.nan, np.nan, np.nan, np.nan])   # no document reaches 8
    assert best_bin(short, bins, 16, skip_nan=True) == 2
    longer = np.array([3.0, 2.5, 2.0, 2.2, 2.1, 2.4, np.nan, np.nan])        # one wide bin reached: it wins over 2.0
    assert best_bin(longer, bins, 16, skip_nan=True) == 5
    assert list(best_bins(np.stack([short, longer]), edges, 16)) == [2, 5]


def test_seed_aggregate_is_the_mean_of_seeds_with_their_spread():
    rng = np.random.default_rng(6)
    recs = [synthetic_eval(rng, offset=off)[0] for off in (0.05, 0.10, 0.20)]
    agg = seed_aggregate(recs, "last_bin_gap", n_boot=500)
    own = [bootstrap(r, "last_bin_gap", 10).estimate for r in recs]
    assert agg.n_seeds == 3
    assert agg.estimate == pytest.approx(np.mean(own))
    assert agg.seed_std == pytest.approx(np.std(own, ddof=1))
    assert (agg.seed_min, agg.seed_max) == (pytest.approx(min(own)), pytest.approx(max(own)))
    assert agg.low < agg.estimate < agg.high
    # joint resampling of the documents: the seeds' shared document noise does not cancel in the mean, so the
    # interval is as wide as one seed's (the seeds differ by a constant here) -- not narrower by sqrt(3)
    one = bootstrap(recs[0], "last_bin_gap", n_boot=500)
    same = [DocBins(loss=recs[0].loss + d, edges=recs[0].edges, doc_index=recs[0].doc_index, bayes=recs[0].bayes)
            for d in (0.0, 0.1, 0.2)]
    shifted = seed_aggregate(same, "last_bin_gap", n_boot=500)
    assert shifted.high - shifted.low == pytest.approx(one.high - one.low, rel=1e-9)
    # paired seed difference: runs differing by a constant per document have a zero-width interval
    diff = paired_seed_difference(same[1:], same[:1], "last_bin_gap", "b", "a", n_boot=200)
    assert diff.estimate == pytest.approx(0.15) and diff.high - diff.low == pytest.approx(0.0, abs=1e-12)


def test_gap_without_an_optimum_and_bad_records_are_named(tmp_path):
    with pytest.raises(ValueError, match="lacks"):
        bootstrap(docbins(np.ones(4)), "last_bin_gap", 10)
    path = tmp_path / "step_00000010.npz"
    np.savez(path, loss=np.ones((4, 2), np.float32), edges=np.array([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"step_00000010.npz: no 'doc_index' array"):
        load_doc_bins(path)
    np.savez(path, loss=np.ones((4, 2), np.float32), edges=np.array([[0, 1]]), doc_index=np.arange(4))
    with pytest.raises(ValueError, match="shapes disagree"):
        load_doc_bins(path)


def test_paired_interval_covers_the_true_difference_about_95_percent_of_the_time():
    rng = np.random.default_rng(7)
    n, draws, rho, sigma, delta = 200, 300, 0.8, 0.4, 0.03
    cov = sigma ** 2 * np.array([[1, rho], [rho, 1]])
    covered = 0
    for i in range(draws):
        ab = rng.multivariate_normal([1.5 + delta, 1.5], cov, size=n)
        iv = paired_difference(docbins(ab[:, 0]), docbins(ab[:, 1]), "curve", n_boot=400, seed=i)
        covered += iv.low <= delta <= iv.high
    assert 0.90 <= covered / draws <= 0.985   # binomial(300, 0.95): sd 1.3%


def test_resampling_seeds_too_gives_the_normal_width_of_the_seed_mean():
    # documents identical up to a constant per seed: the heldout noise cancels in the paired difference, so the
    # documents-only interval has zero width and the two-level one is the seed mean's: 2 * 1.96 * sd / sqrt(n)
    rng = np.random.default_rng(1)
    base = rng.normal(1.5, 0.4, size=64)
    shifts = rng.normal(0.05, 0.02, size=400)
    a = [docbins(base + d) for d in shifts]
    b = [docbins(base)]
    docs_only = paired_seed_difference(a, b, "best_context_loss", n_boot=300)
    assert docs_only.estimate == pytest.approx(shifts.mean())
    assert docs_only.high - docs_only.low == pytest.approx(0.0, abs=1e-12)
    both = paired_seed_difference(a, b, "best_context_loss", n_boot=2000, resample_seeds=True)
    assert both.estimate == pytest.approx(shifts.mean())
    assert (both.high - both.low) == pytest.approx(2 * 1.96 * shifts.std() / np.sqrt(len(shifts)), rel=0.12)


def test_seed_pairs_agreeing_counts_pairs_in_the_means_direction():
    base = np.linspace(1.0, 2.0, 32)
    a = [docbins(base + d) for d in (0.10, 0.20, -0.05)]   # mean +0.083 above b's mean
    b = [docbins(base + d) for d in (0.0, 0.01)]
    # pairs (a_i - b_j) > 0: 0.10-0.00, 0.10-0.01, 0.20-0.00, 0.20-0.01 -> 4 of 6
    assert seed_pairs_agreeing(a, b, "best_context_loss") == (4, 6)
    assert seed_pairs_agreeing(b, a, "best_context_loss") == (4, 6)


def test_one_number_statistics_pair_across_contexts_on_the_same_documents():
    rng = np.random.default_rng(2)
    short = docbins(rng.normal(1.3, 0.3, size=(40, 2)) + [0.5, 0.0], edges=[[0, 512], [512, 1024]])  # best: bin 2
    long = docbins(short.loss[:, 1:] - 0.02 + rng.normal(0, 0.001, size=(40, 1)), edges=[[0, 4096]])
    with pytest.raises(ValueError, match="different ICL bins"):
        paired_seed_difference([long], [short], "best_context_loss", "long", "short")
    iv = paired_seed_difference([long], [short], "best_context_loss", "long", "short", same_bins=False)
    assert iv.estimate == pytest.approx(-0.02, abs=0.002) and iv.high < 0
    other = docbins(short.loss, edges=short.edges, doc_index=np.arange(40) + 1)
    with pytest.raises(ValueError, match="different heldout documents"):
        paired_seed_difference([long], [other], "best_context_loss", "long", "other", same_bins=False)



def test_a_packed_record_may_hold_nan_where_a_row_reaches_no_bin(tmp_path):
    """Rows of packed documents mark bins they do not reach with NaN and the record says `packed`: it is read, NaN
    kept. An unmarked record with NaN (a diverged run) and an infinity in a packed one stay refused."""
    edges = np.array([[0, 8], [8, 16]])
    loss = np.array([[3.0, np.nan], [2.5, 2.0]])
    path = tmp_path / "step_00000004.npz"
    np.savez(path, loss=loss.astype(np.float32), edges=edges, doc_index=np.arange(2), packed=np.array(True))
    rec = load_doc_bins(path)
    assert rec.packed and np.isnan(rec.loss[0, 1]) and rec.loss[1, 1] == 2.0
    np.savez(path, loss=loss.astype(np.float32), edges=edges, doc_index=np.arange(2))
    with pytest.raises(ValueError, match="non-finite value.*marked 'packed'"):
        load_doc_bins(path)
    loss[0, 0] = np.inf
    np.savez(path, loss=loss.astype(np.float32), edges=edges, doc_index=np.arange(2), packed=np.array(True))
    with pytest.raises(ValueError, match=r"holds 1 non-finite value\(s\) \(inf\)"):
        load_doc_bins(path)
