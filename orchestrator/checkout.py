"""Where a folder lies as git sees it: the checkout around it, or the git folder it is in.

git itself, not GitPython: importing that runs `git version` (a tenth of a second, and an ImportError
where git is broken), and `overnight init` asks this where it should be instant. Where git cannot tell
(not on PATH, broken, a repository it refuses as another user's, a folder not there) the answer is
None: nothing is judged.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.command_environment import base_environment


def checkout_around(folder: Path) -> str | None:
    """The top folder of the git checkout `folder` lies inside, when `folder` is not that top itself; else None."""
    top = checkout_top(folder)
    return top if top is not None and os.path.realpath(top) != os.path.realpath(folder) else None


def checkout_top(folder: Path) -> str | None:
    """The top folder of the git checkout `folder` lies inside or is; None where there is none."""
    said = _rev_parse(folder, "--show-toplevel")
    return said[0] if said else None


def first_tracked(top: Path, relative: str) -> str | None:
    """The first file git tracks at or under `relative` in the checkout at `top`; None where there is none, or git cannot tell."""
    try:
        # `:(literal)`: a folder named `*` or `[ab]` is that folder, not a pattern over the whole checkout.
        found = subprocess.run(
            ["git", "ls-files", "-z", "--", f":(literal){relative}"], cwd=top, env=base_environment(),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if found.returncode != 0:
        return None
    return os.fsdecode(found.stdout).split("\0")[0] or None


def git_folder_around(folder: Path) -> str | None:
    """The git folder `folder` lies in: a checkout's `.git`, a linked worktree's folder in it, a bare repository; else None."""
    said = _rev_parse(folder, "--is-inside-git-dir", "--absolute-git-dir")
    if not said:
        return None
    inside, git_folder = said
    # git answers "false" in a git folder itself that names its checkout in core.worktree (a submodule's
    # .git/modules/<name>, a bare dotfiles repository): asked there, --show-toplevel named that checkout.
    return git_folder if inside == "true" or os.path.realpath(git_folder) == os.path.realpath(folder) else None


def _rev_parse(folder: Path, *asked: str) -> list[str] | None:
    """What `git rev-parse <asked>` prints in `folder`, a line for each thing asked (a path asked last); None where it fails."""
    try:
        # Without an inherited GIT_DIR or GIT_WORK_TREE, which would name another repository than the folder's.
        found = subprocess.run(
            ["git", "rev-parse", *asked], cwd=folder, env=base_environment(),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):  # no git on PATH, the folder not there, a git that hangs
        return None
    # Split only as many times as needed: the last thing asked is a path, which may itself hold a line break.
    lines = os.fsdecode(found.stdout).removesuffix("\n").split("\n", len(asked) - 1)
    return lines if found.returncode == 0 and len(lines) == len(asked) and all(lines) else None
