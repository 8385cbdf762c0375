"""`[[task]]`: one task: its name (a branch and a folder), its prompt, the check that says it is done, and its tools."""

from __future__ import annotations

import re
import sys

from pydantic import Field, field_validator

from orchestrator.argument_limits import ARGUMENT_BYTES
from orchestrator.config_section import Section
from orchestrator.tool_names import DEFAULT_TOOLS, check_tool_names

_TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TaskConfig(Section):
    name: str
    prompt: str = Field(min_length=1)
    check: str = Field(min_length=1, description="shell command; exit 0 means the task is done")
    tools: tuple[str, ...] = DEFAULT_TOOLS
    # Secret-named environment variables (orchestrator/secrecy.py) the check still gets (a test
    # suite that needs a token); the agent's own commands never do.
    pass_env: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name_is_branch_safe(cls, value: str) -> str:
        # Also git's rules for a branch name that these characters can break.
        if not _TASK_NAME.fullmatch(value) or value.endswith((".lock", ".")) or ".." in value:
            raise ValueError(
                "must be 1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit, not ending in '.' "
                "or '.lock', without '..' (it names a branch and a folder)"
            )
        return value

    @field_validator("prompt", "check")
    @classmethod
    def _no_nul_nor_blank(cls, value: str) -> str:
        if "\0" in value:
            raise ValueError("contains a NUL character, which no command or prompt can carry")
        if not value.strip():  # sh -c '   ' exits 0: every submit would pass such a check
            raise ValueError("is blank (only whitespace); write what it should say or run")
        return value

    @field_validator("check")
    @classmethod
    def _runs_in_this_locale(cls, value: str) -> str:
        # A command goes to the shell in the locale's encoding: under a Latin-1 locale, '→' raised
        # UnicodeEncodeError in every iteration (an iteration_error, the task parked).
        encoding = sys.getfilesystemencoding()
        try:
            encoded = value.encode(encoding, "surrogateescape")
        except UnicodeEncodeError as exc:
            raise ValueError(f"holds {value[exc.start:exc.end]!r}, which this locale's encoding ({encoding}) cannot pass to a shell; run under a UTF-8 locale (LC_ALL=C.UTF-8)") from None
        if ARGUMENT_BYTES is not None and len(encoded) >= ARGUMENT_BYTES:
            raise ValueError(
                f"is {len(encoded)} bytes long, more than a shell's command line can carry here ({ARGUMENT_BYTES - 1}); "
                "put the commands in a script and make the check run it"
            )
        return value

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        check_tool_names(value)
        if "submit" not in value:
            value = (*value, "submit")
        return value

    @field_validator("pass_env")
    @classmethod
    def _variable_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _VARIABLE_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable's name (letters, digits and '_', not starting with a digit)")
        return value
