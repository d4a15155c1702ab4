"""What a run says: concise lines on the console, every line also in <run_dir>/train.log.

One `logging` logger ("longctx"): INFO lines go to stdout, warnings and errors to stderr as `warning: ...`,
and all of them, time-stamped, to train.log once the run directory exists (lines said before that, e.g.
"resuming from ...", are kept and written first). Progress bars (tqdm) are drawn only on a terminal: in a log
file (Slurm, CI) a bar is a redraw per update, so there the run reports progress with plain lines instead
(`logger.console_every`). While a bar is drawn, tqdm's `logging_redirect_tqdm` routes the console lines through
`tqdm.write`, so a bar is never torn (warnings keep their `warning:` prefix there too).
"""
from __future__ import annotations

import logging
import sys
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
