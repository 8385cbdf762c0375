"""`overnight`: a thin CLI. Each command loads the config, builds objects, calls one function.

Errors are handled once, in `main` (orchestrator/process_exit.py): one line on stderr and a documented exit
code, never a traceback. Only a bug prints one (`entry`), exit 1. Heavy imports (litellm, SQLAlchemy, GitPython) happen
inside commands so that `overnight --help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path

from orchestrator.process_signals import install_early_handlers, usual_signal_handlers  # light: the standard library only

# First, before the slow imports below: a stop while they run is a quiet exit (orchestrator/process_signals.py). Only in
# the `overnight` process itself (the console script, or `python -m orchestrator.cli` as serve starts each night).
install_early_handlers(__name__ == "__main__" or Path(sys.argv[0]).name == "overnight")

import typer  # noqa: E402  (after the early handlers: the imports below are the slow part)

from orchestrator import process_exit  # noqa: E402
from orchestrator.config_paths import DEFAULT_CONFIG_NAME  # noqa: E402
from orchestrator.errors import ConfigError, StateError  # noqa: E402

EXIT_NO_RUNS = 1  # `report` before this state dir's first night

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
        usual_signal_handlers()


ConfigOption = typer.Option(Path(DEFAULT_CONFIG_NAME), "--config", "-c", help="Path to overnight.toml.")


@app.command()
def init(
    # As typed: a Path drops the slash of `-c newdir/`, and init wrote a file named `newdir`.
    config: str = typer.Option(DEFAULT_CONFIG_NAME, "--config", "-c", help="Path to overnight.toml.", metavar="<path>"),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing config file."),
) -> None:
    """Write overnight.toml from the commented example (every key, its default, why to change it)."""
    from orchestrator.config_writing import config_file_named, write_example_config

    write_example_config(config_file_named(config), force)
    typer.echo(f"wrote {config}: add your tasks, point [model] at a server, then `overnight run`")


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
    from orchestrator.process_signals import cancel_on_signals

    # First of all: a SIGTERM while the night starts up (imports, config, lock, the model) must not
    # kill the process half way; the night then begins cancelled, records its tasks as such and
    # ends with the signal's exit code.
    cancel = CancelToken()
    night_over = cancel_on_signals(cancel)

    import logging

    from orchestrator.build import check_inputs, night_parts
    from orchestrator.ci_reports import publish_for_ci
    from orchestrator.config import load_config
    from orchestrator.lock import StateLock
    from orchestrator.logs import configure_logging
    from orchestrator.night import run_night
    from orchestrator.preflight import check_log_format, check_not_ours, check_writable, fire_time, require_git, summary_refused
    from orchestrator.process_signals import stop_at_once
    from orchestrator.recovery import recover_interrupted
    from orchestrator.report_inputs import report_zone
    from orchestrator.state_dir_exclude import make_state_dir
    from orchestrator.trimming import trim_notes, trim_runs, trim_transcripts

    check_log_format(log_format)
    # First: with --log-format json, even a broken config is reported as a JSON line.
    configure_logging(log_format, level=logging.DEBUG if verbose else logging.INFO)
    fire_at = fire_time(scheduled_for) if scheduled_for is not None else None
    require_git()
    if junit is not None:
        check_writable(junit, "--junit")
    settings = load_config(config)
    with process_exit.errors_redacted(settings):
        checked = check_inputs(settings)  # a bad repo, base or guard: exit 2 before the state dir is made
        if junit is not None:
            check_not_ours(junit, "--junit", settings, checked.repo)
        summary_refusal = summary_refused(settings, checked.repo)
        # The step summary names a deadline on the morning report's clock (the night says so when that is UTC in TZ's
        # place: `deadline_read_in_utc`); without a deadline it shows no time.
        summary_zone = report_zone(settings, said=False) if settings.night.deadline else None
        make_state_dir(checked.repo, settings.state_dir)  # kept out of `git status` from the start, in the checkout
        with StateLock(settings.state_dir) as lock, night_parts(settings, checked, cancel) as parts:
            parts = dataclasses.replace(parts, check_lock=lock.check_still_held, scheduled_for=fire_at)
            recover_interrupted(parts.store, settings, parts.log)
            trim_transcripts(settings, parts.log)
            trim_runs(settings, parts.store, parts.log, since=fire_at)
            trim_notes(settings, parts.log, since=fire_at)
            try:
                result = run_night(parts)
            except KeyboardInterrupt:
                stop_at_once(parts.log, parts.store.begun_run_id)
            finally:
                night_over()
                publish_for_ci(
                    parts.store, junit, notes=settings.notes_path, log=parts.log, summary_refused=summary_refusal, zone=summary_zone,
                )
    raise typer.Exit(result.exit_code)


@app.command()
def report(
    config: Path = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: {run, tasks, kept_branches}."),
) -> None:
    """What happened in this state dir's latest run, per task and iteration."""
    from orchestrator import report as reports
    from orchestrator.build import open_store
    from orchestrator.config import load_config
    from orchestrator.lock import state_identity
    from orchestrator.logs import configure_logging
    from orchestrator.report_inputs import branches_apart, branches_in, kept_branches, merge_target, process_gone, report_zone
    from runs.engine import store_shown

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
        process_exit.fail(f"no runs recorded yet in {store_shown(settings.store_url)}", EXIT_NO_RUNS)
    kept = kept_branches(settings, [task.name for task in latest.tasks])
    if as_json:
        typer.echo(json.dumps(reports.as_json(latest, kept=kept), indent=2))
    else:
        gone = process_gone(latest, began)
        target = merge_target(settings)
        reviewed = [task.branch for task in reports.to_review(latest)]
        in_base = branches_in(settings, target, reviewed)
        apart = branches_apart(settings, target, [branch for branch in reviewed if branch not in in_base])
        text = reports.as_text(
            latest, base=target, process_gone=gone, zone=report_zone(settings), in_base=in_base, apart=apart, kept=kept
        )
        _echo(text, nl=False)


