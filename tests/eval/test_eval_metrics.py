"""Binning, best-context loss and last-10% mean on curves with known answers; bin counts too fine are refused."""
import math

import numpy as np
import pytest

from longctx.eval.metrics import (MIN_BEST_BIN_POSITIONS, bin_curve, bin_docs, check_bins, exponential_bins,
                                  icl_summary, last_fraction_mean, min_positions_for)


@pytest.mark.parametrize("ctx,num_bins", [(128, 16), (1000, 10), (65536, 32), (7, 16), (2, 4)])
def test_bins_cover_context_exactly_once_and_grow(ctx, num_bins):
    bins = exponential_bins(ctx, num_bins)
    assert bins[0][0] == 0 and bins[-1][1] == ctx
    assert all(a < b for a, b in bins)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(bins[:-1], bins[1:]))  # contiguous, no overlap
    widths = [b - a for a, b in bins]
    if ctx >= 4 * num_bins:
        assert widths[-1] > 4 * widths[0]  # bins widen along the context
    assert len(bins) <= num_bins + 1  # position 0 (predicted from BOS alone) gets a bin of its own


def test_bin_edges_are_geometric():
    bins = exponential_bins(65536, 16)  # edges 0 and 65536^(i/16) = 2^i
    assert [b for _, b in bins] == [2 ** i for i in range(0, 17)]
    assert bins[0] == (0, 1)


def test_bin_curve_means():
    curve = np.arange(8, dtype=float)
    assert bin_curve(curve, [(0, 1), (1, 4), (4, 8)]).tolist() == [0.0, 2.0, 5.5]


def test_power_law_curve_best_context_is_last_bin():
    ctx = 4096
    curve = 2.0 + 3.0 * (np.arange(ctx) + 1.0) ** -0.5  # falls forever: best context = the last bin
    s = icl_summary(curve, 12)
    bins = exponential_bins(ctx, 12)
    a, b = bins[-1]
    assert s["best_context_bin"] == [a, b]
    assert math.isclose(s["best_context_loss"], curve[a:b].mean(), rel_tol=1e-12)
    assert math.isclose(s["last10_loss"], curve[-410:].mean(), rel_tol=1e-12)


def test_u_shaped_curve_best_context_is_interior_minimum():
    ctx = 1024
    pos = np.arange(ctx) + 1.0
    curve = 3.0 + (np.log(pos) - np.log(100.0)) ** 2  # minimum near position 100 (a model that breaks past it)
    s = icl_summary(curve, 20)
    a, b = s["best_context_bin"]
    assert a <= 100 < b
    assert s["best_context_loss"] == min(v for *_, v in s["icl_curve"])


def test_summary_with_bayes_curve_reports_gaps():
    ctx = 256
    bayes = 1.0 + 1.0 / np.sqrt(np.arange(ctx) + 1.0)
    model = bayes + 0.02
    s = icl_summary(model, 8, bayes)
    assert [r[:2] for r in s["bayes_curve"]] == [r[:2] for r in s["icl_curve"]]
    assert math.isclose(s["last_bin_gap"], 0.02, abs_tol=1e-12)
    assert math.isclose(s["best_context_gap"], 0.02, abs_tol=1e-12)
    assert math.isclose(s["max_bin_gap"], 0.02, abs_tol=1e-12)


def test_largest_gap_over_the_curve_names_its_bin():
    ctx = 256
    bayes = 1.0 + 1.0 / np.sqrt(np.arange(ctx) + 1.0)
    model = bayes + 0.01
    model[20:30] += 0.3                 # a model that lags the optimum in one stretch only
    s = icl_summary(model, 8, bayes)
    a, b = next((a, b) for a, b, _ in s["icl_curve"] if a <= 20 < b)
    assert b >= 30, s["icl_curve"]      # the stretch lies in one bin
    assert math.isclose(s["max_bin_gap"], 0.01 + 0.3 * 10 / (b - a), rel_tol=1e-9)
    assert s["max_bin_gap_position"] == b
    assert math.isclose(s["last_bin_gap"], 0.01, abs_tol=1e-12)


