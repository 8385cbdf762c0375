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

from orchestrator.secrecy import Redactor


def print_redacted(bug: BaseException, redact: Callable[[str], str]) -> None:
    """`bug`'s traceback on stderr as Python prints it (the exceptions it was raised in included), through `redact`."""
    _write(redact("".join(traceback.format_exception(bug))))


# The redactions of the runs under way in this process (several when an embedding caller or a test runs nights at once),
# and what `entry` keeps for the process's life: a dying thread's traceback goes through all of them.
_registered: list[Redactor] = []
# The forms of the values of every redaction that is no longer registered (a night's, once over), for the process's life:
# a thread of a night's may die after it (one a user's guard started, joined as the interpreter exits) quoting the config's
# api_key or the store's password, which `entry`'s redaction of the environment does not hold. Strings only, never a
# night's objects; insertion-ordered, the oldest forgotten past _OUTLIVED_CHARS (a long-lived caller's thousandth night).
_outlived: dict[str, None] = {}
_OUTLIVED_CHARS = 1 << 20
_registry_lock = threading.Lock()


@contextlib.contextmanager
def thread_tracebacks_redacted(redact: Redactor) -> Iterator[None]:
    """Inside, an exception that ends a thread (threading.excepthook: the run store's event writer, the deadline watcher,
    a lease's heartbeat, the embedded model's watcher, a thread a user's guard starts) prints as Python's own hook
    prints it, `Exception in thread NAME:` and the traceback, through `redact` and every other redaction registered
    then; with none registered, the hook that was there before ours gets it. Several may be in at once, and end in any
    order: one process-wide hook reads the registry (a hook put back on exit would undo another's), installed again only
    when another has replaced it, and handing on to the hook it replaced itself. After, `redact`'s values stay redacted
    in the tracebacks our hook prints for the process's life (a thread may outlive its night), and our hook prints them
    even with none registered when the hook it replaced is Python's own, which would print them as they are."""
    _register(redact)
    try:
        yield
    finally:
        with _registry_lock:
            _registered.remove(redact)
            _remember(redact.values)


def keep_thread_tracebacks_redacted(redact: Redactor) -> None:
    """`thread_tracebacks_redacted` for the rest of the process: `entry`'s, for a thread that dies after it returned
    (one still running when the interpreter exits and joins it)."""
    _register(redact)


def _register(redact: Redactor) -> None:
    with _registry_lock:
        # Again each time: another may have set its own hook since (a test's monkeypatch, a caller's).
        if getattr(threading.excepthook, "func", None) is not _print_thread_traceback:
            # Each install keeps the hook it replaced: one global would go stale when that hook's setter puts ours back,
            # or loop with a hook that hands on to ours.
            threading.excepthook = functools.partial(_print_thread_traceback, replaced=threading.excepthook)
        _registered.append(redact)


def _remember(forms: tuple[str, ...]) -> None:
    """`forms` into `_outlived`, the latest last; under `_registry_lock`."""
    for form in forms:
        _outlived.pop(form, None)
        _outlived[form] = None
    held = sum(map(len, _outlived))
    while held > _OUTLIVED_CHARS:
        oldest = next(iter(_outlived))
        del _outlived[oldest]
        held -= len(oldest)


def _print_thread_traceback(hooked: Any, *, replaced: Callable[[Any], object]) -> None:
    with _registry_lock:
        # One redaction of all, longest first across them: a night's api_key holding an environment's value is replaced
        # whole, not around that value's *** by the environment's redaction first.
        forms = [*(form for redact in _registered for form in redact.values), *_outlived]
        hand_on = not _registered and (not _outlived or replaced is not threading.__excepthook__)
    if hand_on:
        replaced(hooked)
        return
    if hooked.exc_type is SystemExit:  # as Python's own hook: a thread's sys.exit() is silent
        return
    name = hooked.thread.name if hooked.thread is not None else threading.get_ident()
    text = f"Exception in thread {name}:\n" + "".join(traceback.format_exception(hooked.exc_type, hooked.exc_value, hooked.exc_traceback))
    _write(Redactor.of_forms(forms)(text))


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
