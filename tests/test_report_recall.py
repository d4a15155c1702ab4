"""The report's recall-vs-state view: each group's state from longctx.state, its seeds' accuracies and their t
interval, drawn per number of pairs, kept in the compact record and redrawn from it alone by plot_results."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from longctx.report.cli import main as report
from longctx.report.recall import draw_recall_vs_state, seed_interval
from longctx.state import state_per_layer
from tests.report_fixtures import N_DOCS, fake_run

N_QUERIES = 8
DISTANCE_BINS = [(1, 2), (2, 16), (16, 64)]   # (1, 2): ~8 queries a run, fewer than a drawn bin needs
ARMS = {  # attention conf -> accuracy a document recalls on average (seeds move it a little)
    "exp": ({"name": "exp", "tag": "exp"}, 0.9),
    "window8": ({"name": "window", "tag": "window8", "window": 8}, 0.3),
    "power_p2": ({"name": "power", "tag": "power_p2", "p": 2}, 0.6),
}


def recall_run(folder, arm: str, n_pairs: int, seed: int, lr: float | None = None, level: float | None = None,
               init_from=None, max_steps: int | None = None, **attention_change):
    """A fake run on MQAR data whose final evaluation recorded `hits` (documents x queries) and the accuracy."""
    attention, arm_level = ARMS[arm]
    attention = {**attention, **attention_change}
    level = arm_level if level is None else level
    run = fake_run(folder, attention["name"], 64, 0.1, seed=seed, doc_bins=True, init_from=init_from,
                   max_steps=max_steps,
                   change={"attention": attention, "model": {"d_model": 32, "n_heads": 2},
                           "data": {"name": "mqar", "tag": f"mqar_n{n_pairs}", "n_pairs": n_pairs},
                           **({"optim": {"lr": lr}} if lr is not None else {})})
    rng = np.random.default_rng(1000 * seed + n_pairs + len(arm))
    distance = rng.integers(1, 64, size=(N_DOCS, N_QUERIES))
    # near pairs recalled more often than far ones: the by-distance view has a slope to show
    hits = rng.random((N_DOCS, N_QUERIES)) < level - 0.002 * n_pairs + 0.02 * seed + 0.2 * (distance < 16)
    by_distance = [[a, b, float(hits[(distance >= a) & (distance < b)].mean()), int(((distance >= a) & (distance < b))
                   .sum())] for a, b in DISTANCE_BINS]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lines[-1].update(recall_accuracy=float(hits.mean()), recall_chance=1 / 16, recall_queries=N_DOCS * N_QUERIES,
                     recall_by_distance=by_distance)
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    npz = run / lines[-1]["doc_bins"]
    with np.load(npz) as f:
        arrays = dict(f)
    np.savez(npz, **arrays, hits=hits, distance=distance)
    return run, float(hits.mean())


@pytest.fixture(scope="module")
def recall_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("recall")
    accuracy = {}
    for arm in ARMS:
        for n_pairs in (4, 16):
            for seed in (0, 1):
                _, accuracy[arm, n_pairs, seed] = recall_run(root / f"{arm}_n{n_pairs}_s{seed}", arm, n_pairs, seed)
    return root, accuracy


def test_seed_interval_is_students_t():
    mean, low, high = seed_interval([0.50, 0.52])
    # two seeds: mean +- t(0.975, 1) * s / sqrt(2), t = 12.7062 (a table value), s = 0.01414
    assert mean == pytest.approx(0.51)
    assert high - mean == pytest.approx(12.7062 * np.std([0.50, 0.52], ddof=1) / np.sqrt(2), rel=1e-4)
    assert mean - low == pytest.approx(high - mean)
    # three seeds, one failed: t(0.975, 2) = 4.3027 times s / sqrt(3) spans more than [0, 1]; cut there
    assert seed_interval([0.84, 0.97, 0.01])[1:] == (0.0, 1.0)
    assert seed_interval([0.5]) == (0.5, 0.5, 0.5)


def test_report_tables_state_and_draws_accuracy_against_it(recall_runs, tmp_path):
    root, accuracy = recall_runs
    record = tmp_path / "recall.json"
    text = report([str(root), "--out", str(tmp_path / "out"), "--bootstrap", "50", "--record", str(record)]
                  ).read_text()
    section = text[text.index("## Recall at the queries"):]
    states = {"exp": state_per_layer("exp", d_model=32, n_heads=2, ctx=64),
              "window8": state_per_layer("window", d_model=32, n_heads=2, ctx=64, window=8),
              "power_p2": state_per_layer("power", d_model=32, n_heads=2, ctx=64, p=2)}
    assert states["power_p2"] == 2 * 136 * 16   # D = C(17, 2) = 136 at head dim 16, times v = 16, two heads
    for state in states.values():
        assert f"| {state:,} |" in section
    assert (tmp_path / "out" / "recall_vs_state.png").is_file() and "![Recall vs state]" in text

    written = json.loads(record.read_text())
    points = written["recall"]
    assert len(points) == len(ARMS) * 2
    # every run's hits are in the record's npz, and its accuracy recomputes from them
    with np.load(record.with_suffix(".npz")) as arrays:
        for entry in written["runs"]:
            hits = arrays[entry["doc_bins"].partition("#")[2] + "hits"]
            assert hits.shape == (N_DOCS, N_QUERIES) and set(np.unique(hits)) <= {0, 1}
            assert hits.mean() == pytest.approx(entry["records"][-1]["recall_accuracy"], abs=1e-12)
    by_name = {e["name"]: e["records"][-1]["recall_accuracy"] for e in written["runs"]}
    for point in points:
        assert point["seeds"] == pytest.approx([by_name[name] for name in point["runs"]])
    for point in points:
        arm = point["tag"]
        assert point["state"] == states[arm] and point["d_model"] == 32
        assert point["seeds"] == pytest.approx([accuracy[arm, point["n_pairs"], s] for s in (0, 1)])

    fig = draw_recall_vs_state(points, "t")
    panels = [ax for ax in fig.axes if ax.get_title().startswith("N = ")]
    assert [ax.get_title() for ax in panels] == ["N = 4 key-value pairs", "N = 16 key-value pairs"]
    for ax, n_pairs in zip(panels, (4, 16)):
        drawn = {bars.get_label(): bars.lines[0] for bars in ax.containers}   # errorbar containers
        assert set(drawn) == {"softmax (KV cache of the context)", "sliding window (w tokens)",
                              "power attention (degree p)"}
        softmax = drawn["softmax (KV cache of the context)"]
        assert list(softmax.get_xdata()) == [states["exp"]]
        assert softmax.get_ydata()[0] == pytest.approx(np.mean([accuracy["exp", n_pairs, s] for s in (0, 1)]))
        assert "chance (one value in n_values)" in [line.get_label() for line in ax.get_lines()]
        # each seed's own accuracy is drawn beside the mean (an x per seed)
        from matplotlib.collections import PathCollection
        marks = sorted(tuple(xy) for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets())
        expected = sorted((states[arm], accuracy[arm, n_pairs, s]) for arm in ARMS for s in (0, 1))
        assert np.allclose(marks, expected)


def test_recall_by_distance_is_tabled_kept_and_drawn_from_the_hits_and_distances(recall_runs, tmp_path):
    """Each bin's recall, recomputed here from a run's hits and distances (its eval record), is what the report
    tables (seed means), the record keeps (each seed) and the figure's lower row draws (seed means, bins of at least
    MIN_BIN_QUERIES queries in every seed, at the bin's geometric centre)."""
    from longctx.report.recall import MIN_BIN_QUERIES
    root, _ = recall_runs
    record = tmp_path / "recall.json"
    text = report([str(root), "--out", str(tmp_path / "out"), "--bootstrap", "20", "--record", str(record)]
                  ).read_text()
    truth = {}
    for run in sorted(root.iterdir()):
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        with np.load(run / metrics[-1]["doc_bins"]) as f:
            hits, distance = f["hits"], f["distance"]
        truth[run.name] = [(hits[(distance >= a) & (distance < b)].mean(), ((distance >= a) & (distance < b)).sum())
                           for a, b in DISTANCE_BINS]
    points = json.loads(record.read_text())["recall"]
    fig = draw_recall_vs_state(points, "t")
    lower = [ax for ax in fig.axes if ax.get_xlabel().startswith("distance from pair to query")]
    assert len(lower) == 2   # one per N, below its recall-vs-state panel
    for point in points:
        seeds = [truth[name.split("/")[0]] for name in point["runs"]]
        kept = [[(acc, n) for *_, acc, n in seed] for seed in point["by_distance"]]
        assert np.allclose(np.array(kept, dtype=float), np.array(seeds, dtype=float))
        held = [i for i in range(len(DISTANCE_BINS)) if all(s[i][1] >= MIN_BIN_QUERIES for s in seeds)]
        assert held == [1, 2]
        ax = lower[[4, 16].index(point["n_pairs"])]
        line = next(ln for ln in ax.get_lines() if ln.get_label().startswith(
            {"exp": "softmax", "window8": "sliding window w=8", "power_p2": "power attention p=2"}[point["tag"]]))
        assert np.allclose(line.get_ydata(), [np.mean([s[i][0] for s in seeds]) for i in held])
        assert np.allclose(line.get_xdata(), [np.sqrt(DISTANCE_BINS[i][0] * DISTANCE_BINS[i][1]) for i in held])
        row = next(r for r in text.splitlines() if r.startswith(f"| {point['label']} |") and r.count("%") == 3)
        assert row.rstrip(" |").split(" | ")[1:4] == [f"{100 * np.mean([s[i][0] for s in seeds]):.1f}%" for i in range(3)]
    assert "| queries a seed |" in text


