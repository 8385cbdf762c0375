"""Python's own tracebacks, a bug's and a dying thread's, printed as Python prints them but through a redaction
(orchestrator/secrecy.py): an exception's text may quote a secret value (a URL with its token, a server's message),
and stderr goes to cron's mail or a CI log."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import traceback
from typing import Any, Callable, Iterator


def print_redacted(bug: BaseException, redact: Callable[[str], str]) -> None:
    """`bug`'s traceback on stderr as Python prints it (the exceptions it was raised in included), through `redact`."""
    _write(redact("".join(traceback.format_exception(bug))))


@contextlib.contextmanager
def thread_tracebacks_redacted(redact: Callable[[str], str]) -> Iterator[None]:
    """Inside, an exception that ends a thread (threading.excepthook: the run store's event writer, the deadline watcher,
    a lease's heartbeat, the embedded model's watcher, a thread a user's guard starts) prints as Python's own hook
    prints it, `Exception in thread NAME:` and the traceback, through `redact`; the hook before is put back after."""
    before = threading.excepthook
    threading.excepthook = functools.partial(_print_thread_traceback, redact=redact)
    try:
        yield
    finally:
        threading.excepthook = before


def _print_thread_traceback(hooked: Any, *, redact: Callable[[str], str]) -> None:
    if hooked.exc_type is SystemExit:  # as Python's own hook: a thread's sys.exit() is silent
        return
    name = hooked.thread.name if hooked.thread is not None else threading.get_ident()
    lines = traceback.format_exception(hooked.exc_type, hooked.exc_value, hooked.exc_traceback)
    _write(redact(f"Exception in thread {name}:\n" + "".join(lines)))


def _write(text: str) -> None:
    """`text` on stderr as the night's log lines go there (orchestrator.logs.lossy: a reader gone is no new failure), or
    on sys.stderr itself when that cannot be imported: the logging library may be the broken install being reported."""
    if sys.stderr is None:  # started with stderr closed (`2>&-`)
        return
    try:
        from orchestrator.logs import lossy
    except Exception:  # noqa: BLE001 - whatever the import raised, the traceback must still be printed
        stream: Any = sys.stderr
    else:
        stream = lossy(sys.stderr)
    print(text, end="", file=stream, flush=True)
