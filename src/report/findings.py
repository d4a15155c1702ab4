"""The paper's claims judged on a compact report record (`longctx.report --record`) by the verdict rule
(`longctx.report.verdict`): each claim's arms, seeds, intervals, convergence and setting, and the verdict they allow.

    python -m longctx.report.findings docs/results/experiments/equal_state_seeds.json
    python -m longctx.report.findings RECORD.json --findings my_findings.yaml --bootstrap 2000

The claims of the committed records are in `paper_findings.yaml` beside this module, keyed by the record's file name
(without `.json`) unless `--claims NAME` names the set; `--findings` names another file of the same form. An arm is the
record's `seed_label`, whole or up to its first comma (`power_p2`, `window1170`, `exp`; a short name that several labels
share is refused). The metric (`metric:`) is the final best-context loss (the default; lower is better) or, for recall
data, the recall at the queries (`recall_accuracy`; higher is better, its optimum 1). The document-level interval pairs
the arms' seed means on the same heldout documents (the record's per-document arrays: binned losses, or each document's
recall from its hits), the seed-level interval is Welch's t over the seeds' own values, and convergence reads each arm's
metric over its evaluations (a run the record marks unfinished fails it) and the reference arm's distance to the optimum
(the last-bin gap to the Bayes loss; 1 minus its recall).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from longctx.report.recall import accuracy_docs, first_stage_failed
from longctx.report.runs import check_record_labels, data_difference, runs_from_record
from longctx.report.stats import DEFAULT_BOOTSTRAP, paired_seed_difference
from longctx.report.verdict import Finding, decide, welch_interval

PAPER_FINDINGS = Path(__file__).with_name("paper_findings.yaml")
FIELDS = {"claim", "source", "a", "b", "sign", "reference", "axes"}
OPTIONAL = {"tolerance", "max_gap", "metric"}
METRICS = {"best_context_loss": "best-context loss", "recall_accuracy": "recall at the queries"}
AXIS_LABELS = {"best_context_loss": "a minus b, final best-context loss (nats/token; below 0: a lower)",
               "recall_accuracy": "a minus b, final recall at the queries (fraction; above 0: a recalls more)"}


def load_findings(path: Path, record_name: str, named: bool = False) -> list[dict]:
    """The findings listed for `record_name` in a findings file (YAML, read without running code). named: the claim
    set was given by --claims, not taken from the record's file name."""
    try:
        table = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:
        raise ValueError(f"--findings {str(path)!r}: unreadable ({type(err).__name__})") from None
    if not isinstance(table, dict) or record_name not in table:
        sets = ", ".join(table) if isinstance(table, dict) and table else "nothing"
        if named:
            raise ValueError(f"--claims {record_name}: no such claim set in --findings {str(path)!r} (it lists "
                             f"{sets})")
        raise ValueError(f"no findings for the record {record_name!r}: no claim set is named for it (the claim set is "
                         f"the record's file name, and --findings {str(path)!r} lists {sets}); pass --claims NAME to "
                         f"judge it against one of those, or --findings FILE.yaml listing its claims under "
                         f"'{record_name}:'")
    findings = table[record_name]
    for i, f in enumerate(findings):
        keys = set(f) if isinstance(f, dict) else set()
        if not FIELDS <= keys <= FIELDS | OPTIONAL:
            raise ValueError(f"--findings {str(path)!r}: {record_name}[{i}] needs {', '.join(sorted(FIELDS))}"
                             f" (and may set {', '.join(sorted(OPTIONAL))}); got {', '.join(sorted(keys))}")
        axes = f.get("axes")   # the setting gate compares these: compared on nothing, it would pass any record
        if not (isinstance(axes, dict) and "model" in axes and {"data", "task"} & set(axes)
                and all(isinstance(v, (list, tuple)) and len(v) == 2 for v in axes.values())):
            raise ValueError(f"--findings {str(path)!r}: {record_name}[{i}].axes: must set model and data (or task), "
                             f"each [ours, the paper's], so that the setting gate compares them; got {axes!r}")
        if f.get("metric", "best_context_loss") not in METRICS:
            raise ValueError(f"--findings {str(path)!r}: {record_name}[{i}].metric={f['metric']!r}: must be one of "
                             f"{', '.join(METRICS)}")
    return findings


