"""The tools that run shell commands in the worktree: run_check (the task's check) and run_command (the agent's own,
behind confinement.py's fences, with the repository's shared config put back after it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator.command_endings import how_it_ended
from orchestrator.commands import run_shell
from orchestrator.confinement import Confinement, agent_environment
from orchestrator.records import ToolResult
from orchestrator.shared_config import CONFIG_RESTORED, kept_config
from orchestrator.tool_refusal import Refused


def run_check(
    root: Path, check_command: str, timeout_s: float, max_output_chars: int, *, cancel: Any, pass_env: Sequence[str],
    redact: Callable[[str], str],
) -> ToolResult:
    """The `run_check` tool: the task's check, with the secret-named variables in `pass_env`; ok when it exits 0."""
    result = run_shell(check_command, root, timeout_s, max_output_chars, cancel=cancel, pass_env=pass_env, redact=redact)
    if result.timed_out:
        return ToolResult(False, f"the check timed out after {timeout_s:g}s\n{result.output}")
    if result.exit_code == 0:
        return ToolResult(True, f"the check passed (exit code 0)\n{result.output}".rstrip())
    return ToolResult(False, f"the check failed: {how_it_ended(result.exit_code)}\n{result.output}".rstrip())


def run_command(
    root: Path, command: str, timeout_s: float, max_output_chars: int, *, cancel: Any, confinement: Confinement | None,
    redact: Callable[[str], str],
) -> ToolResult:
    """The `run_command` tool: the agent's shell command, behind `confinement`'s fences; ok when it exits 0."""
    if not command.strip():
        raise Refused("the command is empty; give a shell command to run")
    if "\0" in command:
        raise Refused("the command contains a NUL character, which a shell command cannot hold; write it without one")
    shared_config = confinement.shared_config if confinement else None
    with kept_config(shared_config, confinement.config_copy if confinement else None) as config:
        result = run_shell(
            command, root, timeout_s, max_output_chars, cancel=cancel, extra_env=agent_environment(confinement), redact=redact,
        )
    output = f"{how_it_ended(result.exit_code)}\n{result.output}".rstrip()
    return ToolResult(result.exit_code == 0, f"{output}\n{CONFIG_RESTORED}" if config.restored else output)
