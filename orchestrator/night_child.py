"""A scheduled night as a child `overnight run` process, and the one now in flight.

A crash or a leak in one night never takes the scheduler down, and the state lock in `run` makes
a night started while another holds the state dir exit 75 at once. The child in flight is kept
where `serve`'s signal handlers reach it, so that a stop to `serve` stops the night too.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Iterator

from orchestrator.command_endings import signal_name
from orchestrator.config import load_config
from orchestrator.lock import state_identity
from orchestrator.night_marker import mark_started
from orchestrator.schedule_events import logger


class NightInFlight:
    """The child night now running, so that a SIGTERM, Ctrl-C or SIGHUP to `serve` reaches it too."""

    def __init__(self) -> None:
        # Reentrant: `stop` runs in a signal handler, which may interrupt another `stop` on the main thread.
        self._lock = threading.RLock()
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._stopped = threading.Event()

    def start(self, command: list[str]) -> subprocess.Popen[bytes] | None:
        """The child, started; None once `serve` is stopping (the night then stays due)."""
        with self._lock:
            if self._stopping:
                return None
            # stdin closed: nothing in a night may wait for a person. Its own process group:
            # a Ctrl-C on the terminal reaches it once, passed on by `stop`, not twice (twice stops at once).
            self._child = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
            return self._child

    def finished(self) -> None:
        with self._lock:
            self._child = None

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, signum: int) -> None:
        """Pass the signal on to the night in flight, which rolls back its iteration; start no other."""
        with self._lock:
            # Set once: a signal landing while the first handler is inside set() runs this again in it,
            # and would wait for ever for the event's lock (plain, not reentrant), which that handler holds.
            if not self._stopping:
                self._stopping = True
                self._stopped.set()
            if self._child is not None:
                self._child.send_signal(signum)

    def wait(self, seconds: float) -> bool:
        """Wait `seconds`, or less if `serve` is told to stop meanwhile: whether it was."""
        return self._stopped.wait(seconds)


# Module-level, because the night job runs by import path and cannot be handed an object.
_night = NightInFlight()


def night_in_flight() -> NightInFlight:
    return _night


@contextlib.contextmanager
def fresh_night_in_flight() -> Iterator[NightInFlight]:
    """One `serve`'s own night in flight, not stopped by an earlier serve's stop in this process, nor leaving its stop behind."""
    global _night
    _night = NightInFlight()
    try:
        yield _night
    finally:
        _night = NightInFlight()


def run_child_once(config_path: str, log_format: str, fired: datetime | None, marker: Path | None, marked: bool) -> int | None:
    """The night run once as a child `overnight run` for the fire `fired`, the child's pid written into
    `marker` when it was `marked`: its exit code; None when serve's stop ended it (see run_scheduled_night)."""
    # -P: `-m` would put serve's current folder (the repository's checkout, in the documented
    # units) first on the night's import path, and a module of the project's named like one
    # overnight imports (a secrets.py, a guards/ package) was imported in its place: every
    # scheduled night failed while `overnight run` by hand worked. The console script never does.
    command = [sys.executable, "-P", "-m", "orchestrator.cli", "run", "--config", config_path, "--log-format", log_format]
    if fired is not None:
        # Begun again (serve restarted, or died with it): what the fire's earlier runs finished is not worked twice.
        command += ["--scheduled-for", fired.isoformat()]
    night = night_in_flight()
    child = night.start(command)
    if child is None:
        return None
    if marked:  # not written: the warning was said once, not again with the child's pid
        mark_started(marker, pid=child.pid)
    logger().info("scheduled_night_started", config=config_path, pid=child.pid)
    try:
        exit_code = child.wait()
    finally:
        night.finished()
    run_id = _run_id_of(config_path, child.pid)
    logger().info(
        "scheduled_night_finished", config=config_path, **_how_it_ended(exit_code), **({"run_id": run_id} if run_id else {})
    )
    if night.stopping and (run_id is None or _cancelled_by_signal(exit_code)):
        return None  # stopped while starting up (a second or so of imports), or cancelled with serve
    return exit_code


def _how_it_ended(exit_code: int) -> dict[str, object]:
    """The night's exit code as a shell and systemd show it: one killed by a signal it did not handle (a `kill -9`, the
    OOM killer) is 128 + the signal's number, the signal named: Python's own -9 reads as no exit code a person knows."""
    if exit_code >= 0:
        return {"exit_code": exit_code}
    return {"exit_code": 128 - exit_code, "signal": signal_name(-exit_code) or f"signal {-exit_code}"}


def _cancelled_by_signal(exit_code: int) -> bool:
    """Whether `overnight run` exited as a SIGHUP, SIGINT or SIGTERM cancelled it (129, 130, 143)."""
    from orchestrator.night_end import SIGNAL_EXIT_CODES

    return exit_code in SIGNAL_EXIT_CODES.values()


def _run_id_of(config_path: str, pid: int) -> int | None:
    """The run the child recorded: its state dir's latest run, if that process began it (not when it exited early)."""
    from orchestrator.build import open_store

    try:
        config = load_config(Path(config_path), require_tasks=False)
        store = open_store(config)
        try:
            # In a store several state dirs share, the latest run may be another machine's.
            latest = store.latest_run(state_id=state_identity(config.state_dir, create=False))
        finally:
            store.close()
    except Exception:  # the run id is a detail of a log line; the night has ended either way
        return None
    return latest.id if latest is not None and latest.pid == pid else None
