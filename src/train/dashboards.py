"""wandb dashboards for a sweep: FLOPs and tokens as x axes, the final per-bin ICL table, and a saved workspace per
wandb group built with wandb's own library (wandb-workspaces: `pip install longctx[dashboards]`).

The workspace of group G holds, for the runs of G only (grouped by attention):
* best-context loss and its gap to the optimum against training FLOPs and against step;
* train loss and learning rate;
* the final ICL curves of every run (the per-bin table each run logs at its end, `eval/final_icl_table`) and
  each run's ICL-curve PNG;
* a run table (the runs' configs and final metrics side by side).

`build_workspace` only builds the objects (offline, no network: what the tests check); `save_workspace` saves
one to the wandb server (online runs do it from their logger when they finish).
"""
from __future__ import annotations

FINAL_ICL_TABLE = "eval/final_icl_table"
ICL_PNG = "eval/icl_curves_png"


def define_metrics(run) -> None:
    """FLOPs and tokens as x axes: every eval/* metric is plotted against eval/flops by default, train/* against
    train/tokens; best-context loss keeps its minimum in the run summary."""
    run.define_metric("eval/flops")
    run.define_metric("eval/tokens")
    run.define_metric("train/tokens")
    run.define_metric("eval/*", step_metric="eval/flops")
    run.define_metric("train/*", step_metric="train/tokens")
    run.define_metric("eval/best_context_loss", step_metric="eval/flops", summary="min")


def final_icl_rows(record: dict, run_name: str, attention: str, ctx: int) -> list[list]:
    """One row per bin of an evaluation's ICL curve: run, attention, ctx, step, bin start/end, centre, loss, optimum."""
    bayes = [v for *_, v in record["bayes_curve"]] if "bayes_curve" in record else [None] * len(record["icl_curve"])
    return [[run_name, attention, ctx, record["step"], a, b, (max(a, 1) * b) ** 0.5, loss, opt]
            for (a, b, loss), opt in zip(record["icl_curve"], bayes)]


FINAL_ICL_COLUMNS = ["run", "attention", "ctx", "step", "bin_start", "bin_end", "position", "loss", "bayes_loss"]


def log_final_icl_table(run, record: dict, run_name: str, attention: str, ctx: int) -> None:
    """Log the last evaluation's ICL curve as a table, so a workspace can overlay every run's final curve."""
    import wandb

    table = wandb.Table(columns=FINAL_ICL_COLUMNS, data=final_icl_rows(record, run_name, attention, ctx))
    run.log({FINAL_ICL_TABLE: table})


def build_workspace(entity: str, project: str, group: str):
    """The workspace of one wandb group (module docstring); built offline, saved by `save_workspace`."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def line(y, x="Step", log_x=False, title=None):
        return wr.LinePlot(title=title or f"{y[0]} vs {x}", x=x, y=list(y), log_x=log_x)

    sections = [
        ws.Section(name="Best-context loss", is_open=True, panels=[
            line(["eval/best_context_loss"], "eval/flops", True, "best-context loss vs training FLOPs"),
            line(["eval/best_context_gap", "eval/max_bin_gap"], "eval/flops", True,
                 "gap to the Bayes optimum (best context, largest over the curve) vs training FLOPs"),
            line(["eval/best_context_loss"], "Step", False, "best-context loss vs step"),
            line(["eval/best_context_gap", "eval/max_bin_gap"], "Step", False,
                 "gap to the Bayes optimum (best context, largest over the curve) vs step"),
            line(["eval/last10_loss"], "eval/flops", True, "last-10% loss vs training FLOPs"),
        ]),
        ws.Section(name="Training", is_open=True, panels=[
            line(["train/loss"], "train/tokens", False, "train loss vs tokens"),
            line(["train/lr"], "Step", False, "learning rate vs step"),
        ]),
        ws.Section(name="ICL curves", is_open=True, panels=[
            wr.WeavePanelSummaryTable(table_name=FINAL_ICL_TABLE),
            wr.MediaBrowser(title="ICL curves over training (PNG)", media_keys=[ICL_PNG]),
        ]),
        ws.Section(name="Runs", is_open=True, panels=[wr.RunComparer(diff_only="split")]),
    ]
    return ws.Workspace(
        entity=entity, project=project, name=f"longctx {group}", sections=sections,
        runset_settings=ws.RunsetSettings(filters=ws.And(ws.Config("logger.wandb.group") == group),
                                          groupby=[ws.Config("attention.tag")]),
    )


def save_workspace(entity: str, project: str, group: str) -> str:
    """Build the group's workspace and save it on the wandb server; returns its URL."""
    workspace = build_workspace(entity, project, group)
    workspace.save()
    return workspace.url
