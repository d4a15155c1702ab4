"""Stopping a run on request. SIGTERM (a scheduler's time limit, `kill`, the deadline of scripts/run_points.py),
SIGUSR1 (Slurm's `--signal=USR1@90`) or a first Ctrl-C (SIGINT) ends the run after the step in progress, with a
checkpoint of that step, so relaunching it with trainer.resume=true continues exactly where it stopped instead of at
the last evaluation. The stop message gives that command (`resume_command`). A second Ctrl-C aborts at once
(KeyboardInterrupt, no checkpoint of the step in progress); a Python signal handler only runs between Python
steps, so where the main thread sits in one long torch op (a CPU step at a long context) a watcher thread, woken by the
signal itself (signal.set_wakeup_fd), ends the process ABORT_GRACE_S after that second Ctrl-C."""
from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
ABORT_GRACE_S = 2.0     # the main thread's own abort (AbortRequested) first, where it can run
ABORT_LINE = ("aborted by a second Ctrl-C, without a checkpoint of the step in progress; relaunch with "
              "trainer.resume=true to continue from the newest checkpoint")


class AbortRequested(KeyboardInterrupt):
    """A second Ctrl-C while a stop was pending: the run ends at once, without a checkpoint of the step in progress."""


class StopRequested(Exception):
    """The run stopped at a stop signal, after saving the checkpoint of its last step."""

    def __init__(self, signum: int, step: int, run_dir, command: str | None = None):
        self.signum, self.step, self.command = signum, step, command
        how = (f"continue it with: {command}" if command else
               "continue it by relaunching its command with trainer.resume=true")
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, its checkpoint saved in "
                         f"{run_dir}; {how}")


def resume_command(run_dir) -> str | None:
    """The command that continues this launch's run: its command (provenance.format_command of the launch's record)
    with trainer.resume=true, and the run folder when the launch chose one with hydra.run.dir or was a sweep's job
    (whose relaunch as one run would otherwise go to runs/<run_name>). None outside a Hydra launch (a Trainer built in
    Python), without a record, or under a distributed launcher (whose own command line the record does not hold)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from longctx import provenance

    try:
        record = provenance.read(run_dir)
    except (ValueError, OSError):
        return None
    launch = (record or {}).get("launches", [record])[-1]
    if (not launch or launch.get("overrides") is None or not HydraConfig.initialized()
            or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        return None
    argv = [a for a in provenance.command_line(launch) if not a.lstrip("+").startswith("trainer.resume=")]
    hydra = HydraConfig.get()
    if hydra.mode == RunMode.MULTIRUN:
        argv.append(f"hydra.run.dir={Path(hydra.runtime.output_dir).resolve()}")
    else:
        argv += [o for o in hydra.overrides.hydra if o.startswith("hydra.run.dir=")]
    return shlex.join([*argv, "trainer.resume=true"])


class StopSignals:
    """While inside: a stop signal sets `received` (its number) instead of ending the process; the previous handlers
    come back on exit. Signal handlers belong to the main thread: elsewhere this watches nothing."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}
        self._wakeup: tuple | None = None      # (the pipe's write end, the wakeup fd before it)
        self._closed = False

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            if self.received is not None:  # asked twice: the user will not wait for the step to end
                raise AbortRequested
            sys.stderr.write("\nCtrl-C: stopping after this step, with its checkpoint (Ctrl-C again to abort now)\n")
            self._watch_for_abort()
        self.received = signum

    def _watch_for_abort(self) -> None:
        """From the first Ctrl-C on, every signal's number is written to a pipe by the C-level handler, at once even
        while the main thread is inside a torch op; a thread reading it ends the process at a second SIGINT that the
        main thread did not act on within ABORT_GRACE_S."""
        if self._wakeup is not None:
            return
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._wakeup = (write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
        threading.Thread(target=self._abort_on_second_sigint, args=(read,), name="longctx-abort", daemon=True).start()

    def _abort_on_second_sigint(self, read: int) -> None:
        try:
            while int(signal.SIGINT) not in (got := os.read(read, 64)):
                if not got:              # the write end closed: the watch is over
                    return
        except OSError:
            return
        finally:
            os.close(read)
        time.sleep(ABORT_GRACE_S)
        if not self._closed:
            sys.stderr.write(f"\n{ABORT_LINE}\n")
            sys.stderr.flush()
            os._exit(128 + signal.SIGINT)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            # an ignored signal stays ignored (SIGINT of a job started in the background with `&`)
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS
                              if signal.getsignal(s) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc) -> bool:
        self._closed = True
        if self._wakeup is not None:
            write, before = self._wakeup
            signal.set_wakeup_fd(before)
            os.close(write)
            self._wakeup = None
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
        return False
