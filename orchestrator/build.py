"""Turn a validated Config into the live objects of a night, and take them down after.

The CLI calls `night_parts(config)` in a with-block; whatever happens inside
(a crash, Ctrl-C), the store is closed and a local model server is stopped.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from orchestrator.cancel import CancelToken
from orchestrator.config import Config
from orchestrator.console import SignalPrinter
from orchestrator.errors import ConfigError
from orchestrator.logs import get_logger, json_mode
from orchestrator.model_section import LOCAL_MODEL
from orchestrator.night import NightParts


@contextlib.contextmanager
def model_for(config: Config, cancel: CancelToken) -> Iterator[object]:
    """The configured model; for "local", the embedded server, started for the night and stopped after."""
    from orchestrator.model import EndpointModel

    with contextlib.ExitStack() as stack:
        model_config = config.model
        if model_config.name == LOCAL_MODEL:
            from orchestrator.local_model import local_model_config, serve_local_model

            server = stack.enter_context(serve_local_model(config, log=get_logger(), cancel=cancel))
            model_config = local_model_config(config.model, server)
        _check_routable(model_config)
        model = EndpointModel(model_config, max_output_chars=config.guards.max_output_chars, cancel=cancel)
        stack.callback(model.close)
        yield model


def _check_routable(model_config: Any) -> None:
    """ConfigError (exit 2) for a model name litellm has no provider for: the same every night, so a
    config error, not an unreachable server (exit 3)."""
    from orchestrator import transport_choice

    problem = transport_choice.routing_problem(model_config)
    if problem:
        raise ConfigError(
            f"[model] name: litellm has no provider for {model_config.name!r}; write it as provider/model "
            f"(ollama_chat/llama3, or openai/<name> with api_base for an OpenAI-compatible server) ({problem})"
        )


def open_store(config: Config, *, reading: bool = False):
    """The run store; `reading`: for commands that only read it, also from a read-only state dir,
    and None when there is nothing to read yet (reading creates neither the state dir nor the database)."""
    from orchestrator.errors import StateError
    from orchestrator.files import looked_up
    from orchestrator.lock import make_dir
    from runs.store import RunStore

    if reading:
        if looked_up(config.state_dir, StateError, "state dir") is not None:
            make_dir(config.state_dir)  # a file in the way: one line, exit 4
        return RunStore.open_for_reading(config.store_url)
    make_dir(config.state_dir)
    return RunStore.open(config.store_url)


@dataclass(frozen=True)
class CheckedInputs:
    """What a night reads from outside its config, found usable before anything is written."""

    repo: Any  # git.Repo
    make_guards: Callable[[], Any]


def check_inputs(config: Config) -> CheckedInputs:
    """ConfigError (exit 2) on a bad repository, base, state dir, check or user guard; reads only,
    so the CLI calls it before it takes the state dir's lock (which creates the state dir)."""
    from guards import guard_factory

    repo = check_repository(config)
    _check_paths_are_text(config)
    _check_programs_found(config)
    _check_schedule(config)
    if config.model.name == LOCAL_MODEL:  # a bad OVERNIGHT_LOCAL_THREADS: said now, not after the model's download
        from orchestrator.cpu_threads import default_threads
        from orchestrator.local_model_files import installed_extra

        default_threads()
        # Without the [local] extra (README's `pip install -e .` alone), said before the state dir is made:
        # it was made first, and left in the user's checkout as an untracked .overnight/.
        installed_extra()
    else:  # before the state dir and the store are made (the embedded model's name is known once it runs)
        _check_routable(config.model)
    return CheckedInputs(repo=repo, make_guards=guard_factory(config.guards))


def _check_paths_are_text(config: Config) -> None:
    """A config file or state dir in a folder whose name is not UTF-8 (a Latin-1 `café`): the run store
    records the config's path and every transcript's, and could hold neither; the night ended in a
    traceback as it began. Said now, in one line, before the state dir is made."""
    import os

    from orchestrator.surrogates import mend

    for key, path in (("--config", str(config.source)), ("[state] dir", str(config.state_dir)), ("[store] url", config.store_url)):
        if mend(path) != path:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            raise ConfigError(f"{key}: {shown} is a name in another encoding than UTF-8, which the run store cannot record; rename it in UTF-8")


def _check_schedule(config: Config) -> None:
    """A `[schedule]` that `serve` would refuse (exit 2) is refused by `run` too: a typo must not
    wait for the day someone starts `serve`. The default is not asked; "local" is the host's
    zone, which only `serve` needs to read. (report, notes and gc still work: the morning's tools.)"""
    from orchestrator.config import ScheduleConfig

    if config.schedule == ScheduleConfig(misfire_grace_s=config.schedule.misfire_grace_s):
        return
    from datetime import timezone

    from orchestrator.crontab import night_trigger, schedule_timezone

    zone = timezone.utc if config.schedule.timezone == "local" else schedule_timezone(config)
    night_trigger(config, zone)


