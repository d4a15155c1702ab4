"""Retrieval evaluations in a report: each run's newest passkey and needle result (eval/<task>-step<N>.json, what
`python -m longctx.evaluate RUN --task passkey|needle` writes by default), as a table with intervals and as the
compact record's `retrieval` list.

The interval is Wilson's 95% score interval for a binomial share over the evaluation's key symbols (contexts x
depths x trials x digits): under the question a retrieval table asks first, "does the model read the needle at
all?", a model that cannot has independent symbols each right with probability exactly chance (for the forced
choice, 1/base), so an interval that holds chance is "at chance", one above it is reading.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from longctx.eval.summary import percent
from longctx.report.markdown import table_head
from longctx.report.runs import Run

RESULT_FILE = re.compile(r"^(passkey|needle)-step(\d+)(?:-(\d+))?\.json$")  # a second result of a step: -2, -3 ...
KEPT = ("task", "step", "contexts", "depths", "trials", "digits", "base", "chance", "key_accuracy", "digit_accuracy",
        "choice_accuracy", "mean_key_accuracy", "mean_digit_accuracy", "mean_choice_accuracy")
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (successes of n); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newest_results(run_dir: Path) -> list[dict]:
    """The run's newest result of each retrieval task (by checkpoint step, then the later of a step's results:
    evaluate writes a second one as <task>-step<N>-2.json), passkey first. ValueError naming a result file that is
    not one (cut short, edited, or missing a field the table reads)."""
    newest: dict[str, tuple[tuple[int, int], Path]] = {}
    for path in sorted((Path(run_dir) / "eval").glob("*-step*.json")):
        match = RESULT_FILE.match(path.name)
        if match:
            order = (int(match[2]), int(match[3] or 1))
            if order > newest.get(match[1], ((-1, 0), None))[0]:
                newest[match[1]] = (order, path)
    return [read_result(newest[task][1]) for task in ("passkey", "needle") if task in newest]


REQUIRED = ("task", "step", "contexts", "depths", "trials", "digits", "chance")


def read_result(path: Path) -> dict:
    """A retrieval result file, checked for the fields the table reads."""
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable retrieval result ({type(err).__name__}: {err})") from None
    missing = [key for key in REQUIRED if not isinstance(result, dict) or key not in result]
    if missing:
        raise ValueError(f"{path}: not a retrieval result (no {missing[0]!r}); move it out of eval/ or evaluate again")
    return result


def symbols(entry: dict) -> int:
    """Key symbols an evaluation scored."""
    return len(entry["contexts"]) * len(entry["depths"]) * entry["trials"] * entry["digits"]


def retrieval_entries(runs: list[Run]) -> list[dict]:
    """One entry per run and task (labelled runs: label_runs first), the result's numbers as its JSON holds them."""
    out = []
    for run in runs:
        for result in newest_results(run.path):
            out.append({"run": run.name, "label": run.label, "seed": run.seed,
                        **{key: result[key] for key in KEPT if key in result}})
    return out


def _share(entry: dict, kind: str) -> str:
    mean = entry.get(f"mean_{kind}_accuracy")
    if mean is None:
        return "-"
    n = symbols(entry) if kind != "key" else symbols(entry) // entry["digits"]
    low, high = wilson_interval(round(mean * n), n)
    return f"{mean:.1%} [{low:.1%}, {high:.1%}]"


def retrieval_table(entries: list[dict]) -> str:
    """Markdown: one row per run and task, mean accuracies over every context and depth with Wilson intervals."""
    head = ("| run | task | step | contexts | key accuracy | digit accuracy | forced-choice digit accuracy | "
            "chance (digit, key) |")
    lines = table_head(head)
    for e in entries:
        lines.append(f"| {e['label']} | {e['task']} | {e['step']} | {', '.join(str(c) for c in e['contexts'])} | "
                     f"{_share(e, 'key')} | {_share(e, 'digit')} | {_share(e, 'choice')} | "
                     f"{percent(e['chance']['digit'])}, {percent(e['chance']['key'])} |")
    return "\n".join(lines)


def retrieval_section(entries: list[dict]) -> list[str]:
    """The report's retrieval section (no lines when no run has a result)."""
    if not entries:
        return []
    return ["## Retrieval", "",
            "Each run's newest passkey and needle evaluation (`eval/<task>-step<N>.json`), mean accuracy over every "
            "context and depth, with Wilson's 95% interval over the keys (key accuracy) or key symbols (digit "
            "accuracies). Forced choice: the argmax among the key alphabet's symbols only, exactly at chance for a "
            "model that cannot see the needle.", "", retrieval_table(entries), ""]