def test_last_fraction_rounds_up_to_one_position():
    assert last_fraction_mean(np.array([5.0, 1.0])) == 1.0
    assert last_fraction_mean(np.arange(20.0)) == 18.5


def test_bad_bins_argument_names_the_key():
    with pytest.raises(ValueError, match=r"trainer.icl_bins=0: must be a positive integer"):
        exponential_bins(128, 0)
    with pytest.raises(ValueError, match=r"--bins='8': must be a positive integer"):
        exponential_bins(128, "8", key="--bins")


def test_best_context_skips_bins_too_small_to_trust():
    """A curve whose single-position bin at position 1 is spuriously low (a lucky position): the best context is
    the lowest bin with at least MIN_BEST_BIN_POSITIONS positions, reported with its end position."""
    ctx = 1024
    curve = 2.0 + 1.0 / np.sqrt(np.arange(ctx) + 1.0)
    curve[1] = 0.5
    bins = exponential_bins(ctx, 16)
    assert bins[1] == (1, 2)
    s = icl_summary(curve, 16)
    a, b = s["best_context_bin"]
    assert b - a >= MIN_BEST_BIN_POSITIONS and (a, b) == bins[-1]
    assert s["best_context_position"] == ctx
    assert s["best_context_loss"] == pytest.approx(curve[a:b].mean(), rel=1e-12)
    # every bin allowed: the lucky position wins, as a plain minimum would have it
    s1 = icl_summary(curve, 16, min_bin_positions=1)
    assert s1["best_context_loss"] == 0.5 and s1["best_context_position"] == 2


def test_short_contexts_need_bins_of_an_eighth_of_the_context():
    """Under 128 tokens no bin can hold 16 positions: a best-context bin needs ctx/8 of them (64 -> 8)."""
    assert [min_positions_for(c) for c in (4, 64, 127, 128, 65536)] == [1, 8, 15, 16, 16]
    curve = np.linspace(3.0, 1.0, 64)
    curve[5] = 0.1                        # a lucky single position
    s = icl_summary(curve, 16)
    a, b = s["best_context_bin"]
    assert b - a >= 8 and b == 64 and s["best_context_loss"] == pytest.approx(curve[a:b].mean(), rel=1e-12)


@pytest.mark.parametrize("ctx, bins", [(64, 1000), (64, 40), (1024, 4000)])
def test_bin_counts_whose_bins_are_all_too_narrow_are_refused(ctx, bins):
    """A bin count that leaves no bin wide enough to be a best context names the key and the largest count that
    works, which itself works."""
    with pytest.raises(ValueError, match=rf"trainer.icl_bins={bins}: at ctx={ctx} its widest bin holds \d+ "
                                         rf"positions, fewer than the {min_positions_for(ctx)}") as err:
        icl_summary(np.ones(ctx), bins)
    fit = int(str(err.value).rsplit("trainer.icl_bins=", 1)[1].split()[0])
    assert max(b - a for a, b in check_bins(ctx, fit)) >= min_positions_for(ctx)
    with pytest.raises(ValueError):
        check_bins(ctx, fit + 1)


def test_every_bin_count_that_is_accepted_has_a_wide_bin():
    for ctx in (8, 30, 64, 200, 4096):
        for bins in range(1, 80):
            try:
                edges = check_bins(ctx, bins)
            except ValueError:
                continue
            s = icl_summary(np.linspace(2, 1, ctx), bins)
            a, b = s["best_context_bin"]
            assert b - a >= min_positions_for(ctx) and (a, b) in edges


def test_per_document_bins_average_to_the_curve():
    rng = np.random.default_rng(0)
    per_token = rng.random((7, 300))
    bins = exponential_bins(300, 10)
    np.testing.assert_allclose(bin_docs(per_token, bins).mean(0), bin_curve(per_token.mean(0), bins), rtol=1e-12)
    assert bin_docs(per_token, bins)[3, -1] == pytest.approx(per_token[3, bins[-1][0]:].mean(), rel=1e-12)
