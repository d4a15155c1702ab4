"""The paper's claims judged on a compact report record (`longctx.report --record`) by the verdict rule
(`longctx.report.verdict`): each claim's arms, seeds, intervals, convergence and setting, and the verdict they allow.

    python -m longctx.report.findings docs/results/experiments/equal_state_seeds.json
    python -m longctx.report.findings RECORD.json --findings my_findings.yaml --bootstrap 2000

The claims of the committed records are in `paper_findings.yaml` beside this module, keyed by the record's file name
(without `.json`); `--findings` names another file of the same form. An arm is the record's `seed_label` up to its
first comma (`power_p2`, `window1170`, `exp`). The metric is the final best-context loss; the document-level interval
pairs the arms' seed means on the same heldout documents (the record's per-document arrays), the seed-level interval
is Welch's t over the seeds' own values, and convergence reads each arm's best-context loss over its evaluations
and the reference arm's last-bin gap to the optimum.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from longctx.report.record import runs_from_record
from longctx.report.stats import DEFAULT_BOOTSTRAP, paired_seed_difference
from longctx.report.verdict import Finding, decide

PAPER_FINDINGS = Path(__file__).with_name("paper_findings.yaml")
FIELDS = {"claim", "source", "a", "b", "sign", "reference", "axes"}
OPTIONAL = {"tolerance", "max_gap"}


def load_findings(path: Path, record_name: str) -> list[dict]:
    """The findings listed for `record_name` in a findings file (YAML, read without running code)."""
    try:
        table = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:
        raise ValueError(f"--findings {str(path)!r}: unreadable ({type(err).__name__})") from None
    if not isinstance(table, dict) or record_name not in table:
        raise ValueError(f"--findings {str(path)!r}: no findings for the record {record_name!r} "
                         f"(it lists {', '.join(table) if isinstance(table, dict) else 'nothing'})")
    findings = table[record_name]
    for i, f in enumerate(findings):
        keys = set(f) if isinstance(f, dict) else set()
        if not FIELDS <= keys <= FIELDS | OPTIONAL:
            raise ValueError(f"--findings {str(path)!r}: {record_name}[{i}] needs {', '.join(sorted(FIELDS))}"
                             f" (and may set {', '.join(sorted(OPTIONAL))}); got {', '.join(sorted(keys))}")
    return findings


def _arm(run) -> str:
    return run.seed_label.split(",")[0].strip()


def judge(record_path: Path, findings_path: Path = PAPER_FINDINGS, n_boot: int = DEFAULT_BOOTSTRAP) -> list[dict]:
    """[{finding fields..., "verdict": Verdict, "difference": (estimate, low, high)}] for the record's findings."""
    record_path = Path(record_path)
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{record_path}: not a readable record ({type(err).__name__})") from None
    runs = runs_from_record(record, record_path.parent)
    arms: dict[str, list] = {}
    for run in runs:
        arms.setdefault(_arm(run), []).append(run)
    out = []
    for spec in load_findings(Path(findings_path), record_path.stem):
        missing = [arm for arm in (spec["a"], spec["b"], spec["reference"]) if arm not in arms]
        if missing:
            raise ValueError(f"{record_path}: no arm {missing[0]!r} for the finding {spec['claim']!r} "
                             f"(arms: {', '.join(sorted(arms))})")
        a, b = arms[spec["a"]], arms[spec["b"]]
        docs_a, docs_b = [r.doc_bins(r.final) for r in a], [r.doc_bins(r.final) for r in b]
        if any(d is None for d in docs_a + docs_b):
            raise ValueError(f"{record_path}: the finding {spec['claim']!r} needs every run's per-document record")
        ci = paired_seed_difference(docs_a, docs_b, "best_context_loss", spec["a"], spec["b"], n_boot=n_boot,
                                    same_bins=all(r.ctx == a[0].ctx for r in a + b))
        curves = {f"{arm} seed {r.seed}": [e["best_context_loss"] for e in r.records]
                  for arm in (spec["a"], spec["b"]) for r in arms[arm]}
        ref = arms[spec["reference"]]
        gap = float(np.mean([r.final["icl_curve"][-1][2] - r.final["bayes_curve"][-1][2] for r in ref])) \
            if all(r.final.get("bayes_curve") for r in ref) else None
        finding = Finding(spec["claim"], int(spec["sign"]), {k: tuple(v) for k, v in spec["axes"].items()},
                          **{k: float(spec[k]) for k in OPTIONAL if k in spec})
        verdict = decide(finding, [r.final["best_context_loss"] for r in a],
                         [r.final["best_context_loss"] for r in b],
                         (float(ci.estimate), float(ci.low), float(ci.high)), curves, gap)
        out.append({**spec, "verdict": verdict, "difference": (float(ci.estimate), float(ci.low), float(ci.high))})
    return out


def markdown(judged: list[dict]) -> str:
    """One row a finding: the claim and its source, the difference, the verdict and the conditions that failed."""
    rows = ["| claim (paper) | a - b, best-context loss, paired over documents | verdict | conditions |",
            "|---|---|---|---|"]
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
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, help="document resamples")
    args = parser.parse_args(argv)
    try:
        if not 1 <= args.bootstrap <= 100_000:
            raise ValueError(f"--bootstrap={args.bootstrap}: must be between 1 and 100000")
        print(markdown(judge(args.record, args.findings, args.bootstrap)))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
