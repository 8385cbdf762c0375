"""The checks before a command begins its work: git on PATH, a log format we know, `run`'s --scheduled-for and the
report files it will write (--junit, $GITHUB_STEP_SUMMARY). Each raises ConfigError (exit 2) with the option named."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from datetime import datetime


def require_git() -> None:
    """git on PATH, and able to start, before anything imports GitPython (whose import fails with a 20-line banner
    without it) or runs it: cron's PATH may lack git's folder."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        raise ConfigError(f"git not found on PATH (PATH={os.environ.get('PATH', '')}); install git or add its folder to PATH")
    # GitPython's import runs `git version` here too, and a git that refuses to start (a broken ~/.gitconfig or
    # /etc/gitconfig: "fatal: bad config line 1") failed it with a traceback, exit 1.
    try:
        version = subprocess.run(["git", "version"], capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    except OSError as error:
        raise ConfigError(f"git cannot be run: {error}") from None
    if version.returncode != 0:
        said = version.stderr.strip().splitlines() or ["it said nothing"]
        raise ConfigError(f"git cannot run (`git version` exited {version.returncode}): {said[-1]}")


def check_log_format(log_format: str) -> None:
    from orchestrator.logs import LOG_FORMATS

    if log_format not in LOG_FORMATS:
        raise ConfigError(f"--log-format must be one of {', '.join(LOG_FORMATS)}")


def fire_time(text: str) -> datetime:
    """`--scheduled-for`'s time: ISO 8601 with its UTC offset, in the years the run store holds."""
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


def check_writable(path: Path, option: str) -> None:
    """Before the night, not after it: a report that cannot be written is found out at once."""
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


def check_not_ours(path: Path, option: str, settings: object, repo: object) -> None:
    """A report must not be written over the config, anything in the state dir (notes.md),
    the run store, wherever `[store] url` puts it, or the repository's .git (its config, its refs)."""
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


def summary_refused(settings: object, repo: object) -> str:
    """Why $GITHUB_STEP_SUMMARY will not be appended to, or "": it names one of our own files (the
    config, notes.md, the run store), where the summary would break the next night. GitHub's to get
    right, like its other failures: the night runs, and the log says what was not written."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    try:
        if summary:
            check_not_ours(Path(summary), "$GITHUB_STEP_SUMMARY", settings, repo)
    except ConfigError as refused:
        return f"not appending the step summary: {refused}"
    return ""
