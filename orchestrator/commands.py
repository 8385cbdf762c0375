"""Run one shell command unattended: no input, a hard time limit, bounded output.

Shared by the task check and the agent's `run_check` / `run_command` tools.
Nobody is awake to answer a prompt, so a command gets no stdin and no pager, and
when its time is up everything it started dies with it. The parts are modules of their own:
its environment (command_environment), its output (command_output), the wait (command_wait),
its process group (process_groups) and what left the group (marked_processes).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

from orchestrator.command_environment import command_environment
from orchestrator.command_output import OutputCollector, output_of
from orchestrator.command_wait import wait_for_exit
from orchestrator.marked_processes import stop_marked_processes
from orchestrator.process_clock import ProcessClock
from orchestrator.process_groups import kill_group

TIMEOUT_EXIT_CODE = 124
# How long to wait for the output pipe to close once the command's processes are gone.
_DRAIN_GRACE_S = 2.0


@dataclass(frozen=True)
class CommandResult:
    """How a shell command ended; `output` is stdout and stderr merged, capped."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float


def run_shell(
    command: str,
    cwd: Path,
    timeout_s: float,
    max_output_chars: int,
    cancel: Any = None,
    *,
    extra_env: Mapping[str, str] | None = None,
    pass_env: Collection[str] = (),
    redact: Callable[[str], str] = str,
) -> CommandResult:
    """Run `command` with bash in `cwd`; kill its whole process group after `timeout_s`.

    With a `cancel` token (orchestrator.cancel.CancelToken), a cancellation kills
    the command too and raises Cancelled once the process group is gone.
    The command runs without overnight's secret-named variables (orchestrator/secrecy.py)
    but those named in `pass_env`; `extra_env` goes on top of the environment command_environment
    builds (the agent's commands: orchestrator/confinement.py).
    """
    started = time.monotonic()
    env = command_environment(cwd, extra_env, pass_env)
    began = ProcessClock.now()  # what the command starts comes after it
    process = _start_in_own_session(command, cwd, env)
    collector = OutputCollector(process.stdout, budget_bytes=max(4 * max_output_chars, 4096))
    collector.start()
    exit_code = _wait_then_stop_all(process, timeout_s, cancel, cwd, began)
    collector.join(_DRAIN_GRACE_S)
    timed_out = exit_code is None
    output = output_of(collector, max_output_chars, redact, timed_out_after=timeout_s if timed_out else None)
    return CommandResult(
        exit_code=TIMEOUT_EXIT_CODE if exit_code is None else exit_code,
        output=output,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def _start_in_own_session(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`command` started with bash, in a process group of its own, stdout and stderr on one pipe."""
    return subprocess.Popen(
        command,
        shell=True,
        executable=shutil.which("bash") or "/bin/sh",
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _wait_then_stop_all(process: subprocess.Popen[bytes], timeout_s: float, cancel: Any, cwd: Path, began: ProcessClock) -> int | None:
    """The command's exit code, None when `timeout_s` ran out; returned (or Cancelled raised) once
    nothing it started is left running: its process group, and what it started in `cwd` after `began`."""
    try:
        return wait_for_exit(process, timeout_s, cancel)
    except subprocess.TimeoutExpired:
        return None
    finally:
        # Also after a normal exit: a background child left running would hold
        # the pipe open and outlive the iteration that started it.
        kill_group(process.pid)
        process.wait()
        # And what left the group (`setsid cmd &`): it would write into the worktree after a rollback.
        stop_marked_processes(cwd, created_after=began)
