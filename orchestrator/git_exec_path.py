"""What the git front learns of this machine's git when it is written: git's own commands, which win over an
alias of the same name, and git's exec path copied in links, where git itself and the dashed names of its builtins
(git-stash) lead to the front, so that what git runs (rebase --exec, bisect run, an alias's shell) meets the front too.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path


# git's commands that a model runs most, for a git that cannot list its own (an alias of one of them is never run).
_COMMON_GIT_COMMANDS = (
    "add", "blame", "branch", "checkout", "cherry-pick", "clone", "commit", "config", "diff", "fetch", "grep", "init",
    "log", "ls-files", "merge", "mv", "pull", "push", "rebase", "reset", "restore", "rev-parse", "rm", "show", "stash",
    "status", "switch", "tag",
)


def gits_own_commands(git: str) -> list[str]:
    """The names of `git`'s builtins and of the programs in its exec path, which git runs before an alias of the same name."""
    try:
        listed = subprocess.run([git, "--list-cmds=builtins,main"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    # Names only: they go into the front's text.
    names = [name for name in listed if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name)]
    return names or list(_COMMON_GIT_COMMANDS)


def link_exec_path(folder: Path, git: str, front: Path) -> str | None:
    """`folder` made a copy of `git`'s exec path in links, but for its `git` and the dashed names of its builtins
    (git-stash), which lead to the `front`. The exec path it copies, or None when it could not."""
    try:
        real = subprocess.run([git, "--exec-path"], capture_output=True, text=True, timeout=30).stdout.strip()
        names = os.listdir(real) if real else []
    except (OSError, subprocess.SubprocessError):
        return None
    if "git" not in names:  # what git runs finds the front on PATH then, after git's folder
        return None
    builtins = _builtins(git)
    try:
        folder.mkdir()
        for name in names:
            (folder / name).symlink_to(front if _runs_as_git(name, builtins) else Path(real) / name)
    except OSError:  # a file system without links: the front as before, a shell's git past it
        return None
    return real


def _builtins(git: str) -> set[str]:
    """The commands `git` runs in its own process (none when it cannot list them)."""
    try:
        return set(subprocess.run([git, "--list-cmds=builtins"], capture_output=True, text=True, timeout=30).stdout.split())
    except (OSError, subprocess.SubprocessError):
        return set()


def _runs_as_git(name: str, builtins: set[str]) -> bool:
    """Whether the program `name` of git's exec path is git itself: `git`, or a builtin's dashed name (git-stash), git
    run under another name as `git stash`. Only a builtin's: `git bisect` of a git whose bisect is the script git-bisect
    runs that script, which, led to the front, would run the front again, and again."""
    return name == "git" or (name.startswith("git-") and name[len("git-"):] in builtins)