def test_each_point_is_drawn_at_its_best_learning_rate_and_says_so(tmp_path):
    root = tmp_path / "runs"
    levels = {("exp", 1e-3): 0.3, ("exp", 3e-3): 0.9, ("power_p2", 1e-3): 0.7, ("power_p2", 3e-3): 0.2}
    accuracy = {}
    for (arm, lr), level in levels.items():
        for seed in (0, 1):
            _, accuracy[arm, lr, seed] = recall_run(root / f"{arm}_lr{lr}_s{seed}", arm, 16, seed, lr=lr, level=level)
    record = tmp_path / "recall.json"
    text = report([str(root), "--out", str(tmp_path / "out"), "--bootstrap", "20", "--record", str(record)]
                  ).read_text()
    points = json.loads(record.read_text())["recall"]
    best = {"exp": 3e-3, "power_p2": 1e-3}   # the rate whose seeds' mean accuracy is highest, per arm
    assert sorted(p["tag"] for p in points) == ["exp", "power_p2"]
    for point in points:
        arm = point["tag"]
        assert point["lr"] == best[arm] and point["lrs"] == [1e-3, 3e-3]
        assert point["seeds"] == pytest.approx([accuracy[arm, best[arm], s] for s in (0, 1)])
    section = text[text.index("## Recall at the queries"):]
    assert section.count("optim.lr=") >= 4   # the table keeps every rate; the figure's pick is listed below it
    assert "best learning rate" in section and "optimistic" in section
    fig = draw_recall_vs_state(points, "t")
    assert "best learning rate of 0.001, 0.003" in fig._suptitle.get_text().replace("\n", " ")


