"""overnight.toml: one typed section per component, validated once.

Every error becomes a `ConfigError` whose one-line message names the key,
because a cron job's only reader is a person at breakfast.
"""

from __future__ import annotations

import codecs
import difflib
import math
import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal, Sequence, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from orchestrator.errors import ConfigError, StateError
from orchestrator.files import looked_up
from orchestrator.secrecy import shown_url, url_password

DEFAULT_CONFIG_NAME = "overnight.toml"
# What a night keeps in the state dir (docs/reference.md, "Files"), named once here.
NOTES_FILE, STORE_FILE, WORKTREES_FOLDER, TRANSCRIPTS_FOLDER = "notes.md", "runs.db", "worktrees", "transcripts"
GIT_CONFIG_COPY = "git-config.kept"
SERVE_NIGHT_MARKER, LOCAL_SERVER_LOG = "serve-night-started", "llama-server.log"
ALL_TOOLS = ("read_file", "write_file", "edit_file", "list_dir", "search", "run_check", "submit", "run_command")
DEFAULT_TOOLS = tuple(t for t in ALL_TOOLS if t != "run_command")
LOCAL_MODEL = "local"
_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Linux passes no argument longer than 32 pages, its closing NUL included (MAX_ARG_STRLEN, 128 KiB): a longer check,
# given to bash whole, failed to start in every iteration (E2BIG, an iteration_error's traceback, the task failed).
_ARGUMENT_BYTES = 32 * os.sysconf("SC_PAGE_SIZE") if sys.platform.startswith("linux") else None
# And no command line longer, its arguments and environment together (ARG_MAX: a quarter of the stack's limit, 2 MiB by
# default, the C library's sysconf says it as the kernel counts it), each argument and variable also a pointer (8 bytes).
_COMMAND_LINE_BYTES = os.sysconf("SC_ARG_MAX") if sys.platform.startswith("linux") else None
# What a git command overnight runs holds besides the `keep` patterns: its own arguments, the worktree's settings.
_GIT_OWN_BYTES = 16 * 1024


# A second longer than a day has no place in a night; past it, sleeps and dates overflow.
_DAY_S = 86400.0
_WEEK_S = 7 * 86400
# A billion tokens is far past any model's window; a number of 309 digits or more overflowed the
# float arithmetic that shares the window out, a traceback in the middle of the night. The config's
# `[model] context_window` and the window a model server reports (server_probes.served_context_window) alike.
MAX_CONTEXT_WINDOW = 1_000_000_000


class _Section(BaseModel):
    # inf and nan would pass every bound below, then overflow the first timedelta made of them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1: `max_tokens_per_night = true` would be a 1-token budget.
        # Numeric strings and whole floats stay accepted, as they always were.
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else None
        if isinstance(value, bool) and {annotation, *get_args(annotation)} & {int, float}:
            raise ValueError(f"must be a number, not {str(value).lower()}")
        return value


class ModelConfig(_Section):
    """Which model answers, and how long to wait for it."""

    name: str = Field(LOCAL_MODEL, min_length=1, description='litellm model name, or "local" for the embedded model')
    api_base: str | None = None
    api_key: str | None = None
    request_timeout_s: float = Field(120.0, gt=0, le=_DAY_S, description="silence longer than this stops the iteration")
    temperature: float = Field(0.2, ge=0, le=2)
    max_tokens: int = Field(2048, gt=0, description="cap on one response")
    context_window: int | None = Field(None, gt=0, le=MAX_CONTEXT_WINDOW, description="used when litellm does not know the model")
    retries: int = Field(3, ge=0, le=100, description="attempts after the first when the endpoint is down or answers 5xx, 429, 408, 409 or 425")
    retry_backoff_s: float = Field(2.0, ge=0, le=3600, description="first backoff; doubles each retry, with jitter")
    transport: Literal["auto", "litellm", "direct"] = Field(
        "auto", description='"direct": OpenAI-compatible HTTP; "auto": direct for "openai/..." with api_base, else litellm'
    )

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from urllib.parse import urlsplit

        if any(mark in (url_password(value) or "") for mark in "/?#"):
            # urllib ends the user info at the first of them, and its error ("Port could not be cast to
            # integer value as '...'") quoted the password's start.
            raise ValueError(f"{shown_url(value)!r}: its password holds / ? or #, which a URL must percent-encode (%2F %3F %23)")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError as exc:
            raise ValueError(f"{shown_url(value)!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{shown_url(value)!r} is not an http:// or https:// URL with a host")
        if not all("!" <= character <= "~" for character in value):
            # Let through, every request failed as the model's iteration_error (http.client refuses it).
            raise ValueError(f"{shown_url(value)!r} holds a space, a control character or a character outside ASCII (percent-encode it: %20)")
        return value

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, value: str | None) -> str | None:
        # Never echoed: it is a secret. A newline copied with it made every request fail, and the
        # error (the key in it) went into notes.md and the next prompt.
        if value is not None and (value != value.strip() or not all(" " <= character <= "~" for character in value)):
            raise ValueError("holds a line break, a control character, a character outside ASCII or a space at an end (the key is not shown)")
        return value

    @model_validator(mode="after")
    def _direct_needs_api_base(self) -> "ModelConfig":
        if self.transport == "direct" and not self.api_base and self.name != LOCAL_MODEL:
            raise ValueError('transport = "direct" needs api_base (the server\'s OpenAI-compatible /v1 URL)')
        return self