def _arms(runs) -> tuple[dict[str, list], dict[str, list[str]]]:
    """({arm name: its runs}, {short name: the labels it would join}): every seed_label names an arm whole, and so
    does its part up to the first comma where no other label shares that part."""
    whole: dict[str, list] = {}
    for run in runs:
        whole.setdefault(run.seed_label, []).append(run)
    short: dict[str, list[str]] = {}
    for label in whole:
        short.setdefault(label.split(",")[0].strip(), []).append(label)
    unique = {name: whole[labels[0]] for name, labels in short.items() if len(labels) == 1}
    shared = {name: labels for name, labels in short.items() if len(labels) > 1 and name not in whole}
    return {**unique, **whole}, shared


def _metric(metric: str, runs: list, claim: str, where: Path):
    """(per-document records, each seed's final value) of the finding's metric for one arm's runs."""
    if metric == "recall_accuracy":
        docs = [accuracy_docs(r) for r in runs]
        if any(d is None for d in docs):
            raise ValueError(f"{where}: the finding {claim!r} needs every run's recall record (hits)")
        return docs, [float(d.loss.mean()) for d in docs]
    docs = [r.doc_bins(r.final) for r in runs]
    if any(d is None for d in docs):
        raise ValueError(f"{where}: the finding {claim!r} needs every run's per-document record")
    return docs, [r.final[metric] for r in runs]


def _distance_to_optimum(metric: str, runs: list) -> float | None:
    """How far the reference arm's seeds end from the optimum, from their metrics alone: recall's is 1, the loss's
    the last bin's Bayes loss where the data has one (None where it has none)."""
    if metric == "recall_accuracy":
        return 1.0 - float(np.mean([r.final["recall_accuracy"] for r in runs]))
    if not all(r.final.get("bayes_curve") for r in runs):
        return None
    return float(np.mean([r.final["icl_curve"][-1][2] - r.final["bayes_curve"][-1][2] for r in runs]))


def _untrained(where: dict, arm_runs: list) -> tuple[str, ...]:
    """In words, the seeds among (arm, run) not trained to their end: a run the record marks unfinished (its last
    evaluation is not its result), and one whose first stage ended short of its stop bound, by the record's recall
    points (`first_stage_failed`; where: run name -> (its point, its seed's index)): a staged recipe's later stage
    says nothing about state where its first failed."""
    out = []
    for arm, run in arm_runs:
        if run.status != "complete":
            out.append(f"{arm} seed {run.seed} is {run.status} (its record was written before it ended)")
        if run.name in where:
            point, i = where[run.name]
            if first_stage_failed(point)[i]:
                out.append(f"{arm} seed {run.seed}'s first stage ended at {100 * point['first_stage'][i]:.1f}% "
                           f"(update {point['first_stage_steps'][i]:,}), short of its bound")
    return tuple(out)


def judge(record_path: Path, findings_path: Path = PAPER_FINDINGS, n_boot: int = DEFAULT_BOOTSTRAP,
          claims: str | None = None) -> list[dict]:
    """[{finding fields..., "verdict": Verdict, "difference": (estimate, low, high), "seed_interval": (...)}] for
    the record's findings: the claim set `claims`, by default the one of the record's file name."""
    record_path = Path(record_path)
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{record_path}: not a readable record ({type(err).__name__})") from None
    return judge_record(record, record_path.parent, record_path.stem, findings_path, n_boot, claims)


