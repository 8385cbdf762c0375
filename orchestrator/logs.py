"""Structured logs: human lines on a terminal, JSON lines for cron and CI.

Event names are stable (`night_started`, `iteration_rolled_back`, ...): tests
and log pipelines match on them. Every event carries the run, task and
iteration ids bound where they become known.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import warnings
from typing import Any, TextIO

import structlog

from orchestrator.printable import visible

LOG_FORMATS = ("auto", "human", "json")
_json_mode = False
_json_asked = False
# Python's own way of showing a warning: two plain lines on stderr.
_PLAIN_SHOWWARNING = warnings.showwarning


def json_mode() -> bool:
    """Whether logs go out as JSON lines (asked for, or stderr is not a terminal)."""
    return _json_mode


def json_only() -> bool:
    """Whether `--log-format json` was asked for: then stderr carries nothing but JSON lines, errors included."""
    return _json_asked


def configure_logging(log_format: str = "auto", *, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    global _json_mode, _json_asked
    stream = stream or sys.stderr
    as_json = log_format == "json" or (log_format == "auto" and not (hasattr(stream, "isatty") and stream.isatty()))
    _json_mode, _json_asked = as_json, log_format == "json"
    # Plain tracebacks: structlog's default, rich's, prints every frame's local variables,
    # and among them the model's api_key.
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info if as_json else structlog.dev.set_exc_info,
            *([] if as_json else [_shown_not_obeyed]),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Looked up when a logger is made, not now: stderr may be replaced later (tests, daemons).
        logger_factory=(
            (lambda *_: _LineLogger(lossy(sys.stderr))) if stream is sys.stderr else (lambda *_: _LineLogger(lossy(stream)))
        ),
        cache_logger_on_first_use=False,
    )
    # A library's warning (or one PYTHONWARNINGS or -X dev shows) would be the one plain line among the JSON ones.
    if as_json:
        warnings.showwarning = _warning_as_event
    elif warnings.showwarning is _warning_as_event:
        warnings.showwarning = _PLAIN_SHOWWARNING


def _add_log_level(logger: Any, method_name: str, event_dict: Any) -> Any:
    """structlog's add_log_level, but an event's own `level` stays: a `signal` event's is the
    signal's, `warning` or `severe`, as the report says it."""
    if "level" in event_dict:
        return event_dict
    return structlog.processors.add_log_level(logger, method_name, event_dict)


# What makes the console renderer write a value as its repr (ConsoleRenderer._repr), which escapes every control character.
_REPR_WRITTEN = frozenset(" \t=\r\n\"'")
# The keys it writes as they are, whatever they hold.
_WRITTEN_AS_IS = frozenset({"event", "timestamp", "level", "logger", "logger_name"})


def _shown_not_obeyed(logger: Any, method_name: str, event_dict: Any) -> Any:
    """A human line's values with their control characters as escapes (printable.visible). The console renderer prints a
    value with no space or quote in it as it is: a folder the model's code named `y\x1b[2J\x1b[8m` in the state dir
    cleared the terminal and hid every line after it. JSON lines escape them already; a traceback keeps its lines."""
    return {key: _shown(key, value) if isinstance(value, str) else value for key, value in event_dict.items()}


def _shown(key: str, value: str) -> str:
    if key == "exception":
        return visible(value, keep="\n")
    if key not in _WRITTEN_AS_IS and not _REPR_WRITTEN.isdisjoint(value):
        return value  # its repr escapes them: escaped here as well, a git error's line break read `\\n`
    return visible(value)


def _warning_as_event(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
                      line: str | None = None) -> None:
    """warnings.showwarning in JSON mode: the warning as the event `python_warning`; one written to a file of
    its own choosing (a caller's explicit `file`) goes there as Python writes it."""
    if file is not None:
        _PLAIN_SHOWWARNING(message, category, filename, lineno, file, line)
        return
    get_logger().warning("python_warning", category=category.__name__, message=str(message), where=f"{filename}:{lineno}")


# Whether this thread is writing a log line now, and the lines it logged meanwhile.
_writing = threading.local()


class _LineLogger(structlog.PrintLogger):
    """structlog's PrintLogger, but a line logged while this same thread writes one is written after it. The write lock
    is not reentrant: a garbage collection in the write (a library's client in a reference cycle, its socket never
    closed) logged its ResourceWarning as `python_warning` there, waited on its own lock, and the night hung."""

    def msg(self, message: str) -> None:
        if getattr(_writing, "line", False):
            _writing.held.append(message)
            return
        _writing.line, _writing.held = True, [message]
        try:
            while _writing.held:
                super().msg(_writing.held.pop(0))
        finally:
            _writing.line = False

    log = debug = info = warn = warning = fatal = failure = err = error = critical = exception = msg


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("overnight").bind(**bound)


@functools.lru_cache(maxsize=8)  # one wrapper per stream: structlog keeps one write lock per file object
def lossy(stream: TextIO | None) -> "_LossyStream":
    """`stream`, for lines that may be lost but must never raise (see _LossyStream)."""
    return _LossyStream(stream)


class _LossyStream:
    """A log stream whose reader may go away mid-night: a closed terminal, `| head`, a dead collector.

    Losing log lines must not stop a night: the run store, notes.md and the transcripts
    still hold its account. The first failed write sends the stream's file descriptor to
    /dev/null, so that later lines, and the interpreter's own flush at exit, cost nothing
    and fail no more.
    """

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:  # started with stderr closed (`2>&-`): Python's sys.stderr is None
            return len(text)
        try:
            return self._stream.write(text)
        except OSError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except OSError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        try:
            descriptor = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return  # no file descriptor behind it (a StringIO): the lines are dropped
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, descriptor)
        finally:
            os.close(devnull)
