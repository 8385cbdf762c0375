"""How the `overnight` process ends: our errors mapped once to one stderr line and a documented exit code, never a
traceback; a bug's traceback (exit 1) with the secret values known as ***; a reader gone from stdout, exit 141.

`orchestrator/cli.py`'s `entry` and `main` call `exit_quietly` and `run_command` with its commands.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import TYPE_CHECKING

import typer

from orchestrator.errors import Cancelled, ConfigError, ModelUnreachable, StateError
from orchestrator.lock import EXIT_LOCKED, LockHeld
from orchestrator.process_signals import command_named, ignore_stopping_signals

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

EXIT_USAGE = ConfigError.exit_code
EXIT_STATE = StateError.exit_code
EXIT_MODEL_UNREACHABLE = ModelUnreachable.exit_code


def exit_quietly(main: Callable[[], None]) -> None:
    """The `overnight` process: main(), then a quiet exit with its code. A bug (an exception nothing maps to a
    code) prints its traceback and exits 1, as Python would, and so does an exception that ends a thread (without
    the exit), both with the secret values known as ***: the night's, or before its config was read, the
    environment's (orchestrator/redactor.py)."""
    from orchestrator.redactor import Redactor
    from orchestrator.tracebacks import keep_thread_tracebacks_redacted, print_redacted

    environments = Redactor.for_night()
    # For the process's life: a thread may die after entry returned (joined as the interpreter exits). A night's
    # `run` adds its own for its time.
    keep_thread_tracebacks_redacted(environments)
    try:
        main()
    except SystemExit:
        ignore_stopping_signals()
        raise
    except KeyboardInterrupt:  # a second Ctrl-C while main was mapping its ending to a code
        ignore_stopping_signals()
        sys.exit(130)
    except BaseException as bug:
        ignore_stopping_signals()
        print_redacted(bug, getattr(bug, _NIGHTS_REDACTION, environments))
        sys.exit(1)


@contextlib.contextmanager
def errors_redacted(settings: object) -> Iterator[None]:
    """What ends a night in error, with the night's secret values as ***: the one-line error (exit 2 or 4), which may
    quote git's message (a filter's, say, that printed a token) or a path named after one, and a bug's traceback (exit 1,
    printed by `exit_quietly`), whose exception may quote one too; and the traceback of an exception that ends a thread
    of the night's (the event writer, the deadline watcher, a lease's heartbeat...). All go to cron's mail or a CI log."""
    from orchestrator.redactor import Redactor
    from orchestrator.tracebacks import thread_tracebacks_redacted

    redact = Redactor.for_config(settings)
    try:
        with thread_tracebacks_redacted(redact):
            yield
    except (ConfigError, StateError) as failed:
        failed.args = (redact(str(failed)),)  # what run_command's one line (str of the error) shows
        raise
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as ended:  # maybe a bug: `exit_quietly` prints its traceback through the redaction if nothing maps it
        with contextlib.suppress(Exception):  # an exception class that refuses attributes keeps Python's own traceback
            setattr(ended, _NIGHTS_REDACTION, redact)
        raise


# The attribute by which an exception out of a night carries the night's redaction to `exit_quietly` (typer marks
# exceptions the same way for its own traceback printing).
_NIGHTS_REDACTION = "_overnight_nights_redaction"


def run_command(app: typer.Typer) -> None:
    """Run the command: map our errors to one stderr line and an exit code (SystemExit)."""
    # Inherited from a git hook or a shell's dotfiles, they would send every git command of
    # overnight's (GitPython's too) to that repository instead of the configured one.
    from orchestrator.command_environment import INHERITED_GIT_VARIABLES

    for name in INHERITED_GIT_VARIABLES:
        os.environ.pop(name, None)
    _keep_closed_descriptors_taken()
    started_with = sys.stdout  # None: the process started with stdout closed (`overnight report >&-`)
    if started_with is None and command_named() == "demo" and "--help" not in sys.argv[1:]:
        fail(f"cannot write to stdout: {_CLOSED}; the demo prints its report there", EXIT_USAGE)
    watch = _StdoutWatch(started_with if started_with is not None else _ClosedStdout()) if _prints_no_night() else None
    if watch is not None:
        sys.stdout = watch  # type: ignore[assignment]
    try:
        _run_app(app)
    except _ReaderGone:  # also from the help printed for `overnight` alone, in an except clause of _run_app
        _reader_gone()
    except _StdoutUnwritable as failed:
        _stdout_to_devnull()
        fail(f"cannot write to stdout: {failed.reason}", EXIT_USAGE)
    finally:
        if watch is not None and sys.stdout is watch:  # main() called in a process that goes on (a test)
            sys.stdout = started_with


