"""The paper's claims judged on the committed experiment records by the verdict rule: the numbers equal the
records', and no claim is called reproduced or contradicted while its setting or convergence says otherwise."""
import json
from pathlib import Path

import numpy as np
import pytest

from longctx.report.findings import PAPER_FINDINGS, judge, main
from longctx.report.verdict import CONTRADICTED, INCONCLUSIVE, NOT_AT_THIS_SCALE, REPRODUCED

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "experiments"


@pytest.mark.parametrize("name", ["equal_state_seeds", "best_context_table_seeds"])
def test_committed_records_get_verdicts_their_evidence_allows(name):
    record = json.loads((RESULTS / f"{name}.json").read_text())
    judged = judge(RESULTS / f"{name}.json", n_boot=200)
    assert judged
    for j in judged:
        # the difference is the seeds' means of the recorded final best-context losses
        final = {}
        for run in record["runs"]:
            final.setdefault(run["seed_label"].split(",")[0], []).append(run["records"][-1]["best_context_loss"])
        assert j["difference"][0] == pytest.approx(np.mean(final[j["a"]]) - np.mean(final[j["b"]]), abs=1e-6)  # float32 arrays
        v = j["verdict"]
        assert v.label in (REPRODUCED, CONTRADICTED, NOT_AT_THIS_SCALE, INCONCLUSIVE)
        if v.label in (REPRODUCED, CONTRADICTED):
            assert v.failing() == []
        # none of these records is in the paper's setting: no claim may be decided
        assert v.label in (NOT_AT_THIS_SCALE, INCONCLUSIVE) and "setting" in v.failing()


def test_linear_against_window32_is_inconclusive_at_the_seed_level():
    linear = next(j for j in judge(RESULTS / "equal_state_seeds.json", n_boot=200) if j["b"] == "window32")
    assert linear["verdict"].label == INCONCLUSIVE
    assert "the seed-level interval includes 0" in linear["verdict"].conditions["intervals"][1]


def test_the_command_prints_the_table_and_names_a_bad_input(capsys, tmp_path):
    assert main([str(RESULTS / "best_context_table_seeds.json"), "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "| claim (paper) |" in out and "(Table 3)" in out
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"kind": "report", "runs": []}))
    assert main([str(bad)]) == 2
    assert "no findings for the record 'other'" in capsys.readouterr().err
    assert main([str(RESULTS / "equal_state_seeds.json"), "--bootstrap", "0"]) == 2
    assert PAPER_FINDINGS.exists()