def judge_record(record: dict, folder: Path, name: str, findings_path: Path = PAPER_FINDINGS,
                 n_boot: int = DEFAULT_BOOTSTRAP, claims: str | None = None) -> list[dict]:
    """judge() of a record already read: `name` is its file name without .json, `folder` holds its arrays."""
    where = Path(folder) / f"{name}.json"
    check_record_labels(record, str(where))
    arms, shared = _arms(runs_from_record(record, Path(folder), where.name))
    seed_of = {name: (point, i) for point in record.get("recall") or [] for i, name in enumerate(point["runs"])}
    out = []
    for spec in load_findings(Path(findings_path), claims or name, named=claims is not None):
        for arm in (spec["a"], spec["b"], spec["reference"]):
            if arm in shared:
                raise ValueError(f"{where}: the arm {arm!r} of the finding {spec['claim']!r} names several runs' "
                                 f"labels ({'; '.join(shared[arm])}): name one whole")
            if arm not in arms:
                raise ValueError(f"{where}: no arm {arm!r} for the finding {spec['claim']!r} "
                                 f"(arms: {'; '.join(sorted(arms))})")
        metric = spec.get("metric", "best_context_loss")
        a, b = arms[spec["a"]], arms[spec["b"]]
        apart = next((r for r in a + b if r.heldout_key[1:] != a[0].heldout_key[1:]), None)
        if apart is not None:   # documents of one index are other documents there: no paired difference
            raise ValueError(f"{where}: the finding {spec['claim']!r}: {a[0].name} and {apart.name} were evaluated on "
                             f"different heldout data ({data_difference(a[0], apart)}); a paired difference needs "
                             f"the same documents")
        docs_a, finals_a = _metric(metric, a, spec["claim"], where)
        docs_b, finals_b = _metric(metric, b, spec["claim"], where)
        for arm, members, finals in ((spec["a"], a, finals_a), (spec["b"], b, finals_b)):
            bad = [r.name for r, value in zip(members, finals) if not math.isfinite(value)]
            if bad:
                raise ValueError(f"{where}: the finding {spec['claim']!r}: run {bad[0]} of the arm {arm!r} ends with a "
                                 f"non-finite {metric} (a diverged run); judge the claim without it")
        stat = "best_context_loss" if metric == "best_context_loss" else "curve"  # recall: each document's one bin
        ci = paired_seed_difference(docs_a, docs_b, stat, spec["a"], spec["b"], n_boot=n_boot,
                                    same_bins=all(r.ctx == a[0].ctx for r in a + b))
        curves = {f"{arm} seed {r.seed}": [e[metric] for e in r.records if metric in e]
                  for arm in (spec["a"], spec["b"]) for r in arms[arm]}
        untrained = _untrained(seed_of, [(spec[k], r) for k in ("a", "b") for r in arms[spec[k]]])
        gap = _distance_to_optimum(metric, arms[spec["reference"]])
        finding = Finding(spec["claim"], int(spec["sign"]), {k: tuple(v) for k, v in spec["axes"].items()},
                          **{k: float(spec[k]) for k in ("tolerance", "max_gap") if k in spec})
        difference = tuple(float(np.ravel(x)[0]) for x in (ci.estimate, ci.low, ci.high))
        verdict = decide(finding, finals_a, finals_b, difference, curves, gap, untrained)
        seed = welch_interval(finals_a, finals_b)
        codes = sorted({r.code for r in a + b if r.code})   # the code of each run's launches, where the record keeps it
        out.append({**spec, "metric": metric, "verdict": verdict, "difference": difference,
                    "seed_interval": (seed.estimate, seed.low, seed.high), "seeds": (len(a), len(b)), "codes": codes})
    return out


