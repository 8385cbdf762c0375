"""A worktree's submodules rolled back, and the edits no commit of the task's can hold found.

A submodule is another repository: `reset --hard` and `clean` in the worktree reach neither the commit it has checked
out nor the files in it, and `add` records only which commit it is on (in one never checked out, git does not even
see its files).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from orchestrator.errors import QualityError
from orchestrator.staged import GITLINK
from orchestrator.writable import make_writable


def roll_back_submodules(git: Callable[..., str], path: Path) -> None:
    """What reset and clean do not reach: the checked-out submodules back on the commits the
    checkpoint records (the agent may have checked out another), cleaned; files the agent wrote
    into a submodule's folder that was never checked out (git sees none of them) removed."""
    import git as gitpython

    try:
        git("submodule", "--quiet", "update", "--force", "--recursive", "--no-fetch")
    except gitpython.GitCommandError:
        pass  # a recorded commit this clone lacks: at least each is reset to its own HEAD below
    git("submodule", "--quiet", "foreach", "--recursive", "git reset --hard --quiet && git clean -ffdxq")
    for folder in unpopulated_submodules(git, path):
        for entry in list(folder.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                make_writable(entry)
                shutil.rmtree(entry)
            else:
                entry.unlink()


def unpopulated_submodules(git: Callable[..., str], path: Path) -> list[Path]:
    """The folders of submodules not checked out that hold files. The submodules are the index's
    gitlinks, not what .gitmodules says: an entry left there after a submodule was vendored in
    names a folder of tracked files."""
    found = []
    for entry in git("ls-files", "--stage", "-z").split("\0"):
        mode, _, rest = entry.partition(" ")
        if mode != GITLINK:
            continue
        folder = path / rest.split("\t", 1)[1]
        if folder.is_dir() and not folder.is_symlink() and not os.path.lexists(folder / ".git") and any(folder.iterdir()):
            found.append(folder)
    return found


def refuse_left_in_submodules(git: Callable[..., str], path: Path, uncommitted: Callable[[], list[str]]) -> None:
    """QualityError when a change is still uncommitted after the commit (`uncommitted()` lists what differs): edits
    inside a submodule (another repository: `add` records only which commit it is on; in one never checked out, git
    does not even see them), which the check passed on and no commit of the task's holds. Asked
    only where there are submodules (a file's existence otherwise)."""
    if not (path / ".gitmodules").exists():
        return
    left = uncommitted() + [f"{folder.relative_to(path).as_posix()}/" for folder in unpopulated_submodules(git, path)]
    if left:
        raise QualityError(
            "iteration_error",
            "Your changes inside a submodule (another repository in this one) cannot be committed on the task's "
            "branch, so they were undone. Change only the files of this repository itself.",
            evidence="left uncommitted: " + ", ".join(left[:10]),
            message=f"changes no commit can hold: {', '.join(left[:3])}",
        )
