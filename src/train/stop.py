"""Stopping a run on request. SIGTERM (a scheduler's time limit, `kill`, the deadline of scripts/run_points.py) or
SIGUSR1 (Slurm's `--signal=USR1@90`) ends the run after the step in progress, with a checkpoint of that step, so
relaunching the same command continues exactly where it stopped instead of at the last evaluation."""
from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequested(Exception):
    """The run stopped at a stop signal, after saving the checkpoint of its last step."""

    def __init__(self, signum: int, step: int, run_dir):
        self.signum, self.step = signum, step
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, its checkpoint saved in "
                         f"{run_dir}; relaunch the same command to continue from it")


class StopSignals:
    """While inside: a stop signal sets `received` (its number) instead of ending the process; the previous handlers
    come back on exit. Signal handlers belong to the main thread: elsewhere this watches nothing."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> bool:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        return False
