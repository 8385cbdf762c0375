"""Python's own tracebacks, a bug's and a dying thread's, printed as Python prints them but through a redaction
(orchestrator/redactor.py): an exception's text may quote a secret value (a URL with its token, a server's message),
and stderr goes to cron's mail or a CI log."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import traceback
from typing import Any, Callable, Iterator

from orchestrator.redactor import Redactor


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
    then; with none registered, the hook that was there before ours gets it, the values of runs that ended as *** in it
    (`_with_redacted_exception`). Several may be in at once, and end in any
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
    redact = Redactor.of_forms(forms)
    if hand_on:
        # The values of runs that ended, which the hook we replaced never knew, reach it as *** too: or, where no
        # exception like the thread's can hold them so, it gets nothing and ours prints the traceback.
        handed = hooked if not forms else _with_redacted_exception(hooked, redact)
        if handed is not None:
            replaced(handed)
            return
    if hooked.exc_type is SystemExit:  # as Python's own hook: a thread's sys.exit() is silent
        return
    name = hooked.thread.name if hooked.thread is not None else threading.get_ident()
    _write(redact(f"Exception in thread {name}:\n" + _formatted(hooked)))


def _with_redacted_exception(hooked: Any, redact: Callable[[str], str]) -> Any | None:
    """`hooked` as the hook handed it, or, where its exception quotes one of `redact`'s values (`_readable`), the same with an
    exception like it (`_redacted_exception`) that prints as it does but with those values as ***; None where no such one
    holds none of them (an exception group's members, bytes or a dict among its arguments, an exception that cannot be made
    again or whose text fails)."""
    try:
        if redact(readable := _readable(hooked)) == readable:
            return hooked
        like_value = _redacted_exception(hooked.exc_value, redact, {})
        like = threading.ExceptHookArgs([hooked.exc_type, like_value, hooked.exc_traceback, hooked.thread])
        readable = _readable(like)
    except Exception:  # noqa: BLE001 - ours prints it instead
        return None
    return like if redact(readable) == readable else None


def _readable(hooked: Any) -> str:
    """What a hook may read of a thread's exception besides the frames' variables: its traceback as printed, and the
    arguments and attributes of it and of the exceptions it was raised in, as repr() writes them. Its text alone missed a
    JSONDecodeError's document and a TimeoutExpired's output, which it does not print."""
    seen: set[int] = set()
    pending = [hooked.exc_value]
    parts = [_formatted(hooked)]
    while pending:
        exception = pending.pop()
        if not isinstance(exception, BaseException) or id(exception) in seen:
            continue
        seen.add(id(exception))
        parts += [repr(exception.args), repr(_attributes(exception))]
        pending += [exception.__cause__, exception.__context__, *getattr(exception, "exceptions", ())]
    return "\n".join(parts)


def _attributes(exception: BaseException) -> dict[str, Any]:
    """The attributes of `exception` its `__init__` may have set: its `__dict__` (`__notes__` too), its type's slots, and
    OSError's file names, which it keeps outside both."""
    slots = [name for kind in type(exception).__mro__ for name in _slot_names(kind) if name not in ("__dict__", "__weakref__")]
    files = ("filename", "filename2") if isinstance(exception, OSError) else ()
    return {**{name: getattr(exception, name) for name in [*slots, *files] if hasattr(exception, name)}, **vars(exception)}


def _slot_names(kind: type) -> tuple[str, ...]:
    """The names `kind`'s `__slots__` declares (one string or several)."""
    slots = kind.__dict__.get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


def _redacted_exception(exception: BaseException | None, redact: Callable[[str], str], made: dict[int, Any]) -> Any:
    """An exception that `isinstance` and a traceback take for `exception` (its type's name, module, traceback, the
    exceptions it was raised in, the same way redacted; its attributes), with its text, arguments and notes through `redact`:
    an instance of a subclass of its type named as it is, for the exception itself may be held elsewhere still."""
    if exception is None or id(exception) in made:
        return made.get(id(exception))
    kind = type(exception)
    text = redact(str(exception))
    named_as_it = {"__module__": kind.__module__, "__qualname__": kind.__qualname__}
    like_kind = type(kind.__name__, (kind,), {"__slots__": (), "__str__": lambda _: text, **named_as_it})
    arguments = tuple(_redacted_value(redact, argument) for argument in exception.args)
    like = kind.__new__(like_kind, *arguments)  # its type's own `__new__` (OSError's reads them), no `__init__` to run
    made[id(exception)] = like
    for name, value in _attributes(exception).items():
        setattr(like, name, _redacted_value(redact, value))
    like.args = arguments
    like.__traceback__ = exception.__traceback__
    like.__cause__ = _redacted_exception(exception.__cause__, redact, made)
    like.__context__ = _redacted_exception(exception.__context__, redact, made)
    like.__suppress_context__ = exception.__suppress_context__
    return like


def _redacted_value(redact: Callable[[str], str], value: Any) -> Any:
    """`value` through `redact` where it is a string or a list of them (`__notes__`), else as it is."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return [redact(item) for item in value]
    return value


def _formatted(hooked: Any) -> str:
    """The traceback of a thread's exception as Python's own hook prints it."""
    return "".join(traceback.format_exception(hooked.exc_type, hooked.exc_value, hooked.exc_traceback))


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