def draw_claims(judged: list[dict], title: str):
    """The claims themselves: one row a claim, its difference a - b of the final metric (best-context loss or
    recall) with the document-level paired interval (thick) and the seed-level Welch interval (thin), and the verdict
    with the conditions that failed beside it (the claim's words say which side the paper has)."""
    from longctx.plotting import attention_label, fill_title, new_figure

    fig, ax = new_figure((10, 1.3 + 1.05 * len(judged)))
    rows = list(range(len(judged)))[::-1]
    for y, j in zip(rows, judged):
        est, lo, hi = j["difference"]
        s_est, s_lo, s_hi = j["seed_interval"]
        ax.plot([s_lo, s_hi], [y, y], color="C0", lw=1.2, marker="|", ms=10,
                label="seed-level 95% interval (Welch t over the seeds)" if y == rows[0] else None)
        ax.plot([lo, hi], [y, y], color="C1", lw=5, solid_capstyle="butt", alpha=0.8,
                label="document-level 95% paired interval (heldout documents)" if y == rows[0] else None)
        ax.plot([est], [y], "o", color="k", ms=5, label="difference of the seed means" if y == rows[0] else None)
        failing = j["verdict"].failing()
        why = f"{j['verdict'].label}" + (f" ({', '.join(failing)} failed)" if failing else "")
        ax.annotate(why, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=7)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(rows)
    ax.set_yticklabels([fill_title(f"{j['claim']} ({j['source']}): {attention_label(j['a'])} minus "
                                   f"{attention_label(j['b'])}, {j['seeds'][0]} vs {j['seeds'][1]} seeds", 3.6, 7)
                        for j in judged], fontsize=7)
    ax.set_ylim(-0.7, len(judged) - 0.3)
    metrics = {j["metric"] for j in judged}
    ax.set_xlabel(AXIS_LABELS[metrics.pop()] if len(metrics) == 1 else "a minus b, final metric (each claim names it)")
    ax.set_title(fill_title(f"{title}: the paper's claims, each difference with its intervals and verdict", 5.5, 10),
                 fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    fig.legend(loc="outside lower center", ncols=3, fontsize=7)
    return fig


def markdown(judged: list[dict]) -> str:
    """One row a finding: the claim and its source, the difference, the verdict and the conditions that failed."""
    metrics = {j["metric"] for j in judged}
    what = METRICS[next(iter(metrics))] if len(metrics) == 1 else "metric"
    rows = [f"| claim (paper) | a - b, {what}, paired over documents | verdict | conditions |", "|---|---|---|---|"]
    for j in judged:
        est, lo, hi = j["difference"]
        v = j["verdict"]
        held = "; ".join(f"{name}: {'held' if ok else 'failed'} ({detail})" for name, (ok, detail) in
                         v.conditions.items())
        rows.append(f"| {j['claim']} ({j['source']}) | {j['a']} - {j['b']}: {est:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                    f"| **{v.label}** | {held} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longctx.report.findings", description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="a compact record written by longctx.report --record")
    parser.add_argument("--findings", type=Path, default=PAPER_FINDINGS, help="the claims to judge (YAML)")
    parser.add_argument("--claims", help="the claim set of --findings to judge (default: the record's file name "
                        "without .json)")
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, help="document resamples")
    parser.add_argument("--figure", type=Path, help="also draw the claims figure into this PNG (never overwritten)")
    args = parser.parse_args(argv)
    try:
        if not 1 <= args.bootstrap <= 100_000:
            raise ValueError(f"--bootstrap={args.bootstrap}: must be between 1 and 100000")
        if args.figure is not None and args.figure.exists():
            raise ValueError(f"--figure {str(args.figure)!r}: exists; nothing is overwritten")
        judged = judge(args.record, args.findings, args.bootstrap, args.claims)
        print(markdown(judged))
        for j in judged:   # seeds made by other code: the verdict stands on them, said beside it
            if len(j["codes"]) > 1:
                print(f"warning: {j['claim']}: its runs were trained by other code ({'; '.join(j['codes'])})",
                      file=sys.stderr)
        if args.figure is not None:
            from longctx.plotting import save_figure

            title = json.loads(Path(args.record).read_text()).get("title", Path(args.record).stem)
            print(save_figure(draw_claims(judged, title), args.figure))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