def test_seeds_of_a_staged_point_are_one_group_with_their_first_stage_shown(tmp_path):
    """Each seed's last stage starts from its own first stage (trainer.init_from: a path that differs per seed); the
    seeds still form one group, and each seed's first-stage recall stands beside its accuracy. A run started from
    some other run's weights stays a group of its own."""
    root = tmp_path / "runs"
    first_stage, final = {}, {}
    for seed, level in ((0, 0.9), (1, 0.05)):   # seed 1 never leaves chance in its first stage
        point = root / f"power_p2_s{seed}"
        _, first_stage[seed] = recall_run(point / "stage1_ctx16", "power_p2", 4, seed, level=level)
        _, final[seed] = recall_run(point / "stage2_ctx64", "power_p2", 16, seed, level=level,
                                    init_from=str(point / "stage1_ctx16"))
        (point / "stages.json").write_text(json.dumps({"stages": [
            {"dir": "stage1_ctx16", "overrides": {"trainer.stop_when": "recall_accuracy>=0.5"}},
            {"dir": "stage2_ctx64", "overrides": {}}]}))
    _, foreign = recall_run(root / "from_elsewhere", "power_p2", 16, 0, init_from=str(tmp_path / "other" / "ckpt"))
    record = tmp_path / "recall.json"
    text = report([str(root), "--out", str(tmp_path / "out"), "--bootstrap", "20", "--record", str(record)]
                  ).read_text()
    points = json.loads(record.read_text())["recall"]
    assert len(points) == 2
    staged = next(p for p in points if len(p["runs"]) == 2)
    assert staged["seeds"] == pytest.approx([final[0], final[1]])
    assert staged["first_stage"] == pytest.approx([first_stage[0], first_stage[1]])
    alone = next(p for p in points if len(p["runs"]) == 1)
    assert alone["seeds"] == pytest.approx([foreign]) and "first_stage" not in alone
    section = text[text.index("## Recall at the queries"):]
    row = next(line for line in section.splitlines() if line.startswith("| power_p2") and "(2 seeds)" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == f"{100 * final[0]:.1f}%, {100 * final[1]:.1f}%"
    ends = [json.loads((root / f"power_p2_s{seed}" / "stage1_ctx16" / "metrics.jsonl").read_text().splitlines()[-1])
            ["step"] for seed in (0, 1)]
    assert staged["first_stage_steps"] == ends
    # seed 1's first stage ended below its bound (recall_accuracy>=0.5): the record and the table say so
    assert staged["first_stage_met"] == [first_stage[0] >= 0.5, first_stage[1] >= 0.5] == [True, False]
    assert cells[5] == (f"{100 * first_stage[0]:.1f}% at {ends[0]:,}, "
                        f"{100 * first_stage[1]:.1f}% at {ends[1]:,} short of its bound")
    assert cells[3] == "[0.0%, 100.0%]"   # two seeds this far apart: the t interval covers every accuracy
    # the figure marks that seed with an open triangle at its accuracy, the other with an x
    from matplotlib.collections import PathCollection
    ax = next(a for a in draw_recall_vs_state([staged], "t").axes if a.get_title().startswith("N = "))
    crosses, triangles = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert np.allclose(crosses.get_offsets(), [(staged["state"], final[0])])
    assert np.allclose(triangles.get_offsets(), [(staged["state"], final[1])])
    assert len(triangles.get_facecolors()) == 0 or triangles.get_facecolors()[0][3] == 0   # open


def test_plot_results_redraws_the_figure_from_the_record_alone(recall_runs, tmp_path):
    root, _ = recall_runs
    copy = tmp_path / "runs"
    shutil.copytree(root, copy)
    results = tmp_path / "results"
    results.mkdir()
    report([str(copy), "--out", str(tmp_path / "out"), "--bootstrap", "50", "--record",
            str(results / "recall.json"), "--record-figures", "recall_vs_state"])
    shutil.rmtree(copy)  # the record and its npz are all the redraw has
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "scripts"))
    try:
        from plot_results import main as plot_results
    finally:
        sys.path.pop(0)
    first = plot_results(["--dir", str(results)])
    assert [p.name for p in first] == ["recall_recall_vs_state.png"]
    drawn = first[0].read_bytes()
    second = plot_results(["--dir", str(results)])
    assert second[0].read_bytes() == drawn  # redrawn byte for byte


def test_a_record_without_recall_points_cannot_draw_the_figure(tmp_path):
    from longctx.report.record import draw_record

    with pytest.raises(ValueError, match="recall_vs_state needs the record's recall points"):
        draw_record({"kind": "report", "title": "t", "figures": {"recall_vs_state": "x.png"}, "runs": []}, tmp_path)


