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


def test_a_record_named_after_no_claim_set_says_why_and_what_to_pass(capsys, tmp_path):
    """A record whose file name names no claim set (`record.json`, report --record's usual name): the error says the
    claim set is the file name, lists the sets, and names --claims / --findings; --claims NAME judges it as that set."""
    record = tmp_path / "record.json"
    record.write_text((RESULTS / "best_context_table_seeds.json").read_text())
    npz = "best_context_table_seeds.npz"  # named by the record itself
    (tmp_path / npz).write_bytes((RESULTS / npz).read_bytes())
    assert main([str(record), "--bootstrap", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: no findings for the record 'record': no claim set is named "
                                                   "for it (the claim set is the record's file name, and --findings")
    assert "lists equal_state_seeds, best_context_table_seeds, recall_state); pass --claims NAME" in err
    assert "or --findings FILE.yaml listing its claims under 'record:'" in err
    assert main([str(record), "--bootstrap", "100", "--claims", "best_context_table_seeds"]) == 0
    named = capsys.readouterr().out
    assert main([str(RESULTS / "best_context_table_seeds.json"), "--bootstrap", "100"]) == 0
    assert named == capsys.readouterr().out and "(Table 3)" in named
    assert main([str(record), "--claims", "nosuch"]) == 2
    assert "--claims nosuch: no such claim set in --findings" in capsys.readouterr().err


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


def _recall_findings(tmp_path, **change) -> Path:
    """A findings file for the committed recall record: its first claim, with `change` applied."""
    from omegaconf import OmegaConf

    spec = {**OmegaConf.to_container(OmegaConf.load(PAPER_FINDINGS))["recall_state"][0], **change}
    path = tmp_path / "findings.yaml"
    path.write_text(json.dumps({"recall_state": [spec]}))  # JSON is YAML
    return path


def test_recall_claims_are_judged_on_recall_at_the_queries():
    """The recall record's claims compare the seeds' recall (the records' own recall_accuracy, not the hits the
    judge reads), gate convergence on recall's last evaluations, and none is decided outside the paper's setting."""
    record = json.loads((RESULTS / "recall_state.json").read_text())
    final, curves = {}, {}
    for run in record["runs"]:
        final.setdefault(run["seed_label"], []).append(run["records"][-1]["recall_accuracy"])
        curves[(run["seed_label"], run["seed"])] = [e["recall_accuracy"] for e in run["records"]]
    # seeds whose first stage ended below the recipe's bound, by the record's own points (recall 0.99)
    untrained = {(point["label"].rsplit(" (", 1)[0], int(name.split("_s")[1].split("_")[0]))
                 for point in record["recall"] for name, met, end in
                 zip(point["runs"], point.get("first_stage_met") or [None] * len(point["runs"]),
                     point.get("first_stage") or [None] * len(point["runs"]))
                 if met is False or (met is None and end is not None and end < 0.99)}
    assert ("linear, N=64", 1) in untrained and ("softmax, N=64", 0) not in untrained
    judged = judge(RESULTS / "recall_state.json", n_boot=200)
    # 3 claims at each N at ctx 4096, 4 at N = 256 and 2 at N = 1,024 at ctx 16384 (and the window's again after 1,800
    # updates), power p=3 above p=2 at each N, power p=2 with its output norm above the window at widths 128 and 256
    # (and at 512 without its gate), power p=2 above the window at width 64 (lr 6e-3)
    assert [j["metric"] for j in judged] == ["recall_accuracy"] * 23
    for j in judged:
        assert j["difference"][0] == pytest.approx(np.mean(final[j["a"]]) - np.mean(final[j["b"]]), abs=1e-9)
        assert j["seed_interval"][0] == pytest.approx(j["difference"][0], abs=1e-9)
        v = j["verdict"]
        assert v.label in (NOT_AT_THIS_SCALE, INCONCLUSIVE) and "setting" in v.failing()
        moved = [f"{arm} seed {seed}" for (arm, seed), c in curves.items() if arm in (j["a"], j["b"])
                 and abs(c[-1] - c[-2]) >= 0.01]  # the last 2 of 3 evaluations, tolerance 0.01
        failed = [f"{arm} seed {seed}'s first stage ended at" for arm, seed in untrained if arm in (j["a"], j["b"])]
        assert ("convergence" in v.failing()) == bool(moved or failed)
        assert all(name in v.conditions["convergence"][1] for name in moved + failed)
    power_window = next(j for j in judged if j["b"] == "window 1040 (power p=2's state), N=256")
    assert power_window["verdict"].label == INCONCLUSIVE
    assert "the seed-level interval includes 0" in power_window["verdict"].conditions["intervals"][1]
    # five seeds a side at N = 64 tell the sign (the intervals hold); the setting still decides the label
    five = next(j for j in judged if j["b"] == "window 1040 (power p=2's state), N=64")
    assert "intervals" not in five["verdict"].failing() and five["verdict"].label == NOT_AT_THIS_SCALE
    assert five["seed_interval"][1] > 0 and "(Welch t, 5 vs 5 seeds)" in five["verdict"].conditions["intervals"][1]


def test_recall_reference_gate_reads_one_minus_softmax_recall(tmp_path):
    """The reference arm's distance to the optimum on recall is 1 minus its seeds' mean recall."""
    record = json.loads((RESULTS / "recall_state.json").read_text())
    softmax = np.mean([r["records"][-1]["recall_accuracy"] for r in record["runs"]
                       if r["seed_label"] == "softmax, N=64"])
    gap = 1.0 - softmax
    assert 0 < gap < 1e-3
    tight = judge(RESULTS / "recall_state.json", _recall_findings(tmp_path, max_gap=gap / 2), n_boot=50)[0]
    assert f"the reference arm ends {gap:+.3f} above the optimum" in tight["verdict"].conditions["convergence"][1]
    loose = judge(RESULTS / "recall_state.json", _recall_findings(tmp_path, max_gap=2 * gap), n_boot=50)[0]
    assert "reference arm ends" not in loose["verdict"].conditions["convergence"][1]


def test_recall_findings_refuse_a_shared_short_name_and_an_unknown_metric(tmp_path):
    """'power p=2' names both learning rates' runs (at every N) in the recall record: refused, naming the labels; a
    metric the judge does not know is refused naming the field."""
    with pytest.raises(ValueError, match=r"'power p=2'.* names several runs' labels \(.*\): name one whole") as err:
        judge(RESULTS / "recall_state.json", _recall_findings(tmp_path, a="power p=2"), n_boot=50)
    named = str(err.value).split("labels (")[1].split("): name")[0].split("; ")
    assert {"power p=2, lr 1e-3, N=64", "power p=2, lr 3e-3, N=64"} <= set(named)
    with pytest.raises(ValueError, match=r"recall_state\[0\]\.metric='accuracy': must be one of best_context_loss"):
        judge(RESULTS / "recall_state.json", _recall_findings(tmp_path, metric="accuracy"), n_boot=50)


def test_a_seed_recorded_before_its_run_ended_fails_convergence(tmp_path):
    """A record may hold a run still training (its status 'unfinished: ...'): its last evaluation is not the run's
    result, so the claim's convergence fails naming that seed, where the complete record's held."""
    import shutil

    from omegaconf import OmegaConf

    name = "best_context_table_seeds"
    spec = OmegaConf.to_container(OmegaConf.load(PAPER_FINDINGS))[name][1]   # window1170 - exp: every arm settled
    findings = tmp_path / "findings.yaml"
    findings.write_text(json.dumps({name: [spec]}))
    assert "convergence" not in judge(RESULTS / f"{name}.json", findings, n_boot=20)[0]["verdict"].failing()
    record = json.loads((RESULTS / f"{name}.json").read_text())
    run = next(r for r in record["runs"] if r["seed_label"].startswith("window1170") and r["seed"] == 1)
    run["status"] = "unfinished: step 600 of trainer.max_steps=1200"
    (tmp_path / f"{name}.json").write_text(json.dumps(record))
    shutil.copy(RESULTS / f"{name}.npz", tmp_path / f"{name}.npz")
    verdict = judge(tmp_path / f"{name}.json", findings, n_boot=20)[0]["verdict"]
    assert "convergence" in verdict.failing()
    assert "window1170 seed 1 is unfinished: step 600 of trainer.max_steps=1200" in verdict.conditions["convergence"][1]


def test_arms_evaluated_on_other_heldout_data_are_not_paired(tmp_path):
    """One arm's runs evaluated on other heldout documents (another data seed): documents of one index are other
    documents, so the finding is refused naming the two runs and what tells their data apart."""
    import shutil

    from omegaconf import OmegaConf

    name = "best_context_table_seeds"
    spec = OmegaConf.to_container(OmegaConf.load(PAPER_FINDINGS))[name][1]
    findings = tmp_path / "findings.yaml"
    findings.write_text(json.dumps({name: [spec]}))
    record = json.loads((RESULTS / f"{name}.json").read_text())
    moved = [r for r in record["runs"] if r["seed_label"].startswith("window1170")]
    for run in moved:
        run["heldout"] = run["heldout"].replace("data.gen_seed=", "data.gen_seed=9") if "data.gen_seed=" in \
            run["heldout"] else run["heldout"] + ", data.gen_seed=99"
    (tmp_path / f"{name}.json").write_text(json.dumps(record))
    shutil.copy(RESULTS / f"{name}.npz", tmp_path / f"{name}.npz")
    with pytest.raises(ValueError, match=r"were evaluated on different heldout data \(data\.heldout: .* vs .*\); a "
                                         r"paired difference needs the same documents$"):
        judge(tmp_path / f"{name}.json", findings, n_boot=20)


def test_a_claim_over_runs_of_other_code_says_so(capsys, tmp_path):
    """A record keeps the code of each run's launches: a claim whose runs were trained by other code gets a warning
    naming the codes beside its verdict; the committed records (no code kept) get none."""
    import shutil

    name = "best_context_table_seeds"
    assert main([str(RESULTS / f"{name}.json"), "--bootstrap", "20"]) == 0
    assert "warning:" not in capsys.readouterr().err
    record = json.loads((RESULTS / f"{name}.json").read_text())
    for i, run in enumerate(record["runs"]):
        run["code"] = "0123456789ab" if i else "0123456789ab+diff feedfacefeedface"
    (tmp_path / f"{name}.json").write_text(json.dumps(record))
    shutil.copy(RESULTS / f"{name}.npz", tmp_path / f"{name}.npz")
    assert main([str(tmp_path / f"{name}.json"), "--bootstrap", "20"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warned and all(line.endswith("its runs were trained by other code (0123456789ab; 0123456789ab+diff "
                                        "feedfacefeedface)") for line in warned), warned


def test_a_claim_compared_on_no_setting_is_refused(tmp_path):
    """axes: {} would pass the setting gate on any record: refused naming the field, as is an axis that is not
    [ours, the paper's]."""
    from omegaconf import OmegaConf

    name = "best_context_table_seeds"
    spec = OmegaConf.to_container(OmegaConf.load(PAPER_FINDINGS))[name][1]
    for axes in ({}, {"model": ["a", "b"]}, {"model": ["a", "b"], "data": "x"}):
        findings = tmp_path / "findings.yaml"
        findings.write_text(json.dumps({name: [{**spec, "axes": axes}]}))
        with pytest.raises(ValueError, match=r"\[0\]\.axes: must set model and data \(or task\), each \[ours, the "
                                             r"paper's\], so that the setting gate compares them"):
            judge(RESULTS / f"{name}.json", findings, n_boot=20)
