"""Run the points of a grid several at a time on one machine: small runs sharing one GPU (only their speed changes),
or one point per GPU of a host. Each point is its own `python train.py` process, into `<dir>/<run_name>` (the
folder `-m` would give it) with `trainer.resume=auto`, so running the same command again continues every point
that was stopped (by `--deadline-s`, a crash or a lost machine) and skips the finished ones. A point stopped at the
deadline checkpoints the step it was on (SIGTERM: docs/gpu.md (Run folders and resuming)), so it continues from there.

    python scripts/run_points.py --jobs 21 --dir multirun/equal_state experiment=attention_equal_state \\
        +experiment/scale=quarter_batch --grid +experiment/arm=exp,window,power_p2,power_p4,linear \\
        --grid seed=0,1,2
    python scripts/run_points.py --jobs 2 --gpus 0,1 --dir multirun/table experiment=best_context_table \\
        --grid +experiment/table=exp,window,power_p2
    python -m longctx.report multirun/equal_state/*/stage2_ctx4096 --out reports/equal_state

Positional arguments are train.py overrides shared by every point; each `--grid KEY=V1,V2,...` adds an axis (the
points are every combination). Each point's console goes to `<dir>/logs/<point>.log`; one line per start and end
here, and a table of every point's outcome at the end. `--deadline-s S` stops the points still running after S
seconds (SIGTERM, then SIGKILL): they continue from their newest checkpoint next time. SIGTERM or SIGINT (Ctrl-C)
to this script stops the running points the same way, prints the table and exits 128 + the signal's number. Exit
status 0 when every point finished, 1 otherwise. Paths (`--dir`, and any in the overrides) mean what they mean in
the folder this script is started from: the points run there.
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from longctx.naming import SWEEP_NAMED, SWEPT_ENV, hidden_from_name

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Point:
    overrides: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    outcome: str = "not started"
    seconds: float = 0.0
    extra_env: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(self.overrides) or "(the base config)"


def expand_grid(axes: list[str]) -> list[list[str]]:
    """["+experiment/arm=exp,window", "seed=0,1"] -> every combination as override lists, the first axis slowest."""
    values = []
    for axis in axes:
        key, sep, vals = axis.partition("=")
        if not sep or not key or not vals or any(not v for v in vals.split(",")):
            raise ValueError(f"--grid {axis!r}: expected KEY=V1,V2,...")
        values.append([f"{key}={v}" for v in vals.split(",")])
    return [list(combo) for combo in itertools.product(*values)]


def shared_folder(grid: list[list[str]], swept) -> str | None:
    """One line when two points differ only in keys that their run names do not show (they would train into one
    folder, the second resuming the first), else None."""
    seen: dict[tuple, list[str]] = {}
    for point in grid:
        shown = tuple(o for o in point if not hidden_from_name(o.split("=", 1)[0], swept))
        if shown in seen:
            apart = [o for o in point if o not in seen[shown]]
            if not apart:
                return f"--grid: the point {' '.join(point)} comes twice (a value repeated in an axis)"
            return (f"--grid: points {' '.join(seen[shown])} and {' '.join(point)} differ only in "
                    f"{', '.join(o.split('=', 1)[0] for o in apart)}, which run names do not show: they would share "
                    f"one run folder (give each value a --dir of its own)")
        seen[shown] = point
    return None


def point_name(overrides: list[str]) -> str:
    """A file name for a point's log: its overrides' last key parts and values."""
    parts = [o.lstrip("+~").split("=", 1) for o in overrides]
    text = "_".join(f"{k.split('/')[-1].split('.')[-1]}{v}" for k, v in parts) or "base"
    return re.sub(r"[^A-Za-z0-9._\-]+", "-", text)


def train_command(common: list[str], point: list[str], run_dir: Path) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *common, *point, f"hydra.run.dir={run_dir}/${{run_name}}",
            "trainer.resume=auto"]


def start(point: Point, command: list[str]) -> None:
    point.log.parent.mkdir(parents=True, exist_ok=True)
    with open(point.log, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        point.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, **point.extra_env}, start_new_session=True)
    point.started = time.monotonic()
    point.outcome = "running"


def last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return lines[-1].strip()[:160] if lines else ""


def stop(points: list[Point], grace_s: float = 30.0, why: str = "at the deadline") -> None:
    """SIGTERM every running point's process group, SIGKILL what is left after grace_s."""
    running = [p for p in points if p.proc is not None and p.proc.poll() is None]
    for p in running:
        os.killpg(p.proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in running:
        try:
            p.proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait()
        p.outcome, p.seconds = f"stopped {why} (run again to continue)", time.monotonic() - p.started


def run(points: list[Point], commands: list[list[str]], jobs: int, deadline_s: float | None,
        poll_s: float = 1.0, signalled: Callable[[], int | None] = lambda: None) -> None:
    """Run the points, at most `jobs` at once, until all ended, the deadline passed, or `signalled()` names a
    signal this process received (then the running points are stopped as at the deadline)."""
    t0, queue, active = time.monotonic(), list(range(len(points))), []
    while queue or active:
        signum = signalled()
        if signum is not None:
            name = signal.Signals(signum).name
            stop([points[i] for i in active], why=f"by {name}")
            for i in queue:
                points[i].outcome = f"not started ({name})"
            return
        if deadline_s is not None and time.monotonic() - t0 > deadline_s:
            stop([points[i] for i in active])
            for i in queue:
                points[i].outcome = "not started before the deadline"
            return
        while queue and len(active) < jobs:
            i = queue.pop(0)
            start(points[i], commands[i])
            active.append(i)
            print(f"[{time.monotonic() - t0:7.0f} s] started  {points[i].label}  (log {points[i].log})", flush=True)
        for i in list(active):
            p = points[i]
            rc = p.proc.poll()
            if rc is None:
                continue
            active.remove(i)
            p.seconds = time.monotonic() - p.started
            p.outcome = "finished" if rc == 0 else f"failed (exit {rc}): {last_line(p.log)}"
            print(f"[{time.monotonic() - t0:7.0f} s] {'finished' if rc == 0 else 'FAILED  '} {p.label}  "
                  f"({p.seconds:.0f} s)", flush=True)
        time.sleep(poll_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("overrides", nargs="*", help="train.py overrides shared by every point")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="an axis of the grid (repeat for more)")
    parser.add_argument("--dir", required=True, help="folder of the points' run folders (as hydra.sweep.dir)")
    parser.add_argument("--jobs", type=int, default=1, help="points running at once")
    parser.add_argument("--gpus", help="comma list of GPU ids: points go to them in turn (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--deadline-s", type=float, help="stop the points still running after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs}: expected a positive number of points at once")
    if args.deadline_s is not None and args.deadline_s <= 0:
        parser.error(f"--deadline-s={args.deadline_s}: expected a positive number of seconds")
    try:
        grid = expand_grid(args.grid)
    except ValueError as e:
        parser.error(str(e))
    gpus = [g for g in (args.gpus or "").split(",") if g]
    if args.gpus is not None and not all(g.isdigit() for g in gpus):
        parser.error(f"--gpus={args.gpus!r}: expected a comma list of GPU ids, e.g. 0,1")
    swept = sorted({axis.partition("=")[0].lstrip("+~") for axis in args.grid} & set(SWEEP_NAMED))
    clash = shared_folder(grid, swept)
    if clash:
        parser.error(clash)
    from longctx.train.launch import check_overrides
    # a mistyped key or option: one line now, not a failure of every point (each point as train.py would check it)
    for point in [[], *grid]:
        try:
            check_overrides([*args.overrides, *point], ROOT / "conf")
        except ValueError as e:
            parser.error(f"{e} (the point {' '.join(point)})" if point else str(e))
    out = Path(args.dir).expanduser().absolute()  # the caller's folder, whatever the points' working folder
    named = {SWEPT_ENV: ",".join(swept)} if swept else {}   # a run length swept: each its own folder, as in a multirun
    points = [Point(ov, out / "logs" / f"{point_name(ov)}.log",
                    extra_env={**named, **({"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {})})
              for i, ov in enumerate(grid)]
    commands = [train_command(args.overrides, p.overrides, out) for p in points]
    if args.dry_run:
        for p, c in zip(points, commands):
            print(shlex.join([*(f"{k}={v}" for k, v in p.extra_env.items()), *c]))  # pasted into a shell as is
        return 0
    print(f"{len(points)} points, {args.jobs} at a time, into {out}/", flush=True)
    received: list[int] = []  # SIGTERM/SIGINT: stop the points (they checkpoint), then the table, not orphans
    handlers = {s: signal.signal(s, lambda signum, _frame: received.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        run(points, commands, args.jobs, args.deadline_s, signalled=lambda: received[0] if received else None)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    width = max(len(p.label) for p in points)
    print("\n" + "point".ljust(width) + "  seconds  outcome")
    for p in points:
        print(f"{p.label.ljust(width)}  {p.seconds:7.0f}  {p.outcome}")
    if received:
        return 128 + received[0]
    return 0 if all(p.outcome == "finished" for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
