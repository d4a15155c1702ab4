"""wandb dashboards: the group's workspace built offline, the metric axes, the final per-bin ICL table."""
from __future__ import annotations

import json

import numpy as np
import pytest

from longctx.train import dashboards
from longctx.train.metrics import icl_summary

pytest.importorskip("wandb_workspaces")


def record(step=100):
    bayes = 1.0 + 1.0 / np.sqrt(np.arange(256) + 1.0)
    return {"step": step, **icl_summary(bayes + 0.1, 8, bayes)}


def test_workspace_of_a_group_is_built_offline():
    import wandb_workspaces.reports.v2 as wr
    ws = dashboards.build_workspace("team", "longctx", "attention_equal_state")
    names = [s.name for s in ws.sections]
    assert names == ["Best-context loss", "Training", "ICL curves", "Runs"]
    lines = [p for s in ws.sections for p in s.panels if isinstance(p, wr.LinePlot)]
    pairs = {(p.x, tuple(p.y)) for p in lines}
    for y in (("eval/best_context_loss",), ("eval/best_context_gap", "eval/max_bin_gap")):
        assert ("eval/flops", y) in pairs and ("Step", y) in pairs
    assert ("train/tokens", ("train/loss",)) in pairs and ("Step", ("train/lr",)) in pairs
    assert all(p.log_x for p in lines if p.x == "eval/flops")
    icl = ws.sections[2].panels
    assert icl[0].table_name == dashboards.FINAL_ICL_TABLE and icl[1].media_keys == [dashboards.ICL_PNG]
    # the saved form (what workspace.save() sends) filters on the group and serialises without a server
    spec = json.dumps(ws._to_model().model_dump(by_alias=True), default=str)
    assert "attention_equal_state" in spec and "logger.wandb.group" in spec


def test_define_metrics_makes_flops_and_tokens_the_x_axes():
    calls = []

    class Run:
        def define_metric(self, name, **kw):
            calls.append((name, kw))

    dashboards.define_metrics(Run())
    steps = {name: kw.get("step_metric") for name, kw in calls}
    assert steps["eval/*"] == "eval/flops" and steps["train/*"] == "train/tokens"
    assert ("eval/best_context_loss", {"step_metric": "eval/flops", "summary": "min"}) in calls


def test_final_icl_rows_follow_the_record():
    rec = record()
    rows = dashboards.final_icl_rows(rec, "run0", "power_p2", 256)
    assert len(rows) == len(rec["icl_curve"])
    for row, (a, b, loss), (_, _, opt) in zip(rows, rec["icl_curve"], rec["bayes_curve"]):
        assert row[:6] == ["run0", "power_p2", 256, 100, a, b]
        assert row[6] == pytest.approx(np.sqrt(max(a, 1) * b)) and row[7] == loss and row[8] == opt
        assert loss == pytest.approx(opt + 0.1)


def test_offline_logger_logs_the_final_table(tmp_path, monkeypatch):
    """The real logger, offline: define_metric at start, the final per-bin table at finish."""
    from omegaconf import OmegaConf

    from longctx.train.loggers import WandbLogger
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"run_name": "r", "ctx": 256, "attention": {"tag": "exp"},
           "logger": {"wandb": {"mode": "offline", "project": "p", "entity": None, "group": "g", "tags": []}}}
    logger = WandbLogger(OmegaConf.create(cfg["logger"]), tmp_path, cfg, "r", None)
    logger.log_eval(100, record(), None)
    logger.finish()
    files = [p.name for p in tmp_path.rglob("*.table.json")]
    assert any(name.startswith("final_icl_table") for name in files), files
