"""overnight's own git in a task's worktree: one command, bounded in time, never found by discovery.

The agent may break the worktree's `.git` link file (delete it, point it at the user's repository, `git init` over
it), so each command is told its repository (GIT_DIR: the worktree's admin folder) and its files (GIT_WORK_TREE); and
a clean or smudge filter the agent configured (`sleep 100000`) may never end, so each command has a time limit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.command_environment import GIT_IDENTITY, UNATTENDED_ENV, WORKTREE_GIT_ENV, base_environment
from orchestrator.process_groups import kill_group

# The most any of overnight's own git commands in a worktree may take. Far more than an honest
# one needs (a full checkout of a large repository included); a clean or smudge filter the agent
# configured (`sleep 100000`) would otherwise hang the night, SIGTERM included.
GIT_TIMEOUT_S = 600.0


def worktree_env(path: Path, admin: Path) -> dict[str, str]:
    """The environment of git in the worktree at `path`: no discovery from its folder, whatever `.git` holds."""
    return {**base_environment(), **UNATTENDED_ENV, **WORKTREE_GIT_ENV, "GIT_DIR": str(admin), "GIT_WORK_TREE": os.path.abspath(path)}


def run_git(
    args: tuple[str, ...], *, folder: Path, admin: Path, env: dict[str, str], timeout_s: float, identity: bool = False,
    extra_env: dict[str, str] | None = None, stdin: bytes | None = None,
) -> str:
    """One git command in the worktree at `folder` (its admin folder `admin`), given `stdin` when not None: its output,
    or GitCommandError (also when killed, with what it started, after `timeout_s`). Not GitPython's
    `kill_after_timeout`, which starts a timer thread for every command: four a commit, in the burst
    of tasks ending together."""
    import git

    command = ["git", *args]
    extra = {**(GIT_IDENTITY if identity else {}), **(extra_env or {})}
    process = subprocess.Popen(
        command,
        cwd=folder,
        env={**env, **extra} if extra else env,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own group, so that the limit ends a filter or hook it started too.
        process_group=0,
    )
    try:
        out, err = process.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        out, err = process.communicate()
        # The index lock it held would fail every later command.
        (admin / "index.lock").unlink(missing_ok=True)
        err += f"\ntimed out after {timeout_s:g}s: killed, with what it started".encode()
    if process.returncode != 0:
        raise git.GitCommandError(command, process.returncode, _text(err), _text(out))
    return _text(out)


def _text(output: bytes) -> str:
    """git's output as text; file names that are not UTF-8 survive the way back into a command."""
    return os.fsdecode(output).removesuffix("\n")
