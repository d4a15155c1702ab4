"""The verdict rule on synthetic records: a clear difference that passes every condition, one that fails the
convergence gate, one whose seed-level interval includes 0, one in a setting other than the paper's; and its t
distribution against closed forms."""
import math

import pytest

from longctx.report.verdict import (CONTRADICTED, INCONCLUSIVE, NOT_AT_THIS_SCALE, REPRODUCED, Finding, decide,
                                    seeds_to_exclude_zero, t_cdf, t_quantile, welch_interval)

SETTING = {"model": ("RWKV 750M", "RWKV 750M"), "data": ("LongCrawl64", "LongCrawl64")}
FLAT = [1.40, 1.30, 1.2500, 1.2495, 1.2490, 1.2490]          # settled: moves 0.001 over its last quarter
FALLING = [1.40, 1.35, 1.30, 1.27, 1.24, 1.21]               # still falling 0.03 over its last quarter


def test_t_distribution_matches_closed_forms():
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)         # Cauchy
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)  # df = 2
    assert t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-8)        # 12.7062
    q = 0.975
    assert t_quantile(q, 2) == pytest.approx((2 * q - 1) / math.sqrt(2 * q * (1 - q)), abs=1e-8)  # 4.3027
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959963984540054, abs=1e-5)             # the normal's


def test_welch_interval_by_hand():
    # equal variances (1) and sizes (3): se = sqrt(2/3), Welch's df = 2 (n - 1) = 4, t_{0.975, 4} = 2.776445
    ci = welch_interval([0, 1, 2], [3, 4, 5])
    assert ci.estimate == -3 and ci.df == pytest.approx(4)
    half = 2.7764451051977987 * math.sqrt(2 / 3)
    assert (ci.low, ci.high) == (pytest.approx(-3 - half, abs=1e-9), pytest.approx(-3 + half, abs=1e-9))
    with pytest.raises(ValueError, match="at least 2 seeds a side"):
        welch_interval([1.0], [2.0, 3.0])


def test_seeds_to_exclude_zero_by_hand():
    """One arm spread by sd 1, the other not at all, means 1 apart: Welch's df is n - 1 and the half-width
    t_{0.975, n-1} / sqrt(n): 2.570582 / sqrt(6) = 1.049 at n = 6, 2.446912 / sqrt(7) = 0.925 at n = 7, so 7 seeds."""
    assert seeds_to_exclude_zero([0.0, 1.0, 2.0], [0.0, 0.0, 0.0]) == 7
    assert seeds_to_exclude_zero([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]) is None        # the same mean: never
    assert seeds_to_exclude_zero([1.0, 1.0], [0.0, 0.0]) is None                  # no spread seen: nothing to say
    assert seeds_to_exclude_zero([0.0, 1.0, 2.0], [0.99, 0.99, 0.99], max_n=50) is None   # more than max_n
    assert seeds_to_exclude_zero([0.0], [1.0, 2.0]) is None                       # one seed: no spread to go on


def clear(sign_of_data=-1):
    """Arm a 0.10 below arm b (or above), three seeds each, tight: a difference nobody could miss."""
    d = 0.10 * sign_of_data
    return [1.20 + d, 1.21 + d, 1.19 + d], [1.20, 1.21, 1.19], (d, d - 0.02, d + 0.02)


def test_a_clear_difference_passing_every_condition_is_reproduced_or_contradicted():
    finding = Finding("power p=2 below the window (Fig. 5)", sign=-1, axes=SETTING)
    a, b, doc = clear(-1)
    verdict = decide(finding, a, b, doc, {"a": FLAT, "b": FLAT}, reference_gap=0.01)
    assert verdict.label == REPRODUCED and verdict.failing() == []
    a, b, doc = clear(+1)
    verdict = decide(finding, a, b, doc, {"a": FLAT, "b": FLAT}, reference_gap=0.01)
    assert verdict.label == CONTRADICTED and "setting held" in verdict.line()


def test_an_arm_still_moving_is_not_reproduced_at_this_scale():
    a, b, doc = clear(+1)
    verdict = decide(Finding("claim", sign=-1, axes=SETTING), a, b, doc, {"a": FALLING, "b": FLAT})
    assert verdict.label == NOT_AT_THIS_SCALE and verdict.failing() == ["convergence"]
    assert "a moved -0.0300" in verdict.conditions["convergence"][1]
    far = decide(Finding("claim", sign=-1, axes=SETTING), a, b, doc, {"a": FLAT, "b": FLAT}, reference_gap=0.12)
    assert far.label == NOT_AT_THIS_SCALE and "+0.120 above the optimum" in far.conditions["convergence"][1]


def test_a_settled_arm_whose_first_stage_failed_is_not_reproduced_at_this_scale():
    """A curve flat after a failed earlier stage has settled on a failure: the clear, settled difference that would
    be contradicted is not reproduced at this scale, the failed stage named."""
    a, b, doc = clear(+1)
    why = "a seed 2's first stage ended at 8.4% (update 4,000), short of its bound"
    verdict = decide(Finding("claim", sign=-1, axes=SETTING), a, b, doc, {"a": FLAT, "b": FLAT}, 0.01, (why,))
    assert verdict.label == NOT_AT_THIS_SCALE and verdict.failing() == ["convergence"]
    assert why in verdict.conditions["convergence"][1]


def test_a_seed_interval_including_zero_is_inconclusive():
    # the documents say -0.05 clearly; the three seeds of each arm scatter by 0.1: the training noise decides
    verdict = decide(Finding("claim", sign=-1, axes=SETTING), [1.10, 1.25, 1.15], [1.20, 1.12, 1.33],
                     (-0.05, -0.07, -0.03), {"a": FLAT, "b": FLAT})
    assert verdict.label == INCONCLUSIVE and verdict.failing() == ["intervals"]
    assert "the seed-level interval includes 0" in verdict.conditions["intervals"][1]
    more = seeds_to_exclude_zero([1.10, 1.25, 1.15], [1.20, 1.12, 1.33])
    assert more > 3 and f"at this spread, {more} seeds an arm would exclude it" in verdict.conditions["intervals"][1]


def test_a_small_difference_needs_five_seeds():
    a, b = [1.200, 1.201, 1.199], [1.220, 1.221, 1.219]        # -0.02, tight, but only three seeds
    verdict = decide(Finding("claim", sign=-1, axes=SETTING), a, b, (-0.02, -0.025, -0.015), {"a": FLAT})
    assert verdict.label == INCONCLUSIVE and "3 seeds, 5 needed" in verdict.conditions["intervals"][1]


def test_another_setting_is_not_reproduced_at_this_scale():
    axes = {"model": ("GPT-2 3.2M", "RWKV 750M"), "data": ("icl_markov_long", "LongCrawl64")}
    a, b, doc = clear(+1)
    verdict = decide(Finding("claim", sign=-1, axes=axes), a, b, doc, {"a": FLAT, "b": FLAT})
    assert verdict.label == NOT_AT_THIS_SCALE and verdict.failing() == ["setting"]
    assert "model GPT-2 3.2M vs the paper's RWKV 750M" in verdict.conditions["setting"][1]