def _hits_by_run(record) -> dict:
    written = json.loads(record.read_text())
    with np.load(record.with_suffix(".npz"), allow_pickle=False) as arrays:
        return {e["name"]: arrays[e["doc_bins"].partition("#")[2] + "hits"] for e in written["runs"]}


def _points(record) -> dict:
    points = json.loads(record.read_text())["recall"]
    return {(p["tag"], p["n_pairs"]): (p["state"], p["seeds"], p["runs"]) for p in points}


def _labels(n_pairs: int) -> list[str]:
    """--label items that name each arm's N (a part reported alone has one N, which its labels leave out)."""
    return [x for arm in ARMS for x in ("--label", f"{arm}={arm}, N={n_pairs}")]


def test_a_carried_record_joins_the_new_runs_as_if_reported_together(recall_runs, tmp_path):
    """A sweep reported in two parts, the first part's record carried into the second's, gives the record the whole
    sweep reported at once gives: every run once with its own hits, every recall point with its seeds and runs; its
    figure redraws from it alone; the carried files are left as they were."""
    from longctx.report.record import draw_record
    root, _ = recall_runs
    first, second = tmp_path / "first", tmp_path / "second"
    for run in sorted(root.iterdir()):
        shutil.copytree(run, (first if "_n4_" in run.name else second) / run.name)
    whole, part, grown = tmp_path / "whole.json", tmp_path / "part.json", tmp_path / "grown.json"
    report([str(root), "--out", str(tmp_path / "o1"), "--bootstrap", "20", "--record", str(whole)])
    report([str(first), "--out", str(tmp_path / "o2"), "--bootstrap", "20", "--record", str(part), *_labels(4)])
    before = part.read_bytes(), part.with_suffix(".npz").read_bytes()
    text = report([str(second), "--out", str(tmp_path / "o3"), "--bootstrap", "20", "--record", str(grown),
                   "--carry", str(part), *_labels(16)]).read_text()
    assert (part.read_bytes(), part.with_suffix(".npz").read_bytes()) == before
    assert f"Carried into the record from `{part}` as it was written: 6 runs, 3 recall points" in text
    section = text[text.index("## Recall at the queries"):]   # this report's runs only: the carried were tabled before
    assert "exp, N=16 (2 seeds)" in section and "N=4" not in section
    # the carried runs first, each with its own hits under its new index in the new npz
    names = [e["name"] for e in json.loads(grown.read_text())["runs"]]
    assert sorted(names) == sorted(e["name"] for e in json.loads(whole.read_text())["runs"])
    assert all("_n4_" in name for name in names[:6]) and not any("_n4_" in name for name in names[6:])
    whole_hits, grown_hits = _hits_by_run(whole), _hits_by_run(grown)
    assert all(np.array_equal(grown_hits[name], whole_hits[name]) for name in names)
    assert _points(grown) == _points(whole)
    fig = draw_record(json.loads(grown.read_text()), tmp_path)["recall_vs_state"]
    assert [ax.get_title() for ax in fig.axes if ax.get_title().startswith("N = ")] == [
        "N = 4 key-value pairs", "N = 16 key-value pairs"]


def test_carry_refuses_what_would_mix_up_runs_or_points_before_writing(recall_runs, tmp_path, capsys):
    root, _ = recall_runs
    part, new = tmp_path / "part.json", tmp_path / "new.json"
    report([str(root / "exp_n4_s0"), str(root / "exp_n4_s1"), "--out", str(tmp_path / "o1"), "--bootstrap", "20",
            "--record", str(part)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "table"}))
    cut = tmp_path / "cut.json"   # a record whose npz was not copied beside it
    cut.write_text(part.read_text())
    cases = [(["--carry", str(part)], "--carry: needs --record"),
             (["--record", str(new), "--carry", str(tmp_path / "missing.json")], "that exists"),
             (["--record", str(new), "--carry", str(bad)], "not a report record"),
             (["--record", str(new), "--carry", str(cut)], "per-document arrays (part.npz#r0_) are not in"),
             (["--record", str(part), "--carry", str(part)], "is a file the report reads"),
             # both parts are labelled plainly "exp": one label holding two runs of each seed
             (["--record", str(new), "--carry", str(part)], "label 'exp': runs exp_n4_s0 and exp_n16_s0 are both seed 0"),
             (["--record", str(new), "--carry", str(part), "--carry", str(part), "--label", "exp=softmax"],
              "is also in")]
    with pytest.raises(SystemExit) as exit_:   # the carried runs themselves, reported again
        report([str(root / "exp_n4_s0"), str(root / "exp_n4_s1"), "--out", str(tmp_path / "o2"), "--bootstrap", "20",
                "--record", str(new), "--carry", str(part), "--label", "exp=softmax"])
    assert exit_.value.code == 2 and "is also among the runs reported" in capsys.readouterr().err
    for args, words in cases:
        with pytest.raises(SystemExit) as exit_:
            report([str(root / "exp_n16_s0"), str(root / "exp_n16_s1"), "--out", str(tmp_path / "o2"),
                    "--bootstrap", "20", *args])
        assert exit_.value.code == 2
        assert words in capsys.readouterr().err
    assert not new.exists() and not (tmp_path / "o2").exists()


