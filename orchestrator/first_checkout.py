"""The files of a newly registered task worktree checked out, whole whatever the user's sparse checkout.

Registration (worktree_registration.py) is `git worktree add --no-checkout`, serialised; the checkout of the files,
the slow part in a large repository, runs in parallel after it, here. A worktree with no index yet (registered just
now, or by a night killed before this step) is checked out again: an empty index would commit every file as deleted.

The checkout is the one git of a night's that a cancel kills (a minute and more on a large repository, which
SIGTERM waited for): git writes the index last, so one cut short leaves a worktree with no index, its files
half written, which the next night's recovery leaves alone (idle_worktrees.py: nothing there is anyone's) and
this checks out whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from orchestrator.git_errors import git_reason
from orchestrator.worktree_registration import creation_error, with_git_status


def check_out_files(git: Callable[..., str], path: Path, admin: Path, task: str, cancel: Any = None) -> None:
    """Check out the files of the worktree at `path` if it has no index yet; StateError naming `task` when git cannot,
    Cancelled (git killed) when `cancel`, the night's token, is set."""
    import git as gitpython

    if (admin / "index").exists():
        return
    try:
        _not_sparse(git, admin)
        git("reset", "--hard", "--quiet", cancel=cancel)
    except (gitpython.GitCommandError, OSError) as exc:
        failed = creation_error(f"cannot check out the files of task {task!r} at {path}", git_reason(exc), path)
        raise with_git_status(failed, exc) from None


def _not_sparse(git: Callable[..., str], admin: Path) -> None:
    """Leave out of this new worktree the sparse checkout `git worktree add` copied from the user's checkout
    (git >= 2.36: its patterns, and its config.worktree when extensions.worktreeConfig is on).

    Otherwise the files of the task's branch outside the user's patterns (the check's script, the code to fix)
    were missing here, and the task failed its check every night. Both are this worktree's own copies: the
    user's checkout keeps its patterns. Without a patterns file git checks out every file, even where the
    repository's shared config says core.sparseCheckout.
    """
    (admin / "info" / "sparse-checkout").unlink(missing_ok=True)
    own_config = admin / "config.worktree"
    if own_config.exists():
        git("config", "--file", str(own_config), "core.sparseCheckout", "false")