def _run_app(app: typer.Typer) -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    except LockHeld as exc:
        fail(str(exc), EXIT_LOCKED)
    except StateError as exc:
        fail(str(exc), EXIT_STATE)
    except ModelUnreachable as exc:  # the embedded model server could not be started: no night ran
        fail(str(exc), EXIT_MODEL_UNREACHABLE)
    except Cancelled as stop:
        from orchestrator.night_end import EXIT_SIGINT, SIGNAL_EXIT_CODES

        sys.exit(SIGNAL_EXIT_CODES.get(stop.why, EXIT_SIGINT))
    except KeyboardInterrupt:
        sys.exit(130)
    except (typer.Abort, EOFError):
        fail("aborted", 1)
    except Exception as exc:
        if not _is_usage_error(exc):
            raise
        context = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and context is not None:
            typer.echo(context.get_help())  # `overnight` alone: the help, as `overnight --help`
            sys.exit(0)
        hint = f" (see `{context.command_path} --help`)" if context is not None else ""
        fail(exc.format_message() + hint, exc.exit_code)


# Commands that run a night: what they print on stdout (the demo's progress) is written from inside it,
# where an exception of ours must not land; their account is the run store's.
_NIGHTS = frozenset({"run", "demo"})
EXIT_READER_GONE = 128 + signal.SIGPIPE  # 141, as a shell reports a command that SIGPIPE ended


def _prints_no_night() -> bool:
    """Any command but a night's, and a night command asked only for its help (`overnight run --help | head`)."""
    return command_named() not in _NIGHTS or "--help" in sys.argv[1:]


class _ReaderGone(Exception):
    """stdout's reader went away (`overnight report | head -1`). No OSError: click takes a broken pipe
    for its own and exits 1, silently, which reads as "no runs recorded yet" from `report`."""


class _StdoutUnwritable(Exception):
    """stdout refused what was written for another reason than a reader gone: `report --json > r.json` on a full disk
    (ENOSPC), a file on a failing or read-only one. No OSError, for the same reason as _ReaderGone."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.reason = error.strerror or str(error)


class _StdoutWatch:
    """sys.stdout, whose write or flush into a pipe nobody reads any more raises _ReaderGone, and into a file that
    cannot take it, _StdoutUnwritable (it was a traceback, exit 1)."""

    def __init__(self, stream: object) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)  # type: ignore[attr-defined]
        except BrokenPipeError:
            raise _ReaderGone from None
        except OSError as error:
            raise _StdoutUnwritable(error) from None

    def flush(self) -> None:
        try:
            self.stream.flush()  # type: ignore[attr-defined]
        except BrokenPipeError:
            raise _ReaderGone from None
        except OSError as error:
            raise _StdoutUnwritable(error) from None

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


_CLOSED = "it is closed"


class _ClosedStdout:
    """sys.stdout for a process started with stdout closed, where Python leaves None and every print and echo went
    nowhere, exit 0 (`overnight report >&-` in a crontab lost the report, unsaid): a write fails as one into a
    closed descriptor does, and the watch around it makes that one line, exit 2, as for a full disk."""

    encoding, errors = "utf-8", "strict"

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, _CLOSED)

    def flush(self) -> None:
        """Nothing was written, nothing waits."""

    def isatty(self) -> bool:
        return False


def _keep_closed_descriptors_taken() -> None:
    """/dev/null put where stdout or stderr is closed (`>&-`, `2>&-`): the next file opened (the state dir's lock,
    say) would otherwise get that number, and what writes there (stdout sent to /dev/null once a write failed, a
    child's output) would go into that file."""
    for descriptor in (1, 2):
        try:
            os.fstat(descriptor)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)  # the lowest free number: maybe this one
            if devnull != descriptor:
                os.dup2(devnull, descriptor)
                os.close(devnull)
            os.set_inheritable(descriptor, True)


def _reader_gone() -> None:
    """Exit 141, quietly, as `git log | head` does: the reader asked for no more. What the command did
    (gc's removals) is done; only its output is cut short. stdout's descriptor goes to /dev/null first:
    the interpreter's own flush at exit would otherwise fail again, with a message and exit 120."""
    _stdout_to_devnull()
    sys.exit(EXIT_READER_GONE)


def _stdout_to_devnull() -> None:
    """What is left in stdout's buffer goes nowhere: the interpreter's flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
    finally:
        os.close(devnull)


def _is_usage_error(exc: Exception) -> bool:
    """A click exception (a bad option, a missing value), which carries its own exit code.

    Recognised by shape: typer raises them from click, or (typer >= 0.22) from its own copy of click.
    """
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def fail(message: str, code: int) -> None:
    """Exit `code` with `message` as one line on stderr (a JSON event with --log-format json)."""
    from orchestrator.logs import get_logger, json_only, lossy

    if json_only():  # --log-format json: stderr stays parseable to its end
        get_logger().error("command_failed", error=message, exit_code=code)
    else:
        print(f"overnight: error: {_one_line(message)}", file=lossy(sys.stderr), flush=True)
    sys.exit(code)


def _one_line(message: str) -> str:
    """`message` with control characters and line separators escaped (a newline in a path as \\n):
    the error stays one line for cron's mail and a log collector."""
    import unicodedata

    return "".join(
        char.encode("unicode_escape").decode("ascii") if unicodedata.category(char) in ("Cc", "Zl", "Zp") else char
        for char in message
    )
