"""What a run says and where: concise stdout, quiet stderr, every line in train.log, progress lines every
logger.console_every steps (no bar redraws in a log file); one wandb run id across launches, every ICL PNG
in an offline folder of that id."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.train import console
from longctx.train.data import resolve_splits

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, env, cwd):
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def pngs_by_folder(run: Path) -> dict[str, list[int]]:
    """offline-run folder -> the steps of the ICL PNGs in it."""
    found = {}
    for folder in sorted((run / "wandb").glob("offline-run-*")):
        images = (folder / "files" / "media" / "images" / "eval").glob("icl_curves_png_*.png")
        found[folder.name] = sorted(int(p.name.split("_")[3]) for p in images)
    return found


@pytest.mark.slow
def test_console_log_file_and_wandb_across_a_resume(train_env, tiny, compose, tmp_path):
    cfg = compose(*tiny)
    resolve_splits(cfg.data, cfg.ctx)  # the dataset exists: its generation bar is not this run's output
    run = tmp_path / "run"
    args = [*tiny, f"hydra.run.dir={run}", "logger.wandb.mode=offline", "logger.console_every=2"]
    first = run_cli(args, train_env, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    # stderr is quiet: no wandb banners, no FLA CPU notice, no bar redraws (stderr is not a terminal here)
    assert first.stderr == "", first.stderr[-3000:]
    lines = first.stdout.splitlines()
    assert [line.split("|")[0].strip() for line in lines if "/6 |" in line] == ["step      2/6", "step      4/6",
                                                                               "step      6/6"]
    assert sum(line.startswith("wandb: offline run") for line in lines) == 1
    assert len(lines) < 20
    # train.log holds the same lines, time-stamped
    log = (run / "train.log").read_text()
    for line in lines:
        assert line in log, line
    assert "INFO step      4/6 | train" in log

    # resume to step 9: the same wandb id; wandb writes a second offline folder of that id (it never
    # reuses one), and each evaluation's PNG is in the folder of the launch that logged it
    run_id = (run / "wandb_id").read_text().strip()
    more = run_cli([*args, "trainer.resume=true", "trainer.max_steps=9"], train_env, tmp_path)
    assert more.returncode == 0 and more.stderr == "", more.stderr[-3000:]
    assert (run / "wandb_id").read_text().strip() == run_id
    folders = pngs_by_folder(run)
    assert len(folders) == 2 and all(name.endswith(f"-{run_id}") for name in folders)
    assert list(folders.values()) == [[3, 6], [9]]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [3, 6, 9]
    assert log in (run / "train.log").read_text()  # appended to, not replaced
    assert "resuming from" in (run / "train.log").read_text()

    # relaunched once complete: says so, starts no wandb run
    done = run_cli([*args, "trainer.resume=auto", "trainer.max_steps=9"], train_env, tmp_path)
    assert done.returncode == 0 and "is complete (step 9 of trainer.max_steps=9)" in done.stdout
    assert pngs_by_folder(run) == folders


def test_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(console, "is_terminal", lambda: False)
    assert console.progress_bar(total=3).disable
    monkeypatch.setattr(console, "is_terminal", lambda: True)
    bar = console.progress_bar(total=3, file=sys.stdout)
    assert not bar.disable
    bar.close()
    assert console.progress_bar(False, total=3).disable  # other ranks never draw


def test_lines_said_while_a_bar_is_drawn_go_through_tqdm(monkeypatch, capsys):
    """On a terminal the bar's lifetime is tqdm's logging_redirect_tqdm: lines are written above the bar (tqdm.write),
    warnings keep their prefix, and the handlers are back as they were when the bar closes."""
    from tqdm.contrib import logging as tqdm_logging

    monkeypatch.setattr(console, "is_terminal", lambda: True)
    console.setup_logging(True)
    before = list(console.log.handlers)
    try:
        with console.progress_bar(total=2, file=sys.stderr) as bar:
            assert any(isinstance(h, tqdm_logging._TqdmLoggingHandler) for h in console.log.handlers)
            console.log.info("a line")
            console.log.warning("a doubt")
            bar.update(1)
        assert console.log.handlers == before
        console.log.info("after")
    finally:
        console.close_logging()
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["a line", "warning: a doubt"] and out[-1] == "after"
