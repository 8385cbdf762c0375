"""`overnight`: a thin CLI. Each command loads the config, builds objects, calls one function.

Errors are handled once, in `main`: one line on stderr and a documented exit
code, never a traceback. Heavy imports (litellm, SQLAlchemy, GitPython) happen
inside commands so that `overnight --help` stays instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from orchestrator.config import DEFAULT_CONFIG_NAME
from orchestrator.errors import Cancelled, ConfigError, StateError

EXIT_USAGE = 2
EXIT_STATE = 4

app = typer.Typer(
    name="overnight",
    help="Run coding agents on small local models overnight, and keep them honest.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOption = typer.Option(Path(DEFAULT_CONFIG_NAME), "--config", "-c", help="Path to overnight.toml.")


@app.command()
def init(
    config: Path = ConfigOption,
    force: bool = typer.Option(False, "--force", help="Overwrite an existing config file."),
) -> None:
    """Write overnight.toml from the commented example (every key, its default, why to change it)."""
    from orchestrator.config import example_config_text

    if config.exists() and not force:
        raise ConfigError(f"{config} already exists (use --force to overwrite)")
    config.write_text(example_config_text(), encoding="utf-8")
    typer.echo(f"wrote {config}: add your tasks, point [model] at a server, then `overnight run`")


@app.command()
def run(
    config: Path = ConfigOption,
    log_format: str = typer.Option("auto", "--log-format", help="auto (human on a terminal, else json), human or json."),
) -> None:
    """Work through the tasks tonight. Exit 0 all succeeded, 1 some did not, 2 bad config, 3 model unreachable."""
    from orchestrator.build import night_parts
    from orchestrator.config import load_config
    from orchestrator.logs import LOG_FORMATS, configure_logging
    from orchestrator.night import run_night

    if log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")
    settings = load_config(config)
    configure_logging(log_format)
    _cancel_on_sigterm()
    with night_parts(settings) as parts:
        result = run_night(parts)
    raise typer.Exit(result.exit_code)


@app.command()
def report(
    config: Path = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable: {run, tasks}."),
) -> None:
    """What happened in the latest run, per task and iteration."""
    from orchestrator import report as reports
    from orchestrator.build import open_store
    from orchestrator.config import load_config

    settings = load_config(config, require_tasks=False)
    store = open_store(settings)
    try:
        latest = store.latest_run()
    finally:
        store.close()
    if latest is None:
        raise StateError(f"no runs recorded yet in {settings.store_url.removeprefix('sqlite:///')}")
    if as_json:
        typer.echo(json.dumps(reports.as_json(latest), indent=2))
    else:
        base = settings.repo.base if settings.repo.base != "HEAD" else "HEAD"
        typer.echo(reports.as_text(latest, base=base), nl=False)


@app.command()
def notes(
    config: Path = ConfigOption,
    task: str = typer.Option(None, "--task", help="Only this task's entries."),
) -> None:
    """Print notes.md: why iterations were rolled back, and what the next one was told."""
    from orchestrator.config import load_config
    from orchestrator.notes import NotesBook

    settings = load_config(config, require_tasks=False)
    book = NotesBook(settings.state_dir / "notes.md")
    if task is None:
        text = book.path.read_text(encoding="utf-8") if book.path.exists() else ""
        typer.echo(text or "(no notes yet)", nl=not text.endswith("\n"))
        return
    entries = book.for_task(task)
    typer.echo("\n\n".join(entries) if entries else f"(no notes for task {task!r})")


def main() -> None:
    """Entry point: map our errors to one stderr line and an exit code."""
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except ConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
    except StateError as exc:
        _fail(str(exc), EXIT_STATE)
    except Cancelled as stop:
        sys.exit(143 if stop.why == "SIGTERM" else 130)
    except KeyboardInterrupt:
        sys.exit(130)
    except (typer.Abort, EOFError):
        _fail("aborted", 1)
    except Exception as exc:  # click usage errors carry their own exit code
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


def _cancel_on_sigterm() -> None:
    """SIGTERM cancels the iteration in flight (rolled back, noted `cancelled`), like Ctrl-C."""
    import signal

    def cancel(signum: int, frame: object) -> None:
        raise Cancelled("SIGTERM")

    signal.signal(signal.SIGTERM, cancel)


def _fail(message: str, code: int) -> None:
    print(f"overnight: error: {message}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
