"""The `overnight` process's signal handling: the early handlers that make a stop before the command begins a quiet
exit, a night's cancel on SIGTERM/SIGINT/SIGHUP, and the exit at once for a second Ctrl-C.

Light (the standard library only): `orchestrator/cli.py` imports it before its slow imports, to install the early
handlers first.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

from orchestrator.cancel import stopping_signals  # light: the standard library only

if TYPE_CHECKING:
    from collections.abc import Callable

    from orchestrator.cancel import CancelToken as Cancel


def command_named() -> str | None:
    """The command on the command line: its first word that is no option (the app's own options take no value)."""
    return next((word for word in sys.argv[1:] if not word.startswith("-")), None)


def _exit_on_early_signal(signum: int, frame: object) -> None:
    """A stopping signal before the command has begun (the CLI's imports take half a second on a
    slow host): nothing is locked, started or written yet. Exit as the command would for it, quietly,
    not with a KeyboardInterrupt traceback from inside an import or a death by signal: `serve` with 0,
    its clean stop (systemd counts an exit 143 as a failure), every other command with 128 + n."""
    os._exit(0 if command_named() == "serve" else 128 + signum)


# The handlers the early ones replaced, by signal: what `usual_signal_handlers` puts back.
_EARLY_SIGNALS: dict[int, object] = {}


def install_early_handlers(in_overnight_process: bool) -> None:
    """Only in the `overnight` process itself (the console script, or `python -m orchestrator.cli` as serve
    starts each night): a program that imports the CLI keeps its own handlers. `run` and `serve` replace them
    with their own as their first step; before any other command, `usual_signal_handlers` puts the usual ones
    back. A signal its parent set to be ignored (`sh` does so for a command started with `&`) stays ignored."""
    _EARLY_SIGNALS.update({
        number: handler
        for number in (stopping_signals() if in_overnight_process else ())
        if (handler := signal.getsignal(number)) is not signal.SIG_IGN and handler is not None
    })
    for number in _EARLY_SIGNALS:
        signal.signal(number, _exit_on_early_signal)


def usual_signal_handlers() -> None:
    for number, handler in _EARLY_SIGNALS.items():
        signal.signal(number, handler)


def ignore_stopping_signals() -> None:
    """The command is over and its exit code known, but the interpreter's own teardown still takes a
    moment (seconds on a slow host). A Ctrl-C then was a KeyboardInterrupt in Python's shutdown, or,
    once that has put the default handlers back, a death by SIGINT: exit status -2 to a parent
    process instead of the 130 the night had decided. Ignored, it changes nothing: the process is
    leaving. (SIG_IGN, not a handler of ours: Python's shutdown resets those to the default.)"""
    for number in stopping_signals():
        signal.signal(number, signal.SIG_IGN)


def cancel_on_signals(token: Cancel) -> Callable[[], None]:
    """SIGTERM, Ctrl-C or a closed terminal (SIGHUP) cancels the iterations in flight: rolled back, noted `cancelled`.

    A second Ctrl-C stops at once, for a person who will not wait for the rollback. A signal
    that comes while the deadline winds the night down is a first one: nothing is abandoned,
    and the night ends with the signal's exit code.

    Returns `night_over`, to call once the night's ending is decided. From then on the first signal
    changes nothing: a second Ctrl-C's KeyboardInterrupt in the teardown (the JUnit file, the store,
    the lock) would land wherever the main thread was, a finalizer such as GitPython's Repo.__del__
    included, which prints "Exception ignored ... Traceback". Everything is recorded by then, so the
    next signal ends the process at once, with its own code: a report written into a pipe that nobody
    reads would otherwise hold the process, and the state dir's lock, until SIGKILL. Flags, not
    SIG_IGN: an ignored signal stays ignored in every process started after it.
    """
    import threading

    from orchestrator.cancel import SIGNAL_NAMES

    over, abandoned, once_over = threading.Event(), threading.Event(), threading.Event()

    def cancel(signum: int, frame: object) -> None:
        if abandoned.is_set():
            return
        if over.is_set():
            if once_over.is_set():
                _leave_now(128 + signum)
            once_over.set()
            return
        if token.cancelled and token.why in SIGNAL_NAMES:
            if signum == signal.SIGINT:
                # From here the night is abandoned (`stop_at_once`): a third Ctrl-C landing in that,
                # or in the exit after it, would raise where nothing catches it.
                abandoned.set()
                raise KeyboardInterrupt
            return
        token.cancel(signal.Signals(signum).name, restate=True)

    for number in stopping_signals():
        signal.signal(number, cancel)
    return over.set


def stop_at_once(log: object, run_id: int | None) -> None:
    """A second Ctrl-C: exit 130 now, not after the rollbacks in flight (and the worker threads
    Python would wait for). The next night's recovery rolls them back and records them `interrupted`."""
    if run_id is not None:  # the night's parts log unbound; an event while its run exists carries the run's id (reference.md)
        log = log.bind(run_id=run_id)  # type: ignore[attr-defined]
    log.warning("night_abandoned", why="a second Ctrl-C", exit_code=130)  # type: ignore[attr-defined]
    _leave_now(130)  # a stream closed (`>&-`) or broken must not turn exit 130 into a traceback


def _leave_now(code: int) -> None:
    """Exit at once, from a signal handler: the streams flushed if they can be (one may be mid-write)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
