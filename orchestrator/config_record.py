"""The whole config as one frozen record: its sections, what holds across them, and the paths it leads to."""

from __future__ import annotations

import math
import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from orchestrator.config_paths import DEFAULT_CONFIG_NAME, resolved, store_url_of
from orchestrator.config_section import DAY_S, Section
from orchestrator.errors import ConfigError, StateError
from orchestrator.guards_section import GuardsConfig
from orchestrator.model_section import ModelConfig
from orchestrator.night_section import NightConfig
from orchestrator.repo_section import RepoConfig
from orchestrator.schedule_section import ScheduleConfig
from orchestrator.state_dir_place import outside_home_problem
from orchestrator.state_files import GIT_CONFIG_COPY, NOTES_FILE, TRANSCRIPTS_FOLDER, WORKTREES_FOLDER
from orchestrator.state_section import StateConfig
from orchestrator.store_section import StoreConfig
from orchestrator.task_section import TaskConfig


class Config(Section):
    model: ModelConfig = ModelConfig()
    repo: RepoConfig = RepoConfig()
    state: StateConfig = StateConfig()
    store: StoreConfig = StoreConfig()
    night: NightConfig = NightConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    guards: GuardsConfig = GuardsConfig()
    task: tuple[TaskConfig, ...] = Field(default=(), alias="task")
    # Where the file was read from; relative paths resolve against its folder.
    source: Path = Field(Path(DEFAULT_CONFIG_NAME), exclude=True)

    @field_validator("task")
    @classmethod
    def _unique_names(cls, tasks: tuple[TaskConfig, ...]) -> tuple[TaskConfig, ...]:
        seen: dict[str, str] = {}
        for task in tasks:
            if task.name in seen.values():
                raise ValueError(f"task name {task.name!r} appears twice")
            other = seen.get(task.name.casefold())
            if other is not None:
                # Names a branch and a folder: on macOS and Windows file systems the two would be one.
                raise ValueError(f"task names {other!r} and {task.name!r} differ only in case; give them different names")
            seen[task.name.casefold()] = task.name
        return tasks

    @model_validator(mode="after")
    def _runs_kept_past_a_late_fire(self) -> "Config":
        # serve starts a night up to the grace after its fire, and tries again for a grace more while another
        # process holds the state lock: that night reads the runs since its fire (its own state dir's are kept
        # by the trim itself, see trimming.trim_runs; another machine's sharing the store are not).
        days, grace_s = self.state.keep_runs_days, self.schedule.misfire_grace_s
        if days and days * DAY_S < 2 * grace_s:
            raise ValueError(
                f"[state] keep_runs_days: {days:g} days is less than twice [schedule] misfire_grace_s ({grace_s} s): a scheduled "
                "night begun late reads its fire's runs from up to that long ago, also another machine's sharing the store; "
                f"give at least {math.ceil(2 * grace_s / DAY_S)}, or 0 to keep every run"
            )
        return self

    @model_validator(mode="after")
    def _state_dir_not_home(self) -> "Config":
        # A night writes notes.md, runs.db and its locks in its state dir: in the home folder (`~`) or above it (`/`), over
        # the user's own files of those names.
        state = Path(os.path.realpath(self.base_dir / os.path.expanduser(self.state.dir)))
        where = outside_home_problem(state)
        if where:
            raise ValueError(
                f"[state] dir: {state} is {where}, whose files a night would overwrite (notes.md) or delete (old transcripts/, "
                "worktrees/); name a folder of its own (the default is .overnight)"
            )
        return self

    @model_validator(mode="after")
    def _store_not_a_folder(self) -> "Config":
        # `sqlite:////` (the root) or a URL naming a folder passed the load; the night then failed as the store opened.
        from runs.engine import sqlite_database_file

        if self.store.url is None:
            return self
        database = sqlite_database_file(self.store_url)
        if database is not None and os.path.isdir(database):  # os.path: False, not an error, where it cannot be looked at
            example = "" if database == database.parent else f" (e.g. {database / 'runs.db'})"
            raise ValueError(f"[store] url: {database} names a folder, not a database file; name a file in it{example}")
        return self

    @model_validator(mode="after")
    def _store_there_for_mode_rw(self) -> "Config":
        # SQLite's `mode=rw` opens only a file that is there ("unable to open database file"): the first night, which
        # makes its store, failed as it opened (exit 4). Once the file is there, mode=rw opens it as SQLite does.
        from sqlalchemy.engine import make_url

        from orchestrator.sqlite_uri_modes import last_value
        from runs.engine import sqlite_database_file, sqlite_uri_read

        if self.store.url is None:
            return self
        read = sqlite_uri_read(make_url(self.store_url))
        database = sqlite_database_file(self.store_url)
        if read and last_value(read[1], "mode") == "rw" and database is not None and not os.path.exists(database):
            raise ValueError(
                f"[store] url: mode=rw opens only a database file that is there, and {database} is not: the first night "
                "makes its store; use mode=rwc (or no mode) until it is there"
            )
        return self

    @property
    def base_dir(self) -> Path:
        return resolved(self.source, "--config").parent

    @property
    def repo_path(self) -> Path:
        # `~` is the user's home, as in `[store] url`: a state dir "~/..." was a folder named `~` in the
        # config's folder (the user's checkout), one `rm -rf ~` away from the home it was meant to be in.
        return resolved(self.base_dir / os.path.expanduser(self.repo.path), "[repo] path")

    @property
    def state_dir(self) -> Path:
        return resolved(self.base_dir / os.path.expanduser(self.state.dir), "[state] dir", StateError)

    @property
    def store_url(self) -> str:
        """The run store's URL: `[store] url` (a relative SQLite file in it against the config's folder), by default the
        state dir's runs.db. Escaped as URLs are: the file it names is runs.engine.sqlite_database_file's, not what
        follows `sqlite:///`."""
        return store_url_of(self)

    @property
    def notes_path(self) -> Path:
        return self.state_dir / NOTES_FILE

    @property
    def worktrees_dir(self) -> Path:
        return self.state_dir / WORKTREES_FOLDER

    @property
    def transcripts_dir(self) -> Path:
        return self.state_dir / TRANSCRIPTS_FOLDER

    @property
    def git_config_copy(self) -> Path:
        """The repository's git config as it was while the agent's commands ran (orchestrator/confinement.py)."""
        return self.state_dir / GIT_CONFIG_COPY

    def task_named(self, name: str) -> TaskConfig:
        for task in self.task:
            if task.name == name:
                return task
        raise ConfigError(f"no task named {name!r} in {self.source}")
