"""The agent's tools, bound to one task's worktree.

Every path stays inside the worktree and out of `.git` (tool_paths.py). Each tool judges its
own outcome (`ToolResult.ok`) and, when it fails, says in one line what the
model should do instead: a small model follows a plain instruction better than
it debugs an error. The Toolbox checks a call and hands it to its tool: reading_tools.py (read_file,
list_dir), writing_tools.py (write_file, edit_file), project_search.py (search), command_tools.py
(run_check, run_command); every output it gives back is redacted and capped the same way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator.command_output import cap_text
from orchestrator.command_tools import run_check, run_command
from orchestrator.confinement import Confinement
from orchestrator.project_search import search_project
from orchestrator.reading_tools import list_dir, read_file
from orchestrator.records import BrokenCall, ModelResponse, ToolCall, ToolResult
from orchestrator.surrogates import mend
from orchestrator.tokens import window_chars
from orchestrator.tool_names import check_tool_names
from orchestrator.tool_paths import ToolPaths
from orchestrator.tool_refusal import Refused
from orchestrator.tool_schemas import SCHEMAS, offered, schemas_of
from orchestrator.toolcalls import arguments_problem, parse_calls
from orchestrator.writing_tools import edit_file, write_file

# One tool result may take about this share of the model's context window (at ~3 chars a token),
# so that the prompt, the history and the next few results still fit: 1843 chars for 4096 tokens.
DEFAULT_OUTPUT_CHARS = 8000
_MIN_OUTPUT_CHARS = 1500
_OUTPUT_SHARE_OF_WINDOW = 0.15


def output_cap_for(context_window: int | None) -> int:
    """The most chars one tool result shows a model with this context window (in tokens; None: not known)."""
    if not context_window:
        return DEFAULT_OUTPUT_CHARS
    share = window_chars(context_window, _OUTPUT_SHARE_OF_WINDOW)
    return max(_MIN_OUTPUT_CHARS, min(DEFAULT_OUTPUT_CHARS, share))


class Toolbox:
    """The tools one task may use, confined to `root`."""

    def __init__(
        self,
        root: Path,
        allowed: Sequence[str],
        *,
        check_command: str,
        check_timeout_s: float = 600,
        command_timeout_s: float = 120,
        max_output_chars: int = DEFAULT_OUTPUT_CHARS,
        cancel: Any = None,
        confinement: Confinement | None = None,
        pass_env: Sequence[str] = (),
        redact: Callable[[str], str] = str,
    ) -> None:
        """`confinement`: the task's branch and the repository's shared config, which the agent's
        commands may not change (without it, in a folder that is no task's worktree, editors
        are still refused and `git config --global` still kept from the user's). `pass_env`: the
        secret-named variables the check (run_check) still gets, which the agent's own commands never
        do; `redact`: what every output goes through (orchestrator/redactor.py)."""
        check_tool_names(allowed)
        self._paths = ToolPaths(root)
        self.root = self._paths.root
        self._allowed = offered(allowed)
        self._check_command = check_command
        self._check_timeout_s = check_timeout_s
        self._command_timeout_s = command_timeout_s
        self._max_output_chars = max_output_chars
        self._cancel = cancel
        self._confinement = confinement
        self._pass_env = tuple(pass_env)
        self._redact = redact
        self._handlers: dict[str, Callable[..., ToolResult]] = {
            "read_file": self._read_file,
            "write_file": self._write_file,
            "edit_file": self._edit_file,
            "list_dir": self._list_dir,
            "search": self._search,
            "run_check": self._run_check,
            "submit": self._submit,
            "run_command": self._run_command,
        }

    def names(self) -> list[str]:
        return list(self._allowed)

    def schemas(self) -> list[dict[str, Any]]:
        return schemas_of(self._allowed)

    def parse(self, response: ModelResponse) -> list[ToolCall | BrokenCall]:
        return parse_calls(response, self.schemas())

    def execute(self, call: ToolCall) -> ToolResult:
        if call.name not in self._allowed:
            return ToolResult(False, f"there is no tool named {call.name!r}; use one of: {', '.join(self._allowed)}")
        problem = arguments_problem(SCHEMAS[call.name]["function"]["parameters"], call.arguments)
        if problem:
            return ToolResult(False, f"{call.name}: {problem}")
        try:
            result = self._handlers[call.name](**call.arguments)
        except Refused as refusal:
            # A refusal may quote the file (edit_file's lines alike): capped and redacted as any output.
            return ToolResult(False, self._as_shown_to_the_model(str(refusal)))
        except (OSError, UnicodeError) as exc:
            # The worktree's absolute path would lead the model to paths the tools refuse.
            error = f"{exc.__class__.__name__}: {exc}".replace(self._paths.root_text + os.sep, "")
            return ToolResult(False, self._as_shown_to_the_model(f"{call.name} failed: {error}"))
        return ToolResult(result.ok, self._as_shown_to_the_model(result.output), result.submitted)

    def _as_shown_to_the_model(self, output: str) -> str:
        # A file name that is not UTF-8 comes back from the file system as lone surrogates, which
        # no transcript or database could write: shown as escapes (orchestrator/surrogates.py).
        return cap_text(self._redact(mend(output)), self._max_output_chars)

    # --- the tools: each one's arguments, as its schema gives them, and the module that runs it ---

    def _read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        return read_file(self._paths, path, start_line, end_line, max_output_chars=self._max_output_chars, redact=self._redact)

    def _write_file(self, path: str, content: str) -> ToolResult:
        return write_file(self._paths, path, content)

    def _edit_file(self, path: str, old: str, new: str) -> ToolResult:
        return edit_file(self._paths, path, old, new)

    def _list_dir(self, path: str = ".") -> ToolResult:
        return list_dir(self._paths, path)

    def _search(self, pattern: str, path: str = ".") -> ToolResult:
        return search_project(self._paths, pattern, path, cancel=self._cancel, redact=self._redact)

    def _run_check(self) -> ToolResult:
        return run_check(
            self.root, self._check_command, self._check_timeout_s, self._max_output_chars, cancel=self._cancel, pass_env=self._pass_env,
            redact=self._redact,
        )

    def _submit(self, summary: str) -> ToolResult:
        return ToolResult(True, "submitted", submitted=True)

    def _run_command(self, command: str) -> ToolResult:
        return run_command(
            self.root, command, self._command_timeout_s, self._max_output_chars, cancel=self._cancel, confinement=self._confinement,
            redact=self._redact,
        )