def check_repository(config: Config) -> Any:
    """The user's repository (a git.Repo), once `[repo] path`, `[repo] base` and `[state] dir` are
    found usable together: ConfigError (exit 2) otherwise. Reads only: every command that locks or
    writes the state dir (run, gc, serve) calls it first, so none writes into the user's checkout or .git."""
    from orchestrator.repository import check_base, open_repo
    from orchestrator.state_dir_place import tracked_files_problem

    repo = open_repo(config.repo_path)
    check_base(repo, config.repo.base)
    state, top, git_dir = config.state_dir, Path(repo.working_tree_dir).resolve(), Path(repo.common_dir).resolve()
    if state == top or state.is_relative_to(git_dir):
        where = "the repository's own folder" if state == top else "inside its .git"
        raise ConfigError(f"[state] dir: {state} is {where}; name a folder of its own (the default is .overnight)")
    where = tracked_files_problem(state)
    if where:
        raise ConfigError(
            f"[state] dir: {state} is {where}, which a night would overwrite (notes.md) or delete (old transcripts/, "
            "worktrees/); name a folder of its own (the default is .overnight)"
        )
    _check_store_apart(config)
    return repo


def _check_store_apart(config: Config) -> None:
    """A SQLite run store in a file of its own: named as one of the state dir's other files (notes.md,
    a lock) or put among the worktrees or transcripts, SQLite and that file's writer cut each other's
    bytes off (notes appended after the database's pages were gone at its next close)."""
    import os

    from orchestrator.lock import LOCK_NAME, SERVE_LOCK_NAME, STATE_ID_NAME
    from orchestrator.state_files import (
        GIT_CONFIG_COPY, LOCAL_SERVER_LOG, NOTES_FILE, SERVE_NIGHT_MARKER, STORE_FILE, TRANSCRIPTS_FOLDER, WORKTREES_FOLDER,
    )
    from runs.engine import sqlite_files

    state = Path(os.path.realpath(config.state_dir))
    # Also the files a night or serve writes and then deletes (the marker, the git config's copy):
    # a store there was deleted with them, every night's account gone.
    own = (NOTES_FILE, NOTES_FILE + ".lock", LOCK_NAME, SERVE_LOCK_NAME, STATE_ID_NAME, SERVE_NIGHT_MARKER, GIT_CONFIG_COPY, LOCAL_SERVER_LOG)
    taken = {state / name for name in own}
    taken.add(Path(os.path.realpath(config.source)))
    for file in sqlite_files(config.store_url):
        where = Path(os.path.realpath(file))
        if where in taken or any(where.is_relative_to(state / folder) for folder in (WORKTREES_FOLDER, TRANSCRIPTS_FOLDER)):
            raise ConfigError(f"[store] url: {file} is one of overnight's own files; name a file of its own (the default is {state / STORE_FILE})")


def _check_programs_found(config: Config) -> None:
    """A check whose program the shell cannot find would fail every iteration with exit 127,
    blamed on the model as `check_failed`: cron's PATH (/usr/bin:/bin) lacks a virtualenv's
    `python`, `pytest`, `npm`. That is found before the night, in one line."""
    import os

    from orchestrator.missing_programs import missing_program

    for task in config.task:
        program = missing_program(task.check)
        if program is not None:
            raise ConfigError(
                f"[[task]] {task.name!r}: its check runs {program!r}, which is not on PATH ({os.environ.get('PATH', '')}); "
                "give its full path, or set PATH where overnight runs (under cron, a PATH= line in the crontab)"
            )


@contextlib.contextmanager
def night_parts(config: Config, checked: CheckedInputs | None = None, cancel: CancelToken | None = None) -> Iterator[NightParts]:
    from orchestrator.lock import make_dir

    # Fail on a bad repository, base or user guard before anything is recorded or started.
    checked = checked or check_inputs(config)
    repo, make_guards = checked.repo, checked.make_guards
    # A file where the night's folders go is one clear line (exit 4) before anything is recorded.
    for folder in (config.worktrees_dir, config.transcripts_dir):
        make_dir(folder, "state folder")
    store = open_store(config)
    cancel = cancel if cancel is not None else CancelToken()
    try:
        with model_for(config, cancel) as model:
            context_window = model.context_window(ask_server=True) if hasattr(model, "context_window") else None
            yield NightParts(
                config=config,
                model=model,
                store=store,
                guards_factory=make_guards,
                # With JSON logs the `signal` event says it all; stderr stays pure JSON lines.
                on_signal=(lambda signal: None) if json_mode() else SignalPrinter(),
                log=get_logger(),
                repo=repo,
                context_window=context_window,
                cancel=cancel,
            )
    finally:
        store.close()
