"""What a run says: concise lines on the console, every line also in <run_dir>/train.log.

One `logging` logger ("longctx"): INFO lines go to stdout, warnings and errors to stderr as `warning: ...`,
and all of them, time-stamped, to train.log once the run directory exists (lines said before that, e.g.
"resuming from ...", are kept and written first). Progress bars (tqdm) are drawn only on a terminal: in a log
file (Slurm, CI) a bar is a redraw per update, so there the run reports progress with plain lines instead
(`logger.console_every`, with the elapsed time and an ETA). While a bar is drawn, tqdm's `logging_redirect_tqdm`
routes the console lines through `tqdm.write`, so a bar is never torn (warnings keep their `warning:` prefix there
too). Other long commands (evaluate) report the same way through `command_progress`.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger("longctx")


class _Stream(logging.StreamHandler):
    """A handler writing to sys.stdout/sys.stderr as they are at each line (redirections, pytest capture); `below`:
    only records under that level (a level check, not a filter: tqdm's redirection copies filters to the one handler
    it keeps while a bar is drawn, which must let warnings through)."""

    def __init__(self, name: str, below: int | None = None):
        self._which, self._below = name, below
        super().__init__()

    def emit(self, record: logging.LogRecord) -> None:
        if self._below is None or record.levelno < self._below:
            super().emit(record)

    @property
    def stream(self):
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__ assigns one; ours is always sys.<name>
        pass


class _Held(logging.Handler):
    """Keeps the lines said before the run directory exists, for train.log."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Prefixed(logging.Formatter):
    """`warning: ...`, `error: ...`; info lines as they are."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"{record.levelname.lower()}: {text}" if record.levelno >= logging.WARNING else text


def setup_logging(is_main: bool = True) -> None:
    """Console handlers for this process (rank 0 says everything, other ranks only warnings)."""
    close_logging()
    log.setLevel(logging.INFO)
    log.propagate = False
    if is_main:
        out = _Stream("stdout", below=logging.WARNING)
        out.setLevel(logging.INFO)
        out.setFormatter(_Prefixed())  # the one tqdm's redirection keeps while a bar is drawn
        log.addHandler(out)
        log.addHandler(_Held())
    err = _Stream("stderr")
    err.setLevel(logging.WARNING)
    err.setFormatter(_Prefixed())
    log.addHandler(err)


def log_to_file(run_dir: str | Path) -> Path:
    """Start <run_dir>/train.log (appended to on resume) with the lines held so far."""
    path = Path(run_dir) / "train.log"
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for held in [h for h in log.handlers if isinstance(h, _Held)]:
        for record in held.records:
            handler.handle(record)
        log.removeHandler(held)
    log.addHandler(handler)
    return path


def close_logging() -> None:
    """Back to logging's defaults (a later run, or a tool in the same process, starts clean)."""
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()
    log.propagate = True


def is_terminal() -> bool:
    return sys.stderr.isatty()


class _Bar(tqdm):
    """A tqdm bar that, while open, sends the console lines through tqdm.write (logging_redirect_tqdm)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._redirect = None if self.disable else logging_redirect_tqdm(loggers=[log], tqdm_class=tqdm)
        if self._redirect is not None:
            self._redirect.__enter__()

    def close(self):
        super().close()
        redirect, self._redirect = getattr(self, "_redirect", None), None
        if redirect is not None:
            redirect.__exit__(None, None, None)


def progress_bar(enabled: bool = True, **kwargs) -> tqdm:
    """A tqdm bar on a terminal; nothing (a disabled bar) in a log file, where plain lines report progress."""
    return _Bar(disable=not (enabled and is_terminal()), dynamic_ncols=True, mininterval=0.5, **kwargs)


def format_duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m: a duration as a console line states it."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta(elapsed: float, done: float, total: float) -> str:
    """The time left at the rate so far ("?" before anything is done)."""
    return format_duration(elapsed / done * max(0.0, total - done)) if done > 0 else "?"


class ProgressLines:
    """Progress of a long command where no bar can be drawn (stderr a pipe or a file): a start line, a line at most
    every `every` seconds, and a done line, on stderr (stdout keeps the command's result), each with the elapsed time
    (a monotonic clock) and, once something is done, the ETA. The same update()/close() as a tqdm bar."""

    def __init__(self, total: int, desc: str, unit: str, every: float = 10.0, detail: str | None = None):
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.n = 0
        self.start = self.last = time.perf_counter()
        self._say(f"started ({total} {unit}s{' ' + detail if detail else ''})")

    def _say(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.every and self.n < self.total:
            self.last = now
            elapsed = now - self.start
            self._say(f"{self.n}/{self.total} {self.unit}s | elapsed {format_duration(elapsed)} | "
                      f"eta {eta(elapsed, self.n, self.total)}")

    def close(self) -> None:
        if self.start is not None:
            took = format_duration(time.perf_counter() - self.start)
            self._say(f"done, {self.n}/{self.total} {self.unit}s in {took}")
            self.start = None

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc) -> bool:
        if exc[0] is None:
            self.close()
        return False


def command_progress(total: int, desc: str, unit: str, detail: str | None = None):
    """A long command's progress: a tqdm bar (elapsed and ETA in it) on a terminal, else ProgressLines on stderr.
    `detail` (how the work is split, e.g. "in 4 forwards of up to 8") is said at once, before any work: the first
    update may be long in coming."""
    if is_terminal():
        if detail:
            print(f"{desc}: {total} {unit}s {detail}", file=sys.stderr, flush=True)
        return _Bar(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5, leave=False)
    return ProgressLines(total, desc, unit, detail=detail)
