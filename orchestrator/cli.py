"""`overnight`: a thin CLI. Each command loads the config, builds objects, calls one function.

Errors are handled once, in `main`: one line on stderr and a documented exit
code, never a traceback. Only a bug prints one (`entry`), exit 1. Heavy imports (litellm, SQLAlchemy, GitPython) happen
inside commands so that `overnight --help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cancel import stopping_signals  # light: the standard library only


def _exit_on_early_signal(signum: int, frame: object) -> None:
    """A stopping signal before the command has begun (this module's imports take half a second on a
    slow host): nothing is locked, started or written yet. Exit as the command would for it, quietly,
    not with a KeyboardInterrupt traceback from inside an import or a death by signal: `serve` with 0,
    its clean stop (systemd counts an exit 143 as a failure), every other command with 128 + n."""
    os._exit(0 if _command_named() == "serve" else 128 + signum)


def _command_named() -> str | None:
    """The command on the command line: its first word that is no option (the app's own options take no value)."""
    return next((word for word in sys.argv[1:] if not word.startswith("-")), None)


# Only in the `overnight` process itself (the console script, or `python -m orchestrator.cli` as serve
# starts each night): a program that imports this module keeps its own handlers. `run` and `serve`
# replace them with their own as their first step; before any other command, `_usual_signals` puts the
# usual ones back. A signal its parent set to be ignored (`sh` does so for a command started with `&`)
# stays ignored.
_EARLY_SIGNALS = {
    number: handler
    for number in (stopping_signals() if __name__ == "__main__" or Path(sys.argv[0]).name == "overnight" else ())
    if (handler := signal.getsignal(number)) is not signal.SIG_IGN and handler is not None
}
for _number in _EARLY_SIGNALS:
    signal.signal(_number, _exit_on_early_signal)

import typer  # noqa: E402  (after the early handlers: the imports below are the slow part)

from orchestrator.config import DEFAULT_CONFIG_NAME  # noqa: E402
from orchestrator.errors import Cancelled, ConfigError, ModelUnreachable, StateError  # noqa: E402
from orchestrator.lock import EXIT_LOCKED, LockHeld  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from datetime import datetime

    from orchestrator.cancel import CancelToken as Cancel

EXIT_USAGE = ConfigError.exit_code
EXIT_STATE = StateError.exit_code
EXIT_NO_RUNS = 1  # `report` before this state dir's first night
EXIT_MODEL_UNREACHABLE = ModelUnreachable.exit_code

app = typer.Typer(
    name="overnight",
    help="Run coding agents on small local models overnight, and keep them honest.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Commands that replace the early handlers with their own as their first step: until then, the early ones stay.
_OWN_SIGNAL_HANDLING = frozenset({"run", "serve"})


@app.callback()
def _usual_signals(context: typer.Context) -> None:
    # Runs after the command line is parsed, before the command. Put back in `main`, the usual handlers
    # left `run` a window (typer's dispatch, a few milliseconds) in which a SIGTERM was a death by signal.
    if context.invoked_subcommand not in _OWN_SIGNAL_HANDLING:
        _usual_signal_handlers()


def _usual_signal_handlers() -> None:
    for number, handler in _EARLY_SIGNALS.items():
        signal.signal(number, handler)


ConfigOption = typer.Option(Path(DEFAULT_CONFIG_NAME), "--config", "-c", help="Path to overnight.toml.")


@app.command()
def init(
    config: Path = ConfigOption,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing config file."),
) -> None:
    """Write overnight.toml from the commented example (every key, its default, why to change it)."""
    import stat

    from orchestrator.config import example_config_text
    from orchestrator.files import looked_up

    _refuse_a_folder_git_keeps_or_inside_a_checkout(config)
    found = looked_up(config, ConfigError, "config file")
    if found is not None and not stat.S_ISREG(found.st_mode):  # a pipe would take the example and block; a device or folder is no config
        raise ConfigError(f"cannot write {config}: it is not a regular file (a folder, a pipe or a device)")
    if found is not None and not force:
        raise ConfigError(f"{config} already exists (use --force to overwrite)")
    try:
        _replace_file(config, example_config_text().encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot write {config}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {config}: add your tasks, point [model] at a server, then `overnight run`")


def _refuse_a_folder_git_keeps_or_inside_a_checkout(config: Path) -> None:
    """ConfigError when `config`'s folder is not the top of a checkout git finds there. Inside a git folder (a
    checkout's `.git`, a worktree's folder in it, a bare repository) the example would lie among git's own files,
    its `[repo] path = "."` naming no checkout. Inside a checkout but not at its top, that path would name the
    folder, and `run` refuses it (exit 2) only once the tasks are written. Where git cannot tell (not on PATH,
    broken, a repository it refuses as another user's) nothing is judged, and nothing is refused."""
    from orchestrator.checkout import checkout_around, git_folder_around
    from orchestrator.files import absolute

    folder = absolute(config, ConfigError, "cannot write").parent
    git_folder = git_folder_around(folder)
    if git_folder is not None:
        raise ConfigError(
            f"{folder} is inside the git folder {git_folder}, where git keeps its own files: "
            f"run `overnight init` at the top of a checkout (a night works on the whole repository)"
        )
    top = checkout_around(folder)
    if top is not None:
        raise ConfigError(
            f"{folder} is a folder inside the git repository at {top}, and the config's [repo] path \".\" would name it: "
            f"run `overnight init` there (a night works on the whole repository)"
        )


def _replace_file(path: Path, data: bytes) -> None:
    """`path` holds `data` whole, or stays as it was: a full disk must not leave half a config
    where the user's was (through a symlink, the file it names gets it), with the old file's mode
    and, where we may, its owner. A folder we may not write in, holding a file we may, is written
    in place."""
    import os

    from orchestrator.files import replace_file, write_over

    target = Path(os.path.realpath(path))
    old = target.stat() if target.is_file() else None
    try:
        if old is None:
            replace_file(target, data)
        else:  # root's init --force on a user's file leaves it the user's
            replace_file(target, data, mode=old.st_mode & 0o7777, owner=(old.st_uid, old.st_gid))
    except PermissionError:
        if old is None:
            raise
        fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
        try:
            write_over(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


@app.command()
def run(
    config: Path = ConfigOption,
    log_format: str = typer.Option("auto", "--log-format", help="auto (human on a terminal, else json), human or json."),
    junit: Path | None = typer.Option(None, "--junit", help="Also write a JUnit XML report here (a task = a test case)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also log every model call and tool call."),
    scheduled_for: str | None = typer.Option(
        None, "--scheduled-for", hidden=True,
        help="Set by `serve`: the fire time (ISO 8601, with its offset) of the scheduled night this run is; "
        "tasks this state dir's runs since then finished are not worked again, and their tokens count.",
    ),
) -> None:
    """Work through the tasks tonight.

    Exit 0 all succeeded, 1 some did not, 2 bad config, 3 model unreachable,
    4 state dir unusable, 75 another run holds the state dir,
    129/130/143 cancelled (SIGHUP/SIGINT/SIGTERM).
    """
    from orchestrator.cancel import CancelToken

    # First of all: a SIGTERM while the night starts up (imports, config, lock, the model) must not
    # kill the process half way; the night then begins cancelled, records its tasks as such and
    # ends with the signal's exit code.
    cancel = CancelToken()
    night_over = _cancel_on_signals(cancel)

    import logging

    from orchestrator.build import check_inputs, night_parts
    from orchestrator.config import load_config
    from orchestrator.lock import StateLock
    from orchestrator.logs import configure_logging
    from orchestrator.night import run_night
    from orchestrator.recovery import recover_interrupted

    _check_log_format(log_format)
    # First: with --log-format json, even a broken config is reported as a JSON line.
    configure_logging(log_format, level=logging.DEBUG if verbose else logging.INFO)
    fire_time = _fire_time(scheduled_for) if scheduled_for is not None else None
    _require_git()
    if junit is not None:
        _check_writable(junit, "--junit")
    settings = load_config(config)
    with _errors_redacted(settings):
        checked = check_inputs(settings)  # a bad repo, base or guard: exit 2 before the state dir is made
        if junit is not None:
            _check_not_ours(junit, "--junit", settings, checked.repo)
        summary_refused = _summary_refused(settings, checked.repo)
        with StateLock(settings.state_dir) as lock, night_parts(settings, checked, cancel) as parts:
            parts = dataclasses.replace(parts, check_lock=lock.check_still_held, scheduled_for=fire_time)
            recover_interrupted(parts.store, settings, parts.log)
            _trim_transcripts(settings, parts.log)
            _trim_runs(settings, parts.store, parts.log, since=fire_time)
            try:
                result = run_night(parts)
            except KeyboardInterrupt:
                _stop_at_once(parts.log, parts.store.begun_run_id)
            finally:
                night_over()
                _publish_for_ci(parts.store, junit, notes=settings.notes_path, log=parts.log, summary_refused=summary_refused)
    raise typer.Exit(result.exit_code)


@contextlib.contextmanager
def _errors_redacted(settings: object) -> Iterator[None]:
    """What ends a night in error, with the night's secret values as ***: the one-line error (exit 2 or 4), which may
    quote git's message (a filter's, say, that printed a token) or a path named after one, and a bug's traceback (exit 1,
    printed by `entry`), whose exception may quote one too; and the traceback of an exception that ends a thread of
    the night's (the event writer, the deadline watcher, a lease's heartbeat...). All go to cron's mail or a CI log."""
    from orchestrator.secrecy import Redactor
    from orchestrator.tracebacks import thread_tracebacks_redacted

    redact = Redactor.for_config(settings)
    try:
        with thread_tracebacks_redacted(redact):
            yield
    except (ConfigError, StateError) as failed:
        failed.args = (redact(str(failed)),)  # what main()'s one line (str of the error) shows
        raise
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as ended:  # maybe a bug: `entry` prints its traceback through the redaction if nothing maps it
        with contextlib.suppress(Exception):  # an exception class that refuses attributes keeps Python's own traceback
            setattr(ended, _NIGHTS_REDACTION, redact)
        raise


# The attribute by which an exception out of a night carries the night's redaction to `entry` (typer marks
# exceptions the same way for its own traceback printing).
_NIGHTS_REDACTION = "_overnight_nights_redaction"


def _fire_time(text: str) -> datetime:
    from datetime import datetime

    try:
        when = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        when = None
    if when is None or when.tzinfo is None:
        raise ConfigError(f"--scheduled-for: {text!r} is not an ISO 8601 time with its UTC offset, like 2026-12-02T01:30:00+00:00")
    if _utc_year(when) not in _FIRE_YEARS:
        # A time the run store cannot hold (year 1 at +05:00 is before year 1 in UTC) is as bad as none, but
        # it is a time: "not an ISO 8601 time with its offset" sent the reader looking for a typo.
        raise ConfigError(
            f"--scheduled-for: {text!r} is out of range: in UTC it must fall in the years {_FIRE_YEARS[0]} to {_FIRE_YEARS[-1]}"
        )
    return when


# The years a fire time may fall in, in UTC: what the run store holds.
_FIRE_YEARS = range(1970, 9999)


def _utc_year(when: datetime) -> int | None:
    """The year of `when` in UTC; None past the calendar's ends (9999-12-31T23:59:59-14:00 is in year 10000 there)."""
    from datetime import timezone

    try:
        return when.astimezone(timezone.utc).year
    except OverflowError:
        return None


def _stop_at_once(log: object, run_id: int | None) -> None:
    """A second Ctrl-C: exit 130 now, not after the rollbacks in flight (and the worker threads
    Python would wait for). The next night's recovery rolls them back and records them `interrupted`."""
    if run_id is not None:  # the night's parts log unbound; an event while its run exists carries the run's id (reference.md)
        log = log.bind(run_id=run_id)  # type: ignore[attr-defined]
    log.warning("night_abandoned", why="a second Ctrl-C", exit_code=130)  # type: ignore[attr-defined]
    _leave_now(130)  # a stream closed (`>&-`) or broken must not turn exit 130 into a traceback


def _require_git() -> None:
    """git on PATH, before anything imports GitPython (whose import fails with a 20-line banner
    without it) or runs it: cron's PATH may lack git's folder."""
    import os
    import shutil

    if shutil.which("git") is None:
        raise ConfigError(f"git not found on PATH (PATH={os.environ.get('PATH', '')}); install git or add its folder to PATH")


def _check_writable(path: Path, option: str) -> None:
    """Before the night, not after it: a report that cannot be written is found out at once."""
    import os
    import stat

    from orchestrator.files import looked_up

    folder = path.parent  # Path("x.xml").parent is Path("."): never empty
    found, folder_found = looked_up(path, ConfigError, option), looked_up(folder, ConfigError, option)
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"{option} {path}: is a folder")
    if folder_found is None or not stat.S_ISDIR(folder_found.st_mode):
        raise ConfigError(f"{option} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{option} {path}: {folder} is not writable")


def _check_not_ours(path: Path, option: str, settings: object, repo: object) -> None:
    """A report must not be written over the config, anything in the state dir (notes.md),
    the run store, wherever `[store] url` puts it, or the repository's .git (its config, its refs)."""
    import os

    from runs.engine import sqlite_files

    target = Path(os.path.realpath(path))
    if target == Path(os.path.realpath(settings.source)):  # type: ignore[attr-defined]
        raise ConfigError(f"{option} {path}: is the config file")
    for git_dir in {Path(os.path.realpath(repo.git_dir)), Path(os.path.realpath(repo.common_dir))}:  # type: ignore[attr-defined]
        if target.is_relative_to(git_dir):
            raise ConfigError(f"{option} {path}: is inside the repository's git folder {git_dir}")
    if target.is_relative_to(settings.state_dir):  # type: ignore[attr-defined]
        raise ConfigError(f"{option} {path}: is inside the state dir {settings.state_dir}")  # type: ignore[attr-defined]
    if target in {Path(os.path.realpath(file)) for file in sqlite_files(settings.store_url)}:  # type: ignore[attr-defined]
        raise ConfigError(f"{option} {path}: is the run store ([store] url)")


def _summary_refused(settings: object, repo: object) -> str:
    """Why $GITHUB_STEP_SUMMARY will not be appended to, or "": it names one of our own files (the
    config, notes.md, the run store), where the summary would break the next night. GitHub's to get
    right, like its other failures: the night runs, and the log says what was not written."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        if summary:
            _check_not_ours(Path(summary), "$GITHUB_STEP_SUMMARY", settings, repo)
    except ConfigError as refused:
        return f"not appending the step summary: {refused}"
    return ""


def _publish_for_ci(store: object, junit: Path | None, *, notes: Path, log: object, summary_refused: str = "") -> None:
    """The JUnit file and the GitHub step summary, from what the store recorded; also after a cancel.

    A failure here (a disk filled in the night, an unwritable $GITHUB_STEP_SUMMARY) is logged,
    and the exit code stays the night's: 143 must still say SIGTERM, 1 still say a task failed.
    """
    from orchestrator.ci_summary import append_step_summary
    from orchestrator.junit import write_junit

    begun = store.begun_run_id  # type: ignore[attr-defined]
    # This night's run: in a store several state dirs share, the latest may be another machine's.
    night_run = store.run(begun) if begun is not None else None  # type: ignore[attr-defined]
    if night_run is None:
        return
    publishers = [] if summary_refused else [lambda: append_step_summary(night_run, notes=notes)]
    if summary_refused:
        log.error("ci_report_failed", error=summary_refused)  # type: ignore[attr-defined]
    if junit is not None:
        publishers.insert(0, lambda: write_junit(night_run, junit))
    for publish in publishers:
        try:
            publish()
        except StateError as error:
            log.error("ci_report_failed", error=str(error))  # type: ignore[attr-defined]


@app.command()
def report(
    config: Path = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: {run, tasks}."),
) -> None:
    """What happened in this state dir's latest run, per task and iteration."""
    from orchestrator import report as reports
    from orchestrator.build import open_store
    from orchestrator.config import load_config
    from orchestrator.lock import state_identity
    from orchestrator.logs import configure_logging
    from runs.engine import safe_url

    settings = load_config(config, require_tasks=False)
    # Opening the store may warn (store_index_not_added): on stderr, as every command logs, not in the report.
    configure_logging()
    store = open_store(settings, reading=True)
    latest, began = None, None
    if store is not None:
        try:
            # In a store several state dirs share, the night of this one, not another machine's.
            latest = store.latest_run(state_id=state_identity(settings.state_dir, create=False))
            began = store.on_this_hosts_clock(latest.started_at) if latest is not None else None
        finally:
            store.close()
    if latest is None:
        if as_json:
            typer.echo(json.dumps({"run": None, "tasks": []}))
        _fail(f"no runs recorded yet in {safe_url(settings.store_url).removeprefix('sqlite:///')}", EXIT_NO_RUNS)
    if as_json:
        typer.echo(json.dumps(reports.as_json(latest), indent=2))
    else:
        _echo(reports.as_text(latest, base=_merge_target(settings), process_gone=_process_gone(latest, began)), nl=False)


def _trim_transcripts(settings: object, log: object) -> None:
    """`[state] keep_transcripts_days`: older transcripts deleted before the night; a file that cannot be is logged, not fatal."""
    from orchestrator.transcript import remove_older_than

    days = settings.state.keep_transcripts_days  # type: ignore[attr-defined]
    if not days:
        return
    removed, failures = remove_older_than(settings.transcripts_dir, days)  # type: ignore[attr-defined]
    if removed:
        log.info("transcripts_removed", count=removed, older_than_days=days)  # type: ignore[attr-defined]
    for failure in failures:
        log.warning("transcript_not_removed", error=failure)  # type: ignore[attr-defined]


def _trim_runs(settings: object, store: object, log: object, *, since: datetime | None) -> None:
    """`[state] keep_runs_days`: this state dir's runs that ended longer ago deleted before the night, those begun since
    `since` (a scheduled night's fire time: its earlier runs, which the night reads) kept, and in a store other state
    dirs may use the newest run that finished each work with success (runs/old_runs.py); a failure is logged, not fatal."""
    from datetime import timedelta

    from orchestrator.lock import state_identity
    from orchestrator.night import store_is_shared
    from orchestrator.secrecy import Redactor

    days = settings.state.keep_runs_days  # type: ignore[attr-defined]
    if not days:
        return
    removed, error = 0, ""
    try:
        state_id = state_identity(settings.state_dir)  # type: ignore[attr-defined]
        older_than, shared = timedelta(days=days), store_is_shared(settings)  # type: ignore[arg-type]
        for batch in store.remove_old_runs(state_id, older_than, keep_begun_since=since, shared=shared):  # type: ignore[attr-defined]
            removed += batch
    except StateError as failed:  # a locked or read-only store: the night goes on, and its own writes say if it cannot
        error = Redactor.for_config(settings)(str(failed))
    if removed:
        log.info("runs_removed", count=removed, older_than_days=days)  # type: ignore[attr-defined]
    if error:
        log.warning("runs_not_removed", error=error)  # type: ignore[attr-defined]


def _process_gone(run: object, began: object) -> bool:
    """A run recorded as running whose process, on this host, no longer exists. `began`: the run's start
    on this host's clock (a shared PostgreSQL store writes the database's, which may be minutes off)."""
    import socket

    from orchestrator.commands import pid_alive

    return run.status == "running" and run.host == socket.gethostname() and not pid_alive(run.pid, began)  # type: ignore[attr-defined]


def _check_log_format(log_format: str) -> None:
    from orchestrator.logs import LOG_FORMATS

    if log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")


# Branches overnight makes (a task's, a kept copy's): never what a task's work is merged into.
_OWN_BRANCHES = ("overnight/", "overnight-kept/")


def _merge_target(settings: object) -> str:
    """What the morning diff compares against: `[repo] base`, or the branch checked out there."""
    base = settings.repo.base  # type: ignore[attr-defined]
    if base != "HEAD":
        return base
    try:
        import git

        repo = git.Repo(settings.repo_path)  # type: ignore[attr-defined]
        checked_out = repo.active_branch.name
    except Exception:  # detached HEAD, repo moved: the plain name still works in git diff
        return "HEAD"
    # A task's branch checked out there for review: `git diff overnight/x...overnight/x` is empty.
    return _mainline(repo) if checked_out.startswith(_OWN_BRANCHES) else checked_out


def _mainline(repo: object) -> str:
    """The branch the tasks' work goes into when the checkout is on one of overnight's: the remote's
    default branch, else `main` or `master`, else HEAD."""
    try:
        remote_default = repo.git.symbolic_ref("--short", "-q", "refs/remotes/origin/HEAD")  # type: ignore[attr-defined]
    except Exception:  # no remote, or it names no default branch
        remote_default = ""
    if remote_default and not remote_default.removeprefix("origin/").startswith(_OWN_BRANCHES):
        return remote_default
    heads = {head.name for head in repo.heads}  # type: ignore[attr-defined]
    return next((name for name in ("main", "master") if name in heads), "HEAD")


@app.command()
def notes(
    config: Path = ConfigOption,
    task: str = typer.Option(None, "--task", help="Only this task's entries."),
) -> None:
    """Print notes.md: why iterations were rolled back, and what the next one was told."""
    from orchestrator.config import load_config
    from orchestrator.notes import NotesBook

    settings = load_config(config, require_tasks=False)
    book = NotesBook(settings.notes_path)
    if task is None:
        text = book.text()
        _echo(text or "(no notes yet)", nl=not text.endswith("\n"))
        return
    entries = book.for_task(task)
    known = [t.name for t in settings.task]
    if not entries and task not in known:
        # A misspelt name: "(no notes for task ...)" and exit 0 read as a task that never failed.
        raise ConfigError(f"--task {task!r}: no such task in {config} nor in notes.md (tasks: {', '.join(known) or 'none'})")
    _echo("\n\n".join(entries) if entries else f"(no notes for task {task!r})")


def _echo(text: str, *, nl: bool = True) -> None:
    """Print `text` on stdout in whatever encoding it has (a latin-1 terminal, cron's mail):
    a character it cannot hold prints as "?", never a UnicodeEncodeError."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    typer.echo(text.encode(encoding, errors="replace").decode(encoding), nl=nl)


@app.command()
def demo(
    workdir: Path = typer.Option(
        None, "--dir", help="An empty folder for the sample repository and the night's files (default: a new temp folder)."
    ),
) -> None:
    """A real night with the embedded small model on a sample repository; prints the report, notes and where things are."""
    from orchestrator.cancel import CancelToken

    # As `run`: SIGTERM (`timeout`, a CI job cancelled) killed the demo mid-iteration, its run left
    # "running", nothing rolled back, the report and the sample's whereabouts never printed.
    cancel = CancelToken()
    night_over = _cancel_on_signals(cancel)
    from orchestrator.demo import run_demo

    _require_git()
    try:
        code = run_demo(workdir, sys.stdout, cancel=cancel)
    finally:
        night_over()
    raise typer.Exit(code)


@app.command()
def serve(
    config: Path = ConfigOption,
    log_format: str = typer.Option("auto", "--log-format", help="auto (human on a terminal, else json), human or json."),
    show_next: bool = typer.Option(False, "--next", help="Print the next three fire times and exit."),
) -> None:
    # The backslash keeps rich (typer's help) from reading [schedule] as markup and dropping it.
    """Start a night on \\[schedule] cron, in the foreground until SIGTERM; each night is a child `overnight run`."""
    from orchestrator.cancel import StopNoted

    # First, as `run` does: a stop while serve loads its config and scheduler is noted, and serve
    # then stops as soon as its scheduler is up, with 0, before it starts any night.
    stop = None
    if show_next:  # only prints
        _usual_signal_handlers()
    else:
        stop = StopNoted().note_stops()
    from orchestrator import crontab, schedule
    from orchestrator.config import load_config
    from orchestrator.logs import configure_logging

    _check_log_format(log_format)
    configure_logging(log_format)  # before the config is read: its errors, too, as JSON lines with --log-format json
    if show_next:
        for moment in crontab.next_fire_times(load_config(config, require_tasks=False)):  # the schedule alone
            typer.echo(moment.isoformat())
        return
    _require_git()  # each night needs it
    raise typer.Exit(schedule.serve(config, stop))


@app.command()
def gc(
    config: Path = ConfigOption,
    force: bool = typer.Option(
        False, "--force", help="Also delete every stale branch and worktree it would keep: their unmerged commits and uncommitted changes are lost."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be removed."),
) -> None:
    """Remove worktrees and overnight/ branches of tasks no longer in the config; unmerged work is kept."""
    from orchestrator.build import check_repository
    from orchestrator.config import load_config
    from orchestrator.files import looked_up
    from orchestrator.gc import collect_garbage
    from orchestrator.lock import StateLock

    _require_git()
    settings = load_config(config, require_tasks=False)
    # Not a repository, a base that names no commit, a state dir in the checkout or its .git:
    # exit 2 before the state dir (and its lock) is made.
    check_repository(settings)
    # A dry run only reads: where no state dir is yet, it makes none (the lock would).
    there = looked_up(settings.state_dir, StateError, "state dir") is not None
    lock = StateLock(settings.state_dir, command="overnight gc") if there or not dry_run else contextlib.nullcontext()
    with lock:
        result = collect_garbage(settings, force=force, dry_run=dry_run)
    _echo("\n".join(result.lines()))


def entry() -> None:
    """The `overnight` process: main(), then a quiet exit with its code. A bug (an exception nothing maps to a
    code) prints its traceback and exits 1, as Python would, and so does an exception that ends a thread (without
    the exit), both with the secret values known as ***: the night's, or before its config was read, the
    environment's (orchestrator/secrecy.py)."""
    from orchestrator.secrecy import Redactor
    from orchestrator.tracebacks import keep_thread_tracebacks_redacted, print_redacted

    environments = Redactor.for_night()
    # For the process's life: a thread may die after entry returned (joined as the interpreter exits). A night's
    # `run` adds its own for its time.
    keep_thread_tracebacks_redacted(environments)
    try:
        main()
    except SystemExit:
        _ignore_stopping_signals()
        raise
    except KeyboardInterrupt:  # a second Ctrl-C while main was mapping its ending to a code
        _ignore_stopping_signals()
        sys.exit(130)
    except BaseException as bug:
        _ignore_stopping_signals()
        print_redacted(bug, getattr(bug, _NIGHTS_REDACTION, environments))
        sys.exit(1)


def _ignore_stopping_signals() -> None:
    """The command is over and its exit code known, but the interpreter's own teardown still takes a
    moment (seconds on a slow host). A Ctrl-C then was a KeyboardInterrupt in Python's shutdown, or,
    once that has put the default handlers back, a death by SIGINT: exit status -2 to a parent
    process instead of the 130 the night had decided. Ignored, it changes nothing: the process is
    leaving. (SIG_IGN, not a handler of ours: Python's shutdown resets those to the default.)"""
    for number in stopping_signals():
        signal.signal(number, signal.SIG_IGN)


def main() -> None:
    """Run the command: map our errors to one stderr line and an exit code (SystemExit)."""
    # Inherited from a git hook or a shell's dotfiles, they would send every git command of
    # overnight's (GitPython's too) to that repository instead of the configured one.
    from orchestrator.commands import INHERITED_GIT_VARIABLES

    for name in INHERITED_GIT_VARIABLES:
        os.environ.pop(name, None)
    watch = _StdoutWatch(sys.stdout) if sys.stdout is not None and _prints_no_night() else None
    if watch is not None:
        sys.stdout = watch  # type: ignore[assignment]
    try:
        _run_app()
    except _ReaderGone:  # also from the help printed for `overnight` alone, in an except clause of _run_app
        _reader_gone()
    finally:
        if watch is not None and sys.stdout is watch:  # main() called in a process that goes on (a test)
            sys.stdout = watch.stream  # type: ignore[assignment]


def _run_app() -> None:
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except ConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
    except LockHeld as exc:
        _fail(str(exc), EXIT_LOCKED)
    except StateError as exc:
        _fail(str(exc), EXIT_STATE)
    except ModelUnreachable as exc:  # the embedded model server could not be started: no night ran
        _fail(str(exc), EXIT_MODEL_UNREACHABLE)
    except Cancelled as stop:
        from orchestrator.night import EXIT_SIGINT, SIGNAL_EXIT_CODES

        sys.exit(SIGNAL_EXIT_CODES.get(stop.why, EXIT_SIGINT))
    except KeyboardInterrupt:
        sys.exit(130)
    except (typer.Abort, EOFError):
        _fail("aborted", 1)
    except Exception as exc:
        if not _is_usage_error(exc):
            raise
        context = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and context is not None:
            typer.echo(context.get_help())  # `overnight` alone: the help, as `overnight --help`
            sys.exit(0)
        hint = f" (see `{context.command_path} --help`)" if context is not None else ""
        _fail(exc.format_message() + hint, exc.exit_code)


# Commands that run a night: what they print on stdout (the demo's progress) is written from inside it,
# where an exception of ours must not land; their account is the run store's.
_NIGHTS = frozenset({"run", "demo"})
EXIT_READER_GONE = 128 + signal.SIGPIPE  # 141, as a shell reports a command that SIGPIPE ended


def _prints_no_night() -> bool:
    """Any command but a night's, and a night command asked only for its help (`overnight run --help | head`)."""
    return _command_named() not in _NIGHTS or "--help" in sys.argv[1:]


class _ReaderGone(Exception):
    """stdout's reader went away (`overnight report | head -1`). No OSError: click takes a broken pipe
    for its own and exits 1, silently, which reads as "no runs recorded yet" from `report`."""


class _StdoutWatch:
    """sys.stdout, whose write or flush into a pipe nobody reads any more raises _ReaderGone."""

    def __init__(self, stream: object) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)  # type: ignore[attr-defined]
        except BrokenPipeError:
            raise _ReaderGone from None

    def flush(self) -> None:
        try:
            self.stream.flush()  # type: ignore[attr-defined]
        except BrokenPipeError:
            raise _ReaderGone from None

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def _reader_gone() -> None:
    """Exit 141, quietly, as `git log | head` does: the reader asked for no more. What the command did
    (gc's removals) is done; only its output is cut short. stdout's descriptor goes to /dev/null first:
    the interpreter's own flush at exit would otherwise fail again, with a message and exit 120."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ is not None else 1)
    finally:
        os.close(devnull)
    sys.exit(EXIT_READER_GONE)


def _is_usage_error(exc: Exception) -> bool:
    """A click exception (a bad option, a missing value), which carries its own exit code.

    Recognised by shape: typer raises them from click, or (typer >= 0.22) from its own copy of click.
    """
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _cancel_on_signals(token: Cancel) -> Callable[[], None]:
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
                # From here the night is abandoned (`_stop_at_once`): a third Ctrl-C landing in that,
                # or in the exit after it, would raise where nothing catches it.
                abandoned.set()
                raise KeyboardInterrupt
            return
        token.cancel(signal.Signals(signum).name, restate=True)

    for number in stopping_signals():
        signal.signal(number, cancel)
    return over.set


def _leave_now(code: int) -> None:
    """Exit at once, from a signal handler: the streams flushed if they can be (one may be mid-write)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _fail(message: str, code: int) -> None:
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


if __name__ == "__main__":
    entry()
