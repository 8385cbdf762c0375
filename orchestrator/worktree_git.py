"""overnight's own git in a task's worktree: one command, bounded in time, never found by discovery.

The agent may break the worktree's `.git` link file (delete it, point it at the user's repository, `git init` over
it), so each command is told its repository (GIT_DIR: the worktree's admin folder) and its files (GIT_WORK_TREE); and
a clean or smudge filter the agent configured (`sleep 100000`) may never end, so each command has a time limit.
A command given the night's cancel token (a first checkout: a minute and more on a large repository) is also
stopped by a cancel.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.command_environment import GIT_IDENTITY, worktree_git_environment
from orchestrator.errors import Cancelled
from orchestrator.process_groups import kill_group

# The most any of overnight's own git commands in a worktree may take. Far more than an honest
# one needs (a full checkout of a large repository included); a clean or smudge filter the agent
# configured (`sleep 100000`) would otherwise hang the night, SIGTERM included.
GIT_TIMEOUT_S = 600.0
# How often a command given a cancel token looks at it.
_CANCEL_POLL_S = 0.1


def worktree_env(path: Path, admin: Path) -> dict[str, str]:
    """The environment of git in the worktree at `path`: no discovery from its folder, whatever `.git` holds."""
    return {**worktree_git_environment(), "GIT_DIR": str(admin), "GIT_WORK_TREE": os.path.abspath(path)}


def run_git(
    args: tuple[str, ...], *, folder: Path, admin: Path, env: dict[str, str], timeout_s: float, identity: bool = False,
    extra_env: dict[str, str] | None = None, stdin: bytes | None = None, cancel: Any = None,
) -> str:
    """One git command in the worktree at `folder` (its admin folder `admin`), given `stdin` when not None: its output,
    or GitCommandError (also when killed, with what it started, after `timeout_s`). Not GitPython's
    `kill_after_timeout`, which starts a timer thread for every command: four a commit, in the burst
    of tasks ending together.

    `cancel` (a CancelToken): when it is set, the command is killed with what it started and Cancelled raised;
    not started at all when it is set already. Only for a command nothing needs to finish: a rollback after a
    cancel must run to its end."""
    import git

    if cancel is not None:
        cancel.raise_if_cancelled()

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
        out, err = _communicate(process, stdin, timeout_s, cancel)
    except subprocess.TimeoutExpired:
        out, err = _killed(process, admin)
        err += f"\ntimed out after {timeout_s:g}s: killed, with what it started".encode()
    except Cancelled:
        _killed(process, admin)
        raise
    if process.returncode != 0:
        raise git.GitCommandError(command, process.returncode, _text(err), _text(out))
    return _text(out)


def _communicate(process: subprocess.Popen[bytes], stdin: bytes | None, timeout_s: float, cancel: Any) -> tuple[bytes, bytes]:
    """`process.communicate(stdin, timeout_s)`; with a `cancel` token, Cancelled (the process left running) once it is
    set, looked at every _CANCEL_POLL_S. (communicate, called again after its timeout, goes on where it was.)"""
    if cancel is None or stdin is not None:
        # communicate called again after its timeout does not go on writing what stdin it had left (and refuses it
        # given again): a command fed stdin is not stopped by a cancel. None is: the first checkout has no stdin.
        return process.communicate(stdin, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return process.communicate(stdin, timeout=max(0.0, min(_CANCEL_POLL_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(process.args, timeout_s) from None
            cancel.raise_if_cancelled()


def _killed(process: subprocess.Popen[bytes], admin: Path) -> tuple[bytes, bytes]:
    """What `process` wrote, once it is killed with what it started (its process group)."""
    kill_group(process.pid)
    out, err = process.communicate()
    # The index lock it held would fail every later command.
    (admin / "index.lock").unlink(missing_ok=True)
    return out, err


def _text(output: bytes) -> str:
    """git's output as text; file names that are not UTF-8 survive the way back into a command."""
    return os.fsdecode(output).removesuffix("\n")