def test_carry_refuses_a_carried_run_that_evaluated_since_and_a_label_over_two_configs(tmp_path, capsys):
    """A carried run reported again after more evaluations is still that run (refused, not counted twice); runs of
    another config that the new report labels like a carried label (the label names only what differs within one
    report) are refused too, naming both runs."""
    runs = [recall_run(tmp_path / "runs" / f"exp_s{seed}", "exp", 16, seed, lr=1e-3)[0] for seed in (0, 1)]
    part = tmp_path / "part.json"
    report([str(r) for r in runs] + ["--out", str(tmp_path / "o1"), "--bootstrap", "20", "--record", str(part)])
    metrics = runs[0] / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-1])
    with open(metrics, "a") as f:   # it evaluated once more since the record was written
        f.write(json.dumps({**last, "step": last["step"] + 10, "tokens": last["tokens"] + 10000}) + "\n")
    with pytest.raises(SystemExit):
        report([str(runs[0]), "--out", str(tmp_path / "o2"), "--bootstrap", "20", "--record",
                str(tmp_path / "new.json"), "--carry", str(part)])
    assert "is also among the runs reported" in capsys.readouterr().err
    other = [recall_run(tmp_path / "fast" / f"exp_s{seed}", "exp", 16, seed, lr=3e-2)[0] for seed in (2, 3)]
    with pytest.raises(SystemExit):
        report([str(r) for r in other] + ["--out", str(tmp_path / "o3"), "--bootstrap", "20", "--record",
                                          str(tmp_path / "new.json"), "--carry", str(part)])
    err = capsys.readouterr().err
    assert "label 'exp': runs exp_s0 and exp_s2 differ in their config beyond the seed" in err
    assert not (tmp_path / "new.json").exists() and not (tmp_path / "o3").exists()


def test_a_run_elsewhere_named_like_a_carried_one_is_named_apart(recall_runs, tmp_path):
    """Another folder's run whose own folders match a carried run's name (a longer rerun of a grid in a folder of
    its own) is another run: the report names it by one more folder and carries both."""
    root, _ = recall_runs
    part, new = tmp_path / "part.json", tmp_path / "new.json"
    report([str(root / "exp_n4_s0"), str(root / "exp_n4_s1"), "--out", str(tmp_path / "o1"), "--bootstrap", "20",
            "--record", str(part)])
    carried = {entry["name"] for entry in json.loads(part.read_text())["runs"]}
    again = [recall_run(tmp_path / "longer" / f"exp_n4_s{seed}", "exp", 4, seed, level=0.95)[0] for seed in (0, 1)]
    report([str(r) for r in again] + ["--out", str(tmp_path / "o2"), "--bootstrap", "20", "--record", str(new),
                                      "--carry", str(part), "--label", "exp=softmax, longer"])
    names = [entry["name"] for entry in json.loads(new.read_text())["runs"]]
    assert len(names) == len(set(names)) == 4 and carried < set(names)
    assert sorted(set(names) - carried) == [f"longer/exp_n4_s{seed}" for seed in (0, 1)]


def test_add_seeds_joins_new_runs_to_a_carried_point(recall_runs, tmp_path, capsys):
    """A later report's runs of a carried point (the same label but its seed count) are refused, or with --add-seeds
    join its seeds: one point whose seeds, runs and per-seed lists are the carried ones then the new ones, judged by
    the findings on every seed (the runs share their seed label); a seed the point already has is refused."""
    from longctx.report.findings import judge
    from longctx.report.verdict import welch_interval

    root, accuracy = recall_runs
    part, new = tmp_path / "part.json", tmp_path / "new.json"
    report([str(root / "exp_n16_s0"), str(root / "exp_n16_s1"), str(root / "window8_n16_s0"),
            str(root / "window8_n16_s1"), "--out", str(tmp_path / "o1"), "--bootstrap", "20", "--record", str(part)])
    more = [recall_run(tmp_path / "more" / f"{arm}_n16_s{seed}", arm, 16, seed)[0]
            for arm in ("exp", "window8") for seed in (2, 3)]
    args = [str(r) for r in more] + ["--out", str(tmp_path / "o2"), "--bootstrap", "20", "--record", str(new),
                                     "--carry", str(part)]
    with pytest.raises(SystemExit):
        report(args)
    assert "--add-seeds to add them to its seeds" in capsys.readouterr().err and not new.exists()
    report(args + ["--add-seeds"])
    record = json.loads(new.read_text())
    points = {p["label"]: p for p in record["recall"]}
    assert sorted(points) == ["exp (4 seeds)", "window8 (4 seeds)"]
    carried = {p["label"]: p for p in json.loads(part.read_text())["recall"]}
    for arm in ("exp", "window8"):
        point, before = points[f"{arm} (4 seeds)"], carried[f"{arm} (2 seeds)"]
        assert point["runs"][:2] == before["runs"] and len(point["runs"]) == 4
        assert point["seeds"][:2] == before["seeds"]
        assert point["seeds"][2:] == [pytest.approx(float(np.mean(np.load(tmp_path / "more" / f"{arm}_n16_s{s}" /
                                      json.loads((tmp_path / "more" / f"{arm}_n16_s{s}" / "metrics.jsonl")
                                                 .read_text().splitlines()[-1])["doc_bins"])["hits"])))
                                      for s in (2, 3)]
        assert len(point["by_distance"]) == 4
    assert {r["seed_label"] for r in record["runs"]} == {"exp", "window8"}
    finding = {"claim": "softmax above a window", "source": "t", "a": "exp", "b": "window8", "sign": 1,
               "reference": "exp", "metric": "recall_accuracy",
               "axes": {"model": ["tiny", "tiny"], "task": ["MQAR", "MQAR"]}}
    claims = tmp_path / "claims.yaml"
    import yaml
    claims.write_text(yaml.safe_dump({"new": [finding]}))
    (judged,) = judge(new, claims, n_boot=20)
    want = welch_interval(points["exp (4 seeds)"]["seeds"], points["window8 (4 seeds)"]["seeds"])
    assert judged["seed_interval"][0] == pytest.approx(want.estimate)
    # the same seeds again, from another folder: not new seeds
    again = [recall_run(tmp_path / "again" / f"exp_n16_s{seed}", "exp", 16, seed, level=0.8)[0] for seed in (1, 4)]
    with pytest.raises(SystemExit):
        report([str(r) for r in again] + ["--out", str(tmp_path / "o3"), "--bootstrap", "20", "--record",
                                          str(tmp_path / "again.json"), "--carry", str(part), "--add-seeds"])
    assert "runs exp_n16_s1 and again/exp_n16_s1 are both seed 1" in capsys.readouterr().err


