"""A worktree's `.git` link file, put back as git wrote it whenever the agent removed or changed it.

overnight's own git does not need it (GIT_DIR, see worktree_git.py), but the agent's next commands, the check and the
person reviewing the worktree do; and a `.git` folder (`git init`) would otherwise be a second repository inside the
worktree that neither `clean` nor `add` touches.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.files import remove_entry
from orchestrator.gitdir import gitdir_link, names_back


def link_content(path: Path, admin: Path) -> bytes:
    """What `path/.git` must hold, the worktree's admin folder being `admin` (as found, perhaps relative): as git
    wrote it when intact (it may be relative), else a fresh absolute link."""
    if admin == gitdir_link(path):
        return (path / ".git").read_bytes()
    return b"gitdir: " + os.fsencode(os.path.abspath(admin)) + b"\n"


def restore_link(path: Path, admin: Path, content: bytes) -> None:
    """Put `path/.git` back as `content` if the agent removed or changed it (a file read when it did not), and the
    registration's link in `admin` back to it (`git worktree move` changes both)."""
    link = path / ".git"
    try:
        if stat.S_ISREG(os.lstat(link).st_mode) and link.read_bytes() == content:
            return
    except OSError:
        pass
    if os.path.lexists(link):
        remove_entry(link)
    path.mkdir(parents=True, exist_ok=True)  # the agent may have removed the whole folder: reset --hard refills it
    link.write_bytes(content)
    if not names_back(admin, path):  # `git worktree move`: the registration names the new folder
        (admin / "gitdir").write_bytes(os.fsencode(os.path.abspath(link)) + b"\n")
