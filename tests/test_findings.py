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


def test_the_claims_figure_shows_each_difference_its_intervals_and_verdict(capsys, tmp_path):
    """--figure draws a row per claim: the seed means' difference, the document-level interval and the seed-level
    Welch interval as judged, the verdict in words beside it; an existing file is never overwritten."""
    from longctx.report.findings import draw_claims

    judged = judge(RESULTS / "equal_state_seeds.json", n_boot=200)
    ax = draw_claims(judged, "t").axes[0]
    lines = ax.get_lines()
    points = [line.get_xdata()[0] for line in lines if line.get_marker() == "o"]
    assert points == pytest.approx([j["difference"][0] for j in judged])
    spans = sorted(tuple(line.get_xdata()) for line in lines if len(line.get_xdata()) == 2 and line.get_xdata()[0] != 0)
    expected = sorted([tuple(j["difference"][1:]) for j in judged] + [tuple(j["seed_interval"][1:]) for j in judged])
    np.testing.assert_allclose(spans, expected, rtol=1e-12)
    shown = [t.get_text() for t in ax.texts]
    assert [text.split(" (")[0] for text in shown] == [j["verdict"].label for j in judged]
    out = tmp_path / "claims.png"
    assert main([str(RESULTS / "equal_state_seeds.json"), "--bootstrap", "100", "--figure", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main([str(RESULTS / "equal_state_seeds.json"), "--figure", str(out)]) == 2
    assert "exists; nothing is overwritten" in capsys.readouterr().err