def test_merge_seeds_keeps_a_carried_rate_pick_and_refuses_what_is_not_one_point():
    from longctx.report.recall import merge_seeds
    old = {"label": "power p=2, N=64 (2 seeds)", "attention": "power", "p": 2, "state": 10, "lr": 0.003,
           "lrs": [0.001, 0.003], "seeds": [0.5, 0.6], "runs": ["a", "b"], "first_stage": [0.995, 0.97]}
    new = {"label": "power p=2, N=64", "attention": "power", "p": 2, "state": 10, "lr": 0.003, "seeds": [0.7],
           "runs": ["c"], "first_stage": [0.999], "first_stage_met": [True]}
    merged = merge_seeds(old, new, {"a": 0, "b": 1, "c": 2})
    assert merged["label"] == "power p=2, N=64 (3 seeds)" and merged["lrs"] == [0.001, 0.003]
    assert merged["seeds"] == [0.5, 0.6, 0.7] and merged["runs"] == ["a", "b", "c"]
    # the carried point predates first_stage_met: its seeds are read against the recipe's bound (0.99)
    assert merged["first_stage_met"] == [True, False, True]
    with pytest.raises(ValueError, match="lr 0.003 vs 0.001"):
        merge_seeds(old, {**new, "lr": 0.001}, {"a": 0, "b": 1, "c": 2})
    with pytest.raises(ValueError, match="a best-of-rates pick"):
        merge_seeds(old, {**new, "lrs": [0.001, 0.003]}, {"a": 0, "b": 1, "c": 2})
    with pytest.raises(ValueError, match="seed 1 is already"):
        merge_seeds(old, new, {"a": 0, "b": 1, "c": 1})
    with pytest.raises(ValueError, match="one side trained a first stage"):
        merge_seeds(old, {k: v for k, v in new.items() if not k.startswith("first_stage")}, {"a": 0, "b": 1, "c": 2})


def test_points_of_one_arm_at_several_rates_across_parts_are_drawn_at_the_best(recall_runs, tmp_path):
    """One arm reported at lr 1e-3 and, in a later part, at 3e-3 (carried into one record) is one point at its best
    rate, every rate kept in `lrs`, as within one report; the figure draws it once."""
    part, new = tmp_path / "part.json", tmp_path / "new.json"
    slow = [recall_run(tmp_path / "slow" / f"exp_s{seed}", "exp", 16, seed, lr=1e-3, level=0.5)[0] for seed in (0, 1)]
    fast = [recall_run(tmp_path / "fast" / f"exp_s{seed}", "exp", 16, seed, lr=3e-3, level=0.9)[0] for seed in (0, 1)]
    report([str(r) for r in slow] + ["--out", str(tmp_path / "o1"), "--bootstrap", "20", "--record", str(part),
                                     "--label", "exp=softmax, lr 1e-3"])
    report([str(r) for r in fast] + ["--out", str(tmp_path / "o2"), "--bootstrap", "20", "--record", str(new),
                                     "--carry", str(part), "--label", "exp=softmax, lr 3e-3"])
    record = json.loads(new.read_text())
    (point,) = record["recall"]
    assert point["label"] == "softmax, lr 3e-3 (2 seeds)" and point["lrs"] == [0.001, 0.003]
    (slower,) = point["other_rates"]   # what the other rate measured stays in the record, whole
    assert slower["label"] == "softmax, lr 1e-3 (2 seeds)" and slower["lr"] == 0.001 and len(slower["seeds"]) == 2
    assert len(record["runs"]) == 4    # every run stays in the record: the pick is the point's, not the runs'
    (panel,) = [ax for ax in draw_recall_vs_state(record["recall"], "t").axes if ax.get_title().startswith("N = ")]
    assert [list(c.lines[0].get_ydata()) for c in panel.containers] == [[pytest.approx(np.mean(point["seeds"]))]]