class RepoConfig(_Section):
    """The user's repository: never touched; task worktrees branch from `base`."""

    path: Path = Path(".")
    base: str = "HEAD"
    keep: tuple[str, ...] = Field((), description="paths a rollback keeps, such as build caches")
    # A file the agent wrote larger than this is not committed (0: no limit): a dump, a log or a
    # dataset on the task's branch would go into the user's repository with its merge.
    max_file_mb: float = Field(20.0, ge=0, le=1_000_000)

    @field_validator("keep")
    @classmethod
    def _fits_a_git_argument(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Given to git as `--exclude=<pattern>`: a longer one stopped the first rollback mid-night (E2BIG, exit 4).
        # Counted in UTF-8: never shorter than in the locale's encoding, and unlike Latin-1 it encodes every pattern.
        for pattern in value:
            size = len(f"--exclude={pattern}".encode("utf-8", "surrogateescape"))
            if _ARGUMENT_BYTES is not None and size >= _ARGUMENT_BYTES:
                raise ValueError(f"a pattern of {len(pattern)} characters, more than one argument of git's command line can carry")
        # All of them go on one command line (`git clean -e <pattern>`: two arguments each, two pointers): patterns each
        # short enough, 2 MiB together, stopped the first rollback mid-night all the same (E2BIG, exit 4).
        together = sum(len(pattern.encode("utf-8", "surrogateescape")) + 20 for pattern in value)
        if _COMMAND_LINE_BYTES is not None and together > (room := _COMMAND_LINE_BYTES - _environment_bytes() - _GIT_OWN_BYTES):
            raise ValueError(
                f"{len(value)} patterns of {together} bytes together, more than one git command line can carry here with this "
                f"environment ({max(room, 0)}); keep a folder that holds them, not each path"
            )
        return value


def _environment_bytes() -> int:
    """What this process's environment takes of a command line it starts: each variable, its NUL and its pointer."""
    return sum(len(name) + len(value) + 2 + 8 for name, value in os.environb.items())


# What a `keep_*_days` under a day could remove that tonight still needs, and what 0 keeps.
_NEEDED_TONIGHT = {
    "keep_runs_days": ("tonight's own account, and the runs a scheduled night begun again reads", "every run"),
    "keep_notes_days": ("the lessons of tonight's earlier runs, which the next iteration's prompt reads", "every entry"),
}


class StateConfig(_Section):
    dir: Path = Path(".overnight")
    # Transcripts are the largest files a night leaves, one per iteration: nightly for months, gigabytes.
    keep_transcripts_days: float = Field(
        0, ge=0, le=36500, description="each run deletes transcripts last written more than this many days ago; 0 keeps all"
    )
    # The run store's per-call events grow with every night, as long as cron runs them.
    keep_runs_days: float = Field(
        0, ge=0, le=36500, description="each run deletes this state dir's runs that ended more than this many days ago; 0 keeps all"
    )
    # notes.md gains an entry per iteration rolled back, and each append rewrites the whole file.
    keep_notes_days: float = Field(
        0, ge=0, le=36500, description="each run removes notes.md's entries headed more than this many days ago; 0 keeps all"
    )

    @field_validator("keep_runs_days", "keep_notes_days")
    @classmethod
    def _a_day_at_least(cls, value: float, info: ValidationInfo) -> float:
        if 0 < value < 1:
            needed, everything = _NEEDED_TONIGHT[str(info.field_name)]
            raise ValueError(f"{value:g} is under a day: it could remove {needed}; give 1 or more days, or 0 to keep {everything}")
        return value

    @field_validator("dir", mode="before")
    @classmethod
    def _not_blank(cls, value: object) -> object:
        # "" reads as "." (the config file's folder): worktrees, notes and the run store would land there.
        if isinstance(value, str) and not value.strip():
            raise ValueError('is blank; name a folder of its own (the default is ".overnight")')
        return value


class StoreConfig(_Section):
    url: str | None = Field(None, description="SQLAlchemy URL; default sqlite under state.dir")

    @field_validator("url")
    @classmethod
    def _lasting_database(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(f"{shown_url(value)!r} is not a SQLAlchemy URL (e.g. postgresql+psycopg://user@host/overnight)") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"{url.get_backend_name()!r} is not a database overnight can use: sqlite or postgresql")
        if url.get_backend_name() == "sqlite" and ((url.database or ":memory:") == ":memory:" or url.query.get("mode") == "memory"):
            # Each thread and each later command would see its own empty database.
            raise ValueError("an in-memory database would not outlive the night; name a file or a server")
        _check_driver_arguments(value, url)
        return value


def _check_driver_arguments(value: str, url: Any) -> None:
    """ValueError for query arguments the driver cannot take (`?timeout=abc`) or would ignore
    (`?mode=ro` without `uri=true`): a traceback when the store opens, or SQLAlchemy's warning on stderr."""
    import warnings

    from sqlalchemy.exc import SAWarning

    try:
        dialect = url.get_dialect()()
    except Exception:  # a driver SQLAlchemy does not know or cannot load: said (exit 4) when the store opens
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SAWarning)
            dialect.create_connect_args(url)
    except SAWarning as exc:
        raise ValueError(f"{shown_url(value)!r}: {str(exc).split(' (Background on')[0]}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{shown_url(value)!r}: a query argument the driver cannot take: {exc}") from None


