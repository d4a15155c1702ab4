"""What a run says: concise lines on the console, every line also in <run_dir>/train.log.

One `logging` logger ("longctx"): INFO lines go to stdout, warnings and errors to stderr as `warning: ...`,
and all of them, time-stamped, to train.log once the run directory exists (lines said before that, e.g.
"resuming from ...", are kept and written first). Progress bars (tqdm) are drawn only on a terminal: in a log
file (Slurm, CI) a bar is a redraw per update, so there the run reports progress with plain lines instead
(`logger.console_every`).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from tqdm.auto import tqdm

log = logging.getLogger("longctx")


class _Stream(logging.StreamHandler):
    """A handler writing to sys.stdout/sys.stderr as they are at each line (redirections, pytest capture);
    above a tqdm bar, through tqdm.write, so a bar is never torn."""

    def __init__(self, name: str):
        self._which = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._which)

    @stream.setter
    def stream(self, _value):  # StreamHandler.__init__ assigns one; ours is always sys.<name>
        pass

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


class _Held(logging.Handler):
    """Keeps the lines said before the run directory exists, for train.log."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Prefixed(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


def setup_logging(is_main: bool = True) -> None:
    """Console handlers for this process (rank 0 says everything, other ranks only warnings)."""
    close_logging()
    log.setLevel(logging.INFO)
    log.propagate = False
    if is_main:
        out = _Stream("stdout")
        out.setLevel(logging.INFO)
        out.addFilter(lambda record: record.levelno < logging.WARNING)
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


def progress_bar(enabled: bool = True, **kwargs) -> tqdm:
    """A tqdm bar on a terminal; nothing (a disabled bar) in a log file, where plain lines report progress."""
    return tqdm(disable=not (enabled and is_terminal()), dynamic_ncols=True, mininterval=0.5, **kwargs)
