"""`overnight init`'s writing of the config file: only at the top of a checkout, and whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.config_paths import DEFAULT_CONFIG_NAME
from orchestrator.errors import ConfigError


def config_file_named(given: str) -> Path:
    """The config file `-c` names, or ConfigError when its path can only name a folder (`newdir/`, `newdir/.`):
    as a Path it reads as the file `newdir`, which init wrote."""
    if given and os.path.basename(given) in ("", ".", ".."):
        example = os.path.join(given, DEFAULT_CONFIG_NAME)
        raise ConfigError(f"cannot write {given}: it names a folder, not a file (give the file's path, like {example})")
    return Path(given)


def write_example_config(config: Path, force: bool) -> None:
    """`config` holds the commented example; an existing file only with `force`, and never a folder, pipe or device."""
    import stat

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


# The reference config ships in the package so `overnight init` works from a wheel.
def example_config_text() -> str:
    from importlib.resources import files

    return files("orchestrator").joinpath("config.example.toml").read_text(encoding="utf-8")


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