class NightConfig(_Section):
    max_iterations: int = Field(3, ge=1)
    max_turns: int = Field(30, ge=1)
    check_timeout_s: float = Field(600.0, gt=0, le=_DAY_S)
    command_timeout_s: float = Field(120.0, gt=0, le=_DAY_S)
    notes_budget_chars: int = Field(4000, ge=0, description="how much of a task's notes goes into its prompt")
    deadline: str | None = Field(None, description='local time "HH:MM" by which the night must end')
    max_tokens_per_task: int | None = Field(None, gt=0)
    max_tokens_per_night: int | None = Field(None, gt=0)
    concurrency: int = Field(1, ge=1, le=64, description="tasks worked on in parallel")

    @field_validator("deadline")
    @classmethod
    def _clock_time(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", value):
            raise ValueError('must be a time of day "HH:MM", e.g. "06:30"')
        return value


class ScheduleConfig(_Section):
    """When `overnight serve` starts a night."""

    cron: str = Field("30 1 * * *", description="crontab expression: minute hour day month weekday")
    timezone: str = Field("local", description='IANA name such as "Europe/Berlin", or "local"')
    # At most a week: a night missed by longer is not that night's any more (and a huge grace overflows the date arithmetic).
    misfire_grace_s: int = Field(3600, ge=1, le=_WEEK_S, description="a night missed by less than this (host down) still starts")


class GuardsConfig(_Section):
    """Thresholds of the built-in guards, and user guards to add."""

    repeat_remind_at: int = Field(3, ge=2)
    repeat_stop_at: int = Field(4, ge=2)
    empty_stop_at: int = Field(2, ge=1)
    no_tool_call_stop_at: int = Field(3, ge=1, description="answers in a row with text but no tool call")
    many_calls_warn_at: int = Field(4, ge=2, description="tool calls in one answer that draw a warning")
    unknown_tool_stop_at: int = Field(2, ge=1)
    broken_stop_at: int = Field(3, ge=1)
    failing_streak_at: int = Field(3, ge=2)
    failing_streak_stop_at: int = Field(0, ge=0, description="failures with nothing new between them that stop the iteration; 0: never")
    dead_loop_window: int = Field(6, ge=2, le=1000)
    dead_loop_recent: int = Field(4, ge=2, le=1000)
    dead_loop_distinct: int = Field(2, ge=1)
    progress_tools: tuple[str, ...] = ("write_file", "edit_file")
    context_warn_ratio: float = Field(0.8, gt=0, le=1)
    max_output_chars: int = Field(20000, gt=0, description="a response longer than this is cut as runaway")
    park_after: int = Field(3, ge=1, description="same severe reason on this many iterations in a row parks the task")
    custom: tuple[str, ...] = Field((), description='user guards as "module:Class"')

    @field_validator("progress_tools")
    @classmethod
    def _known_progress_tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_tool_names(value)

    @model_validator(mode="after")
    def _remind_before_stop(self) -> "GuardsConfig":
        if self.repeat_remind_at > self.repeat_stop_at:
            raise ValueError("repeat_remind_at must not be above repeat_stop_at")
        if self.failing_streak_stop_at and self.failing_streak_stop_at < self.failing_streak_at:
            raise ValueError("failing_streak_stop_at must be 0 (never) or not below failing_streak_at")
        if self.dead_loop_distinct >= self.dead_loop_recent:
            # Any `recent` rounds have at most `recent` fingerprints: every run would be a dead loop.
            raise ValueError("dead_loop_distinct must be below dead_loop_recent")
        return self


class TaskConfig(_Section):
    name: str
    prompt: str = Field(min_length=1)
    check: str = Field(min_length=1, description="shell command; exit 0 means the task is done")
    tools: tuple[str, ...] = DEFAULT_TOOLS
    # Secret-named environment variables (orchestrator/secrecy.py) the check still gets (a test
    # suite that needs a token); the agent's own commands never do.
    pass_env: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name_is_branch_safe(cls, value: str) -> str:
        # Also git's rules for a branch name that these characters can break.
        if not _TASK_NAME.fullmatch(value) or value.endswith((".lock", ".")) or ".." in value:
            raise ValueError(
                "must be 1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit, not ending in '.' "
                "or '.lock', without '..' (it names a branch and a folder)"
            )
        return value

    @field_validator("prompt", "check")
    @classmethod
    def _no_nul_nor_blank(cls, value: str) -> str:
        if "\0" in value:
            raise ValueError("contains a NUL character, which no command or prompt can carry")
        if not value.strip():  # sh -c '   ' exits 0: every submit would pass such a check
            raise ValueError("is blank (only whitespace); write what it should say or run")
        return value

    @field_validator("check")
    @classmethod
    def _runs_in_this_locale(cls, value: str) -> str:
        # A command goes to the shell in the locale's encoding: under a Latin-1 locale, '→' raised
        # UnicodeEncodeError in every iteration (an iteration_error, the task parked).
        encoding = sys.getfilesystemencoding()
        try:
            encoded = value.encode(encoding, "surrogateescape")
        except UnicodeEncodeError as exc:
            raise ValueError(f"holds {value[exc.start:exc.end]!r}, which this locale's encoding ({encoding}) cannot pass to a shell; run under a UTF-8 locale (LC_ALL=C.UTF-8)") from None
        if _ARGUMENT_BYTES is not None and len(encoded) >= _ARGUMENT_BYTES:
            raise ValueError(
                f"is {len(encoded)} bytes long, more than a shell's command line can carry here ({_ARGUMENT_BYTES - 1}); "
                "put the commands in a script and make the check run it"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_tool_names(value)
        if "submit" not in value:
            value = (*value, "submit")
        return value

    @field_validator("pass_env")
    @classmethod
    def _variable_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _VARIABLE_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable's name (letters, digits and '_', not starting with a digit)")
        return value


class Config(_Section):
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
        if days and days * _DAY_S < 2 * grace_s:
            raise ValueError(
                f"[state] keep_runs_days: {days:g} days is less than twice [schedule] misfire_grace_s ({grace_s} s): a scheduled "
                "night begun late reads its fire's runs from up to that long ago, also another machine's sharing the store; "
                f"give at least {math.ceil(2 * grace_s / _DAY_S)}, or 0 to keep every run"
            )
        return self

    @property
    def base_dir(self) -> Path:
        return _resolved(self.source, "--config").parent

    @property
    def repo_path(self) -> Path:
        # `~` is the user's home, as in `[store] url`: a state dir "~/..." was a folder named `~` in the
        # config's folder (the user's checkout), one `rm -rf ~` away from the home it was meant to be in.
        return _resolved(self.base_dir / os.path.expanduser(self.repo.path), "[repo] path")

    @property
    def state_dir(self) -> Path:
        return _resolved(self.base_dir / os.path.expanduser(self.state.dir), "[state] dir", StateError)

    @property
    def store_url(self) -> str:
        """The run store's URL: `[store] url` (a relative SQLite file in it against the config's folder), by default the
        state dir's runs.db. Escaped as URLs are: the file it names is runs.engine.sqlite_database_file's, not what
        follows `sqlite:///`."""
        if self.store.url is None:
            from runs.engine import sqlite_url

            return sqlite_url(self.state_dir / STORE_FILE)
        from sqlalchemy.engine import make_url

        from runs.engine import in_uri_form, sqlite_uri, sqlite_uri_path

        url = make_url(self.store.url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return self.store.url
        # Against the config's folder, as every path here: not the folder cron happens to start in;
        # `~` is the user's home (SQLite itself would take it for a folder's name).
        if not (url.database.startswith("file:") and in_uri_form(url)):
            return url.set(database=str(self.base_dir / os.path.expanduser(url.database))).render_as_string(hide_password=False)
        path = sqlite_uri_path(url.database)
        if not path or path == ":memory:" or url.query.get("mode") == "memory" or os.path.isabs(path):
            return self.store.url
        return url.set(database=sqlite_uri(self.base_dir / os.path.expanduser(path))).render_as_string(hide_password=False)

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


def check_tool_names(names: Sequence[str]) -> Sequence[str]:
    """ValueError naming the first of `names` that is no tool."""
    unknown = [name for name in names if name not in ALL_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r}; tools are {', '.join(ALL_TOOLS)}")
    return names


def _resolved(path: Path, key: str, error: type[Exception] = ConfigError) -> Path:
    try:
        return path.resolve()
    # RuntimeError: a symlink loop (before Python 3.13); ValueError: a NUL, had one got past the load.
    except (OSError, RuntimeError, ValueError) as exc:
        raise error(f"{key}: {path} cannot be resolved: {getattr(exc, 'strerror', None) or exc}") from None


def load_config(path: Path | str, *, require_tasks: bool = True) -> Config:
    """Read and validate `path`; raise ConfigError with one line naming the key."""
    source = Path(path)
    found = looked_up(source, ConfigError, "config file")
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"config file {source} is not a regular file (a pipe or a device would be read forever)")
    try:
        # utf-8-sig: Windows editors start a UTF-8 file with a byte-order mark, which TOML does not allow.
        raw = tomllib.loads(source.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        # Relative, the bare default said nothing of where it was looked for (`report` run from another folder).
        raise ConfigError(
            f"config file not found: {source.absolute()} (create one with `overnight init`, or name yours with --config)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {source}: {_not_utf8(exc)}") from None
    except OSError as exc:  # strerror: "Is a directory", not "[Errno 21] ...: '<the path again>'"
        raise ConfigError(f"cannot read config file {source}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as exc:  # an integer past Python's 4300-digit limit for reading one
        raise ConfigError(f"{source}: not valid TOML: {str(exc).split(';')[0]}") from None
    config = parse_config(raw, source=source)
    if require_tasks and not config.task:
        raise ConfigError(f"{source}: [[task]]: no tasks defined")
    return config


# Longest first: UTF-32's little-endian mark begins with UTF-16's.
_BYTE_ORDER_MARKS = {
    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16",
}


def _not_utf8(exc: UnicodeDecodeError) -> str:
    # Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16 with a byte-order mark: the codec's
    # words ("can't decode byte 0xff in position 0") did not say what to do about it.
    encoding = next((name for mark, name in _BYTE_ORDER_MARKS.items() if exc.object.startswith(mark)), None)
    if encoding is not None:
        return f"it is {encoding} (it starts with a {encoding} byte-order mark); save it as UTF-8"
    return str(exc)


def parse_config(raw: dict[str, Any], *, source: Path) -> Config:
    if "source" in raw:
        raise ConfigError(f"{source}: unknown key 'source'")
    with_nul = _first_nul(raw, ())
    if with_nul is not None:
        # TOML allows "\u0000"; no path, URL, git name or command can carry it (Python refuses it in each).
        raise ConfigError(f"{source}: {_key_name(with_nul)}: contains a NUL character (\\u0000), which no path, name or command can carry")
    try:
        return Config.model_validate({**raw, "source": source})
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_first_error(exc)}") from None


# pydantic's words for a wrong shape name its classes ("instance of ModelConfig", "<class 'pathlib.Path'>").
_PLAIN_WORDS = {
    "model_type": "must be a table ([section] with keys under it)",
    "dict_type": "must be a table ([section] with keys under it)",
    "path_type": "must be a path, as a string",
    "tuple_type": "must be a list",
}


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    error = errors[0]
    unknown = [each for each in errors if each["type"] == "extra_forbidden"]
    if error["type"] == "missing" and unknown:
        # A misspelt key (`promt`) also leaves its right one missing: the typo is what to name.
        error = unknown[0]
    key = _key_name(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key}{_meant(error, errors)}"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if error["type"] == "tuple_type" and key == "[[task]]":
        return f"{key}: write each task as a [[task]] table (two brackets), one per task"
    if error["type"] in _PLAIN_WORDS:
        return f"{key}: {_PLAIN_WORDS[error['type']]}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def _meant(unknown: Any, errors: list[Any]) -> str:
    """' (did you mean prompt?)' when a key of the same table is spelt close to the unknown one: first one the table
    misses (a misspelt required key leaves it missing), else any of its keys (`max_iteration`)."""
    table, written = unknown["loc"][:-1], str(unknown["loc"][-1])
    missing = [str(each["loc"][-1]) for each in errors if each["type"] == "missing" and each["loc"][:-1] == table]
    close = difflib.get_close_matches(written, missing, n=1) or difflib.get_close_matches(written, _keys_of(table), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _keys_of(table: tuple[Any, ...]) -> list[str]:
    """The keys the table at `table` (a pydantic loc: `("night",)`, `("task", 0)`) may hold; none where it is no table."""
    model: Any = Config
    for step in table:
        if isinstance(step, int):
            continue  # a [[task]]'s number: the table is the list's item
        field = model.model_fields.get(step) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = next((kind for kind in (field.annotation, *get_args(field.annotation)) if _is_table(kind)), None)
    return [field.alias or name for name, field in model.model_fields.items()] if _is_table(model) else []


def _is_table(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _first_nul(value: Any, loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Where the first string (a key, a value, a list item) holding a NUL is, as a pydantic loc."""
    if isinstance(value, str):
        return loc if "\0" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = (*loc, repr(key)) if "\0" in key else _first_nul(item, (*loc, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            # [[task]] items are named by their number; a list value (keep, custom) by its key alone.
            found = _first_nul(item, (*loc, index) if loc == ("task",) else loc)
            if found is not None:
                return found
    return None


def _key_name(loc: tuple[Any, ...]) -> str:
    """('task', 0, 'name') -> '[[task]] #1 name'; ('model', 'name') -> '[model] name'."""
    if not loc:
        return ""
    head, *rest = loc
    if head == "task" and rest and isinstance(rest[0], int):
        index, *rest = rest
        prefix = f"[[task]] #{index + 1}"
    elif head == "task":
        prefix = "[[task]]"
    elif head in Config.model_fields:
        prefix = f"[{head}]"
    else:
        return str(head)
    tail = ".".join(str(part) for part in rest)
    return f"{prefix} {tail}".rstrip()


# The reference config ships in the package so `overnight init` works from a wheel.
def example_config_text() -> str:
    from importlib.resources import files

    return files("orchestrator").joinpath("config.example.toml").read_text(encoding="utf-8")

