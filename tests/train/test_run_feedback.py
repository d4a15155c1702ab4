"""What a run tells while it runs: progress lines with the elapsed time and an ETA, the measured step time after the
first steps, the total time in the final summary; and every duration from a monotonic clock, so a wall clock set
back mid-run changes none of them."""
from __future__ import annotations

import re
import time

import pytest

from longctx.train import console
from longctx.train.trainer import Trainer
from _resumed import records


def seconds(text: str) -> int:
    """console.format_duration read back: 42s, 3m05s, 2h07m -> seconds."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert m and text, text
    h, mins, s = (int(x or 0) for x in m.groups())
    return 3600 * h + 60 * mins + s


@pytest.mark.parametrize("value, text", [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (7620, "2h07m")])
def test_durations_read_as_written(value, text):
    assert console.format_duration(value) == text and seconds(text) == round(value)


def test_piped_run_lines_carry_elapsed_and_eta_and_the_summary_its_time(compose, tiny, tmp_path, capsys, monkeypatch):
    """stderr is not a terminal under pytest: progress is plain lines. A wall clock that jumps back an hour at every
    reading would make any duration taken from it negative (-3593 s, 1e14 tokens/s)."""
    real = time.time
    calls = iter(range(1, 10 ** 9))
    monkeypatch.setattr(time, "time", lambda: real() - 3600 * next(calls))
    run = tmp_path / "run"
    start = time.perf_counter()
    Trainer(compose(*tiny, "logger.console_every=2", f"run_dir={run}")).fit()
    took = time.perf_counter() - start

    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if line.startswith("step ") and "/6 |" in line]
    assert [line.split("|")[0].strip() for line in steps] == ["step      2/6", "step      4/6", "step      6/6"]
    for line in steps:
        fields = dict(part.strip().split(" ", 1) for part in line.split("|")[1:])
        assert 0 <= seconds(fields["elapsed"]) <= took + 1
        assert 0 <= seconds(fields["eta"]) <= 3 * took + 1, line   # 2 steps done of 6: at most twice the time
    assert seconds(dict(p.strip().split(" ", 1) for p in steps[-1].split("|")[1:])["eta"]) == 0
    measured = [line for line in lines if line.startswith("measured ")]
    assert len(measured) == 1 and "for the 3 steps left" in measured[0], lines
    assert float(measured[0].split()[1]) <= took
    final = next(line for line in lines if line.startswith("final (step 6, "))
    total = re.search(r", total time (\S+)\) -> ", final)
    assert total and 0 <= seconds(total.group(1)) <= took + 1, final

    window_tokens = 3 * 8 * 64  # eval_every steps of docs_per_batch x ctx tokens between evaluations
    for rec in records(run):
        assert 0 <= rec["elapsed_s"] <= took
        assert window_tokens / took <= rec["tokens_per_s"] < 1e9, rec["tokens_per_s"]


def test_progress_lines_start_update_and_finish_with_elapsed_times(capsys, monkeypatch):
    now = iter([100.0, 103.0, 115.0, 130.0, 131.0])   # start, then each reading of the clock
    monkeypatch.setattr(console.time, "perf_counter", lambda: next(now))
    with console.ProgressLines(4, "evaluate ctx 1024", "doc", every=10) as progress:
        progress.update(1)   # 3 s in: no line yet
        progress.update(1)   # 15 s in: 2 of 4 done
        progress.update(2)   # 30 s in: all done, the done line says it
    assert capsys.readouterr().err.splitlines() == [
        "evaluate ctx 1024: started (4 docs)",
        "evaluate ctx 1024: 2/4 docs | elapsed 15s | eta 15s",
        "evaluate ctx 1024: done, 4/4 docs in 31s"]


def test_how_the_work_is_split_is_said_before_any_update(monkeypatch, capsys):
    """On a terminal (a bar) as in a pipe (lines), `detail` is on stderr before the first update comes."""
    for terminal in (True, False):
        monkeypatch.setattr(console, "is_terminal", lambda: terminal)
        capsys.readouterr()  # the bar before, cleared as it closed
        with console.command_progress(4, "evaluate ctx 100000", "doc", "in 2 forwards of up to 2") as progress:
            said = capsys.readouterr().err.splitlines()
            progress.update(4)
        want = "evaluate ctx 100000: 4 docs in 2 forwards of up to 2" if terminal else \
            "evaluate ctx 100000: started (4 docs in 2 forwards of up to 2)"
        assert said[0] == want and (terminal or len(said) == 1), (terminal, said)  # a bar draws below the line


def test_a_terminal_gets_a_bar_and_a_pipe_gets_lines(monkeypatch, capsys):
    monkeypatch.setattr(console, "is_terminal", lambda: True)
    with console.command_progress(2, "evaluate ctx 64", "doc") as bar:
        assert isinstance(bar, console.tqdm) and not bar.disable
        bar.update(2)
    monkeypatch.setattr(console, "is_terminal", lambda: False)
    with console.command_progress(2, "evaluate ctx 64", "doc") as lines:
        assert isinstance(lines, console.ProgressLines)
        lines.update(2)
    assert capsys.readouterr().err.splitlines()[-1].startswith("evaluate ctx 64: done, 2/2 docs in ")


def test_a_window_as_long_as_the_context_is_said_to_be_softmax(compose, tmp_path):
    """window >= ctx masks nothing (the sweep grids' short contexts): one line says the run is softmax attention;
    a window below ctx, or another attention, says nothing; the run itself still logs it at its start."""
    from longctx.train.trainer import whole_context_window

    note = whole_context_window(compose("attention=window", "window=128", "ctx=128"))
    assert note == ("attention.window=128 >= ctx=128: every position sees its whole context, so this run is softmax "
                    "attention (attention=exp) named window128; a window below ctx restricts it")
    assert whole_context_window(compose("attention=window", "window=127", "ctx=128")) is None
    assert whole_context_window(compose("attention=exp", "window=128", "ctx=128")) is None
    cfg = compose("attention=window", "window=256", "ctx=128", "trainer.max_steps=1", "logger.wandb.mode=disabled",
                  f"run_dir={tmp_path / 'run'}", "model=tiny", "trainer.compile=false")
    Trainer(cfg)
    said = [line for line in (tmp_path / "run" / "train.log").read_text().splitlines() if "attention.window=" in line]
    assert len(said) == 1 and said[0].endswith(whole_context_window(cfg)), said