def test_panels_split_by_context_where_the_points_span_several():
    point = {"attention": "exp", "tag": "exp", "p": None, "window": None, "state": 100, "chance": 0.01,
             "label": "softmax", "seeds": [0.9, 0.95]}
    points = [{**point, "n_pairs": 64, "ctx": 4096}, {**point, "n_pairs": 256, "ctx": 4096},
              {**point, "n_pairs": 256, "ctx": 16384, "label": "softmax, ctx 16384"}]
    fig = draw_recall_vs_state(points, "t")
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "N = 64 key-value pairs, ctx 4,096", "N = 256 key-value pairs, ctx 4,096",
        "N = 256 key-value pairs, ctx 16,384"]
    one = draw_recall_vs_state(points[:2], "t")
    assert [ax.get_title() for ax in one.axes if ax.get_title()] == [
        "N = 64 key-value pairs", "N = 256 key-value pairs"]


def test_arms_at_several_widths_get_a_panel_of_their_own():
    """Points of one arm at several model widths (state grows with the heads): the N's panel draws the families at
    the width most points share, and a panel beside it draws each such arm across its widths, one line an arm at its
    seed means, each point naming its width, and beside them an arm that ran only away from the main width (drawn
    nowhere else); its lower panel defers to the report's table."""
    def point(attention, p, d_model, state, accuracy):
        by_distance = [[1, 100, accuracy, 50], [100, 1000, accuracy / 2, 50]]
        return {"attention": attention, "tag": attention, "p": p, "window": None, "state": state, "chance": 0.01,
                "n_pairs": 256, "ctx": 4096, "d_model": d_model, "label": f"{attention} {p} {d_model}",
                "seeds": [accuracy - 0.01, accuracy + 0.01], "by_distance": [by_distance, by_distance]}
    points = [point("linear", None, d, 32 * d, 0.001 * d) for d in (64, 128, 256)]
    points += [point("power", 2, d, 1040 * d, 0.002 * d) for d in (64, 128, 256)]
    points += [point("power", 3, 128, 45760 * 128, 0.9)]
    points += [{**point("power", 2, 512, 1040 * 512, 0.7), "ungated": True}]   # an arm of its own, at width 512 only
    fig = draw_recall_vs_state(points, "t")
    main, widths = [ax for ax in fig.axes if ax.get_title().startswith("N = ")]
    assert main.get_title() == "N = 256 key-value pairs, width 128"
    assert widths.get_title() == "N = 256 key-value pairs, across model widths (d = 64/128/256/512)"

    def lines(ax):
        return sorted((list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in ax.containers)
    assert lines(main) == sorted([([32 * 128], [pytest.approx(0.128)]),
                                  ([1040 * 128, 45760 * 128], [pytest.approx(0.256), pytest.approx(0.9)])])
    # one line per arm across its widths (power p=3 ran at the main width only: not in this panel)
    expected = sorted(([p["state"] for p in arm], [pytest.approx(np.mean(p["seeds"])) for p in arm])
                      for arm in (points[:3], points[3:6], points[7:]))
    assert lines(widths) == expected
    assert {t.get_text() for t in main.texts} == {"p=2", "p=3"}
    assert {t.get_text() for t in widths.texts} == {"d=64", "d=128", "d=256", "p=2 d=64", "p=2 d=128", "p=2 d=256",
                                                 "p=2 ungated d=512"}
    lower = [ax for ax in fig.axes if ax.get_xlabel().startswith("distance from pair to query")]
    assert len(lower) == 1 and sorted(ln.get_label() for ln in lower[0].get_lines()
                                      if not ln.get_label().startswith("_")) == sorted(
        ["linear attention", "power attention p=2", "power attention p=3"])


def test_an_output_norm_arm_is_a_point_and_a_dashed_line_of_its_own(tmp_path):
    """Power p=2 with a per-head output norm holds the same state as without: the record keeps it as its own point
    (`output_norm`), and the figure draws it as a dashed line of its own beside the plain arm, named in the legend
    and its points' notes, never joined into the plain arm's line."""
    for seed in (0, 1):
        recall_run(tmp_path / f"plain_s{seed}", "power_p2", 16, seed, level=0.4)
        recall_run(tmp_path / f"norm_s{seed}", "power_p2", 16, seed, level=0.8, output_norm=True)
    record = tmp_path / "recall.json"
    report([str(tmp_path / f"{arm}_s{seed}") for arm in ("plain", "norm") for seed in (0, 1)]
           + ["--out", str(tmp_path / "out"), "--bootstrap", "20", "--record", str(record)])
    points = json.loads(record.read_text())["recall"]
    assert sorted(p.get("output_norm", False) for p in points) == [False, True]
    assert len({p["state"] for p in points}) == 1
    plain, norm = sorted(points, key=lambda p: p.get("output_norm", False))
    assert np.mean(norm["seeds"]) > np.mean(plain["seeds"])

    fig = draw_recall_vs_state(points, "t")
    (panel,) = [ax for ax in fig.axes if ax.get_title().startswith("N = ")]
    drawn = {bars.get_label(): bars.lines[0] for bars in panel.containers}
    assert set(drawn) == {"power attention (degree p)", "power attention (degree p), per-head output norm"}
    assert drawn["power attention (degree p)"].get_linestyle() == "-"
    dashed = drawn["power attention (degree p), per-head output norm"]
    assert dashed.get_linestyle() == "--" and dashed.get_ydata()[0] == pytest.approx(np.mean(norm["seeds"]))
    assert sorted(t.get_text() for t in panel.texts) == ["p=2", "p=2+norm"]


def test_an_ungated_arm_is_a_line_of_its_own_beside_the_output_norm_arms(tmp_path):
    """Power p=2 without its gate (attention.gating=false) holds the same state: the record keeps it as its own point
    (`ungated`), and the figure draws plain, output-norm and ungated output-norm arms as three lines, each named."""
    runs = []
    for name, change in (("plain", {}), ("norm", {"output_norm": True}),
                         ("bare", {"output_norm": True, "gating": False})):
        for seed in (0, 1):
            runs.append(recall_run(tmp_path / f"{name}_s{seed}", "power_p2", 16, seed, **change)[0])
    record = tmp_path / "recall.json"
    report([str(r) for r in runs] + ["--out", str(tmp_path / "out"), "--bootstrap", "20", "--record", str(record)])
    points = json.loads(record.read_text())["recall"]
    assert sorted((p.get("output_norm", False), p.get("ungated", False)) for p in points) == [
        (False, False), (True, False), (True, True)]
    fig = draw_recall_vs_state(points, "t")
    (panel,) = [ax for ax in fig.axes if ax.get_title().startswith("N = ")]
    styles = {bars.get_label(): bars.lines[0].get_linestyle() for bars in panel.containers}
    assert styles == {"power attention (degree p)": "-", "power attention (degree p), per-head output norm": "--",
                      "power attention (degree p), per-head output norm, no gate": "-."}
    assert sorted(t.get_text() for t in panel.texts) == ["p=2", "p=2+norm", "p=2+norm ungated"]


def test_a_last_stage_of_other_length_is_recorded_and_drawn_in_a_panel_of_its_own(tmp_path):
    """A staged point whose last stage ran other than the recipe's updates (RECIPE_UPDATES, the config's
    trainer.max_steps) records them and gets a panel of its own, titled by them; one at the recipe's records none."""
    from omegaconf import OmegaConf

    from longctx.report.recall import RECIPE_UPDATES
    conf = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "recall_state.yaml"
    assert OmegaConf.load(conf).trainer.max_steps == RECIPE_UPDATES
    for steps in (RECIPE_UPDATES, 3 * RECIPE_UPDATES):
        for seed in (0, 1):
            point = tmp_path / f"runs_{steps}" / f"s{seed}"
            recall_run(point / "stage1_ctx16", "exp", 4, seed, level=0.9)
            recall_run(point / "stage2_ctx64", "exp", 16, seed, init_from=str(point / "stage1_ctx16"),
                       max_steps=steps)
            (point / "stages.json").write_text(json.dumps({"stages": [
                {"dir": "stage1_ctx16", "overrides": {}}, {"dir": "stage2_ctx64", "overrides": {}}]}))
    record = tmp_path / "recall.json"
    report([str(tmp_path / "runs_600"), str(tmp_path / "runs_1800"), "--out", str(tmp_path / "out"),
            "--bootstrap", "20", "--record", str(record)])
    points = json.loads(record.read_text())["recall"]
    assert sorted(p.get("updates", 0) for p in points) == [0, 3 * RECIPE_UPDATES]
    fig = draw_recall_vs_state(points, "t")
    assert [ax.get_title() for ax in fig.axes if ax.get_title().startswith("N = ")] == [
        "N = 16 key-value pairs", "N = 16 key-value pairs, 1,800 updates"]


def test_the_committed_recall_record_names_each_points_width_and_first_stages():
    """Every point of the published recall record says its model width, the one its runs' folders were named for
    (model.name d<width>l<layers>), and the seeds the figure marks as failed training are those whose first stage
    ended below the recipe's bound."""
    import re

    from longctx.report.recall import RECIPE_FIRST_STOP, first_stage_failed
    record = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results" / "experiments"
                         / "recall_state.json").read_text())
    for point in record["recall"]:
        assert {int(re.search(r"_d(\d+)l\d+_", name).group(1)) for name in point["runs"]} == {point["d_model"]}
        ends = point.get("first_stage") or [None] * len(point["seeds"])
        assert first_stage_failed(point) == [e is not None and e < RECIPE_FIRST_STOP for e in ends]
    widths = {p["d_model"] for p in record["recall"] if p["n_pairs"] == 256 and p["ctx"] == 4096}
    assert widths == {64, 128, 256, 512}
    assert sorted(p["d_model"] for p in record["recall"] if p.get("output_norm")) == [64, 128, 256, 512]
    assert all("output_normtrue" in name for p in record["recall"] if p.get("output_norm") for name in p["runs"])
    assert [p["d_model"] for p in record["recall"] if p.get("ungated")] == [512]
    # width 64 ran at 3e-3 (part 3) and 6e-3 (part 5): drawn at 6e-3, the 3e-3 points and first stages kept beside
    fast = [p for p in record["recall"] if p["d_model"] == 64 and p.get("lrs") == [0.003, 0.006]]
    assert len(fast) == 3 and all(p["lr"] == 0.006 and p["other_rates"][0]["lr"] == 0.003
                                  and len(p["other_rates"][0]["first_stage"]) == 3 for p in fast)
    assert all(("gatingfalse" in name) == bool(p.get("ungated")) for p in record["recall"] for name in p["runs"])
    # the longer last stage at ctx 16384: its own runs, named apart from the recipe's runs of the same folders
    longer = [p for p in record["recall"] if p.get("updates")]
    assert {(p["ctx"], p["updates"]) for p in longer} == {(16384, 1800)} and len(longer) == 3
    assert all(name.startswith("recall_state_long_1800/") for p in longer for name in p["runs"])
    names = [run["name"] for run in record["runs"]]
    assert len(names) == len(set(names))
