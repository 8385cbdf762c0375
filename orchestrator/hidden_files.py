"""Files the agent or a person hid from git in a worktree's index (`git update-index --skip-worktree` or
`--assume-unchanged`), seen and unhidden.

The bits survive `reset --hard`, which then leaves such a file as the agent changed it, and hide it from status and
add: a commit would leave out a change the check passed on, and a person's edit kept out of commits so would look
like no change at all and be deleted with the worktree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from orchestrator.gitdir import index_may_hide_files


def unhide_hidden_files(git: Callable[..., str], path: Path, admin: Path) -> None:
    """Clear the hiding bits in the worktree's index. A process only when the index has such bits."""
    if index_may_hide_files(admin / "index"):
        clear_hiding_bits(git, path, admin)


def status_seeing_hidden_files(git: Callable[..., str], path: Path, admin: Path, *status: str) -> str:
    """`git status` that also reports the files the index hides from it. Asked of a copy of the index without
    those bits: the worktree's own stays as the person set it. A process more only when the index has such bits."""
    if not index_may_hide_files(admin / "index"):
        return git(*status)
    with tempfile.TemporaryDirectory(prefix="overnight-status-") as folder:
        index = {"GIT_INDEX_FILE": os.path.join(folder, "index"), "GIT_LITERAL_PATHSPECS": "1"}
        shutil.copyfile(admin / "index", index["GIT_INDEX_FILE"])
        clear_hiding_bits(git, path, admin, index)
        return git(*status, env=index)


def clear_hiding_bits(git: Callable[..., str], path: Path, admin: Path, index: dict[str, str] | None = None) -> None:
    """Clear the skip-worktree and assume-unchanged bits in the worktree's index, or in the one `index` names
    (GIT_INDEX_FILE), but not a sparse checkout's own on the files it leaves out: absent on purpose, they are
    no deletion; a file the agent wrote outside it loses the bit: that is work."""
    tagged = [(entry[:1], entry[2:]) for entry in git("ls-files", "-v", "-z", env=index).split("\0") if entry[1:2] == " "]
    skipped = [name for tag, name in tagged if tag in ("S", "s")]
    # A sparse checkout's skip-worktree bits are its own (and git clears those of files present on disk itself).
    if (admin / "info" / "sparse-checkout").exists():
        skipped = [name for name in skipped if os.path.lexists(path / name)]
    assumed = [name for tag, name in tagged if tag.islower()]
    # One flag per run: given both, update-index applies only the last.
    for flag, names in (("--no-skip-worktree", skipped), ("--no-assume-unchanged", assumed)):
        for start in range(0, len(names), 1000):  # a command line holds only so many paths
            git("update-index", flag, "--", *names[start : start + 1000], env=index)
