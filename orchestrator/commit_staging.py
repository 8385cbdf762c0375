"""What an iteration's commit stages: every change the agent left that is work, in as few git processes as may be.

New files under `[repo] keep` and repositories the agent made inside the worktree are left out (see `add_all`);
a sparse checkout's worktree also stages what the agent wrote outside its patterns.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from orchestrator.add_paths import fewest_exclusions
from orchestrator.work_paths import tracked_paths, untracked, untracked_all


def add_all(git: Callable[..., str], admin: Path, keep: Sequence[str]) -> str:
    """`git add --all --verbose`, new files under `keep` paths and nested repositories left out; in a sparse
    checkout with --sparse, which also takes what the agent wrote outside it (git >= 2.34: an older git,
    which has no such option, adds without it)."""
    import git as gitpython

    new = untracked_all(git)
    # New files under `[repo] keep` paths (a check's .venv or build cache that .gitignore does not
    # name) are no work, as for a rollback, gc and a kept branch: staged, they went onto the task's
    # branch and into the morning's merge.
    kept_new = set(new) - set(untracked(git, keep)) if keep else set()
    # A repository the agent made inside the worktree (`git init` or `git clone` into a folder; a nested
    # repository is listed as its folder) is left out, as kept branches and the rollback's cleaning leave
    # it: git would add only a link to its commit, which exists in that folder alone and no clone of the
    # task's branch can check out, never its files; and one with no commit yet failed the whole add.
    leave_out = [name for name in new if name.endswith("/") or name in kept_new]
    if kept_new:
        # One exclusion per file cost git a match of every path against every exclusion: a .venv's
        # 5,000 files in a 20,000-file project made each commit seconds of CPU. A folder holding no
        # work (no tracked file, no new file outside `keep`) is left out whole instead.
        work = [name for name in new if name not in kept_new]
        leave_out = fewest_exclusions(leave_out, work + tracked_paths(git))
    with tempfile.TemporaryDirectory(prefix="overnight-add-") if leave_out else contextlib.nullcontext() as folder:
        pathspec: list[str] = []
        if folder is not None:
            # From a file: a .venv's thousands of files would not fit on a command line.
            listed = Path(folder) / "pathspec"
            listed.write_bytes(b"\0".join(os.fsencode(spec) for spec in [".", *(f":(exclude,literal){name}" for name in leave_out)]))
            pathspec = [f"--pathspec-from-file={listed}", "--pathspec-file-nul"]
        if not (admin / "info" / "sparse-checkout").exists():
            return git("add", "--all", "--verbose", *pathspec)
        try:
            return git("add", "--all", "--verbose", "--sparse", *pathspec)
        except gitpython.GitCommandError as exc:
            if "sparse" not in str(exc.stderr) or "unknown option" not in str(exc.stderr):
                raise
            return git("add", "--all", "--verbose", *pathspec)


def has_staged_changes(git: Callable[..., str]) -> bool:
    """Whether the index differs from HEAD."""
    import git as gitpython

    try:
        git("diff", "--cached", "--quiet")
    except gitpython.GitCommandError as exc:
        if exc.status == 1:  # --quiet's "there are"
            return True
        raise
    return False
