"""Verdicts no stronger than their evidence: when a comparison may say "reproduced" or "contradicted".

A finding compares two arms (a - b of a metric, lower is better for a loss) against the paper's claim of a sign. It
is called "reproduced" (our sign is the paper's) or "contradicted" (the opposite) only when all three hold:

  (a) setting: our setting matches the paper's on every axis the claim depends on (listed per finding: model
      family and size, data, context, tokens; each axis a bool with its two values);
  (b) convergence: every arm's metric moved less than `tolerance` over its last stretch of training (the last
      `last_fraction` of its evaluations), every seed's earlier stage met its bound (a staged recipe: the recall
      recipe's first stage), and the reference arm ends within `max_gap` of the optimum where the data has one;
  (c) intervals: a seed-level Welch t interval over the arms' seed values (n >= 3 seeds a side; n >= 5 when the
      difference is under `small_difference`) excludes 0, in the same direction as the document-level paired
      bootstrap interval (which excludes 0 too).

Otherwise: "inconclusive" when (c) fails (the data cannot tell the sign), else "not reproduced at this scale" when (a)
or (b) fails (the sign is clear here, but here is not the paper's setting or not converged). Every verdict names the
conditions and whether each held (`Verdict.conditions`), so a page can print them beside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

REPRODUCED, CONTRADICTED = "reproduced", "contradicted"
NOT_AT_THIS_SCALE, INCONCLUSIVE = "not reproduced at this scale", "inconclusive"
MIN_SEEDS, MIN_SEEDS_SMALL, SMALL_DIFFERENCE = 3, 5, 0.03


# ----- Student's t (no scipy): the CDF through the regularized incomplete beta, the quantile by bisection ---------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Press et al., Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t (bisection on t_cdf, to 1e-12)."""
    if not (0.0 < q < 1.0) or not df > 0:
        raise ValueError(f"t_quantile: need 0 < q < 1 and df > 0, got q={q!r}, df={df!r}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


# ----- the three conditions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedInterval:
    estimate: float   # mean(a) - mean(b)
    low: float
    high: float
    n_a: int
    n_b: int
    df: float


def welch_interval(a, b, level: float = 0.95) -> SeedInterval:
    """Welch's t interval for mean(a) - mean(b) from the arms' per-seed values (each seed one training run)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a seed-level interval needs at least 2 seeds a side, got {len(a)} and {len(b)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("a seed-level interval needs finite values; got a non-finite seed value")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    est = float(a.mean() - b.mean())
    if se == 0.0:
        return SeedInterval(est, est, est, len(a), len(b), math.inf)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return SeedInterval(est, est - half, est + half, len(a), len(b), df)


def seeds_to_exclude_zero(a, b, level: float = 0.95, max_n: int = 200) -> int | None:
    """The fewest seeds an arm at which Welch's interval would exclude 0 if the arms kept their observed means and
    spreads (sample variances): the seeds a next run needs to decide a difference this size. None where no spread is
    seen, the means are equal, or it takes more than `max_n`."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return None
    diff, sa, sb = abs(float(a.mean() - b.mean())), float(a.var(ddof=1)), float(b.var(ddof=1))
    if diff == 0.0 or sa + sb == 0.0:
        return None
    for n in range(max(len(a), len(b), 2), max_n + 1):
        df = (n - 1) * (sa + sb) ** 2 / (sa ** 2 + sb ** 2)
        if t_quantile(0.5 + level / 2, df) * math.sqrt((sa + sb) / n) < diff:
            return n
    return None


def converged(values, tolerance: float, last_fraction: float = 0.25) -> tuple[bool, str]:
    """Whether a metric's evaluations (in step order) moved less than `tolerance` over the last `last_fraction` of
    them (at least two evaluations), and the movement in words."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return False, "fewer than two evaluations"
    tail = values[-max(2, int(math.ceil(len(values) * last_fraction))):]
    moved = float(tail[-1] - tail[0])
    return abs(moved) < tolerance, f"moved {moved:+.4f} over its last {len(tail)} evaluations (tolerance {tolerance})"


@dataclass(frozen=True)
class Finding:
    """A claim of the paper about arm a minus arm b: `sign` -1 (a lower, e.g. a better loss) or +1."""
    claim: str                 # the paper's words, with its figure or table number
    sign: int
    axes: dict = field(default_factory=dict)     # axis -> (ours, paper's): the setting the claim depends on
    tolerance: float = 0.01    # convergence: the most a converged arm's metric moves over its last stretch
    max_gap: float = 0.05      # convergence: the most the reference arm may sit above the optimum


@dataclass(frozen=True)
class Verdict:
    label: str
    conditions: dict           # name -> (held, detail)

    def failing(self) -> list[str]:
        return [name for name, (held, _) in self.conditions.items() if not held]

    def line(self) -> str:
        marks = "; ".join(f"{name} {'held' if held else 'failed'}: {detail}"
                          for name, (held, detail) in self.conditions.items())
        return f"{self.label} ({marks})"


def decide(finding: Finding, seeds_a, seeds_b, doc_interval: tuple[float, float, float], curves: dict,
           reference_gap: float | None = None, untrained: tuple[str, ...] = ()) -> Verdict:
    """The verdict of one finding. seeds_a, seeds_b: the metric per seed of each arm; doc_interval: (estimate, low,
    high) of the document-level paired difference a - b; curves: arm -> its metric over its evaluations (the
    convergence gate); reference_gap: the reference arm's final distance to the optimum (None: no known optimum);
    untrained: the seeds whose earlier training stage ended short of its bound, in words (they fail convergence too:
    a curve that settled after a failed stage has settled on a failure)."""
    if finding.sign not in (-1, 1):
        raise ValueError(f"Finding.sign={finding.sign!r}: must be -1 (a below b) or +1 (a above b)")
    differing = [f"{axis} {ours} vs the paper's {paper}" for axis, (ours, paper) in finding.axes.items()
                 if ours != paper]
    setting = (not differing, "matches the paper's " + ", ".join(finding.axes) if not differing
               else "; ".join(differing))
    moves = {arm: converged(values, finding.tolerance) for arm, values in curves.items()}
    stalled = [f"{arm} {why}" for arm, (ok, why) in moves.items() if not ok] + list(untrained)
    if reference_gap is not None and reference_gap > finding.max_gap:
        stalled.append(f"the reference arm ends {reference_gap:+.3f} above the optimum (at most {finding.max_gap})")
    convergence = (not stalled, "; ".join(stalled) if stalled else "every arm settled"
                   + ("" if reference_gap is None else f", reference {reference_gap:+.3f} above the optimum"))
    seed = welch_interval(seeds_a, seeds_b)
    need = MIN_SEEDS_SMALL if abs(seed.estimate) < SMALL_DIFFERENCE else MIN_SEEDS
    est, lo, hi = doc_interval
    seed_sign, doc_sign = _sign(seed.low, seed.high), _sign(lo, hi)
    problems = []
    if min(seed.n_a, seed.n_b) < need:
        problems.append(f"{min(seed.n_a, seed.n_b)} seeds, {need} needed for a difference of {seed.estimate:+.3f}")
    if seed_sign == 0:
        more = seeds_to_exclude_zero(seeds_a, seeds_b)
        problems.append("the seed-level interval includes 0" + (
            f" (at this spread, {more} seeds an arm would exclude it)" if more else ""))
    if doc_sign == 0:
        problems.append("the document-level interval includes 0")
    if seed_sign and doc_sign and seed_sign != doc_sign:
        problems.append("the seed- and document-level intervals disagree in sign")
    detail = (f"seed-level {seed.estimate:+.4f} [{seed.low:+.4f}, {seed.high:+.4f}] (Welch t, {seed.n_a} vs "
              f"{seed.n_b} seeds); document-level {est:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    intervals = (not problems, detail + ("; " + "; ".join(problems) if problems else ""))
    conditions = {"setting": setting, "convergence": convergence, "intervals": intervals}
    if problems:
        label = INCONCLUSIVE
    elif differing or stalled:
        label = NOT_AT_THIS_SCALE
    else:
        label = REPRODUCED if seed_sign == finding.sign else CONTRADICTED
    return Verdict(label, conditions)


def _sign(low: float, high: float) -> int:
    return 1 if low > 0 else -1 if high < 0 else 0