@app.command()
def notes(
    config: Path = ConfigOption,
    task: str = typer.Option(None, "--task", help="Only this task's entries."),
) -> None:
    """Print notes.md: why iterations were rolled back, and what the next one was told."""
    from orchestrator.config import load_config
    from orchestrator.notes import NotesBook
    from orchestrator.printable import visible_document

    settings = load_config(config, require_tasks=False)
    book = NotesBook(settings.notes_path)
    if task is None:
        # The night escapes what it writes there, but not only the night writes notes.md: an editor, or the code a
        # check ran (the model's). Its control characters are shown, never obeyed, as in the report.
        text = visible_document(book.text())
        _echo(text or "(no notes yet)", nl=not text.endswith("\n"))
        return
    entries = book.for_task(task)
    known = [t.name for t in settings.task]
    if not entries and task not in known:
        # A misspelt name: "(no notes for task ...)" and exit 0 read as a task that never failed.
        raise ConfigError(f"--task {task!r}: no such task in {config} nor in notes.md (tasks: {', '.join(known) or 'none'})")
    _echo(visible_document("\n\n".join(entries)) if entries else f"(no notes for task {task!r})")


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
    from orchestrator.process_signals import cancel_on_signals

    # As `run`: SIGTERM (`timeout`, a CI job cancelled) killed the demo mid-iteration, its run left
    # "running", nothing rolled back, the report and the sample's whereabouts never printed.
    cancel = CancelToken()
    night_over = cancel_on_signals(cancel)
    from orchestrator.demo import run_demo
    from orchestrator.preflight import require_git

    require_git()
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
        usual_signal_handlers()
    else:
        stop = StopNoted().note_stops()
    from orchestrator import crontab, schedule
    from orchestrator.config import load_config
    from orchestrator.logs import configure_logging
    from orchestrator.preflight import check_log_format, require_git

    check_log_format(log_format)
    configure_logging(log_format)  # before the config is read: its errors, too, as JSON lines with --log-format json
    if show_next:
        for moment in crontab.next_fire_times(load_config(config, require_tasks=False)):  # the schedule alone
            typer.echo(moment.isoformat())
        return
    require_git()  # each night needs it
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
    from orchestrator.preflight import require_git
    from orchestrator.state_dir_exclude import make_state_dir

    require_git()
    settings = load_config(config, require_tasks=False)
    # Not a repository, a base that names no commit, a state dir in the checkout or its .git:
    # exit 2 before the state dir (and its lock) is made.
    repo = check_repository(settings)
    # A dry run only reads: where no state dir is yet, it makes none (the lock would).
    there = looked_up(settings.state_dir, StateError, "state dir") is not None
    if not dry_run:
        make_state_dir(repo, settings.state_dir)  # kept out of `git status`, in the checkout, before any night's worktree
    lock = StateLock(settings.state_dir, command="overnight gc") if there or not dry_run else contextlib.nullcontext()
    with lock:
        result = collect_garbage(settings, force=force, dry_run=dry_run)
    _echo("\n".join(result.lines()))


def entry() -> None:
    """The `overnight` process (the console script): main(), then a quiet exit with its code; a bug prints its
    traceback, with the secret values known as ***, and exits 1 (orchestrator/process_exit.py)."""
    process_exit.exit_quietly(main)


def main() -> None:
    """Run the command: map our errors to one stderr line and an exit code (SystemExit)."""
    process_exit.run_command(app)


if __name__ == "__main__":
    entry()
