"""The first two messages of an iteration: how to work, and what to do.

Small models follow a worked example far better than rules, so the system
prompt shows one complete exchange, made of the task's own tools only: a step
naming a tool the task does not offer would be copied, and be an unknown tool.
The task's notes from earlier iterations carry each failure's reason code and
correction forward.
"""

from __future__ import annotations

import json

from typing import Sequence

from orchestrator.protocols import Message

SYSTEM_PROMPT = """\
You are a careful software engineer working alone in a git repository.
You act only by calling tools, one small step at a time. Paths are relative to the repository root.

How to work:
{steps}

Example of one good exchange:
- task: "greet() should return 'hello'"
{example}

Call tools through the tool-calling interface. If you cannot, write one call per answer exactly like this:
{written}
Never repeat a call that already gave you its answer. If something fails twice, try another approach.
Tools you have: {tools}.
"""

# (the tool it takes, how the example shows it); the first of a group whose tool the task offers is shown.
_EXAMPLE = (
    (("list_dir", 'you call list_dir with {"path": "."} and see app.py'),),
    (("read_file", "you call read_file with {\"path\": \"app.py\"} and see: def greet(): return 'helo'"),),
    (
        ("edit_file", "you call edit_file with {\"path\": \"app.py\", \"old\": \"'helo'\", \"new\": \"'hello'\"}"),
        ("write_file", "you call write_file with {\"path\": \"app.py\", \"content\": \"def greet(): return 'hello'\\n\"}"),
        ("run_command", "you call run_command with {\"command\": \"sed -i s/helo/hello/ app.py\"}"),
    ),
    (("run_check", "you call run_check with {} and it passes"),),
    (("submit", 'you call submit with {"summary": "fixed the typo in greet()"}'),),
)


def build_messages(*, task_prompt: str, check: str, tool_names: Sequence[str], notes: str) -> list[Message]:
    system = (
        SYSTEM_PROMPT.replace("{steps}", _steps(tool_names))
        .replace("{example}", _example(tool_names))
        .replace("{written}", _written(tool_names))
        .replace("{tools}", ", ".join(tool_names))
    )
    parts = [f"Task:\n{task_prompt.strip()}", f"The task is done when this check passes: `{check}`"]
    if notes.strip():
        parts.append(
            "Earlier attempts at this task failed and were rolled back. "
            "Read why, and do not make the same mistake again:\n\n" + notes.strip()
        )
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def _steps(tools: Sequence[str]) -> str:
    offered = set(tools)
    look = _either([name for name in ("list_dir", "read_file", "search") if name in offered], "and")
    change = _either([name for name in ("write_file", "edit_file", "run_command") if name in offered], "or")
    steps = []
    if look:
        steps.append(f"Look before you change: {look} the files the task names.")
    if change:
        steps.append(f"Make the smallest change that does the task, with {change}.")
    if "run_check" in offered:
        steps.append("Call run_check to see whether the task is done.")
        steps.append("When run_check passes, call submit with a one-line summary. Do not submit before.")
    else:
        steps.append("When the task is done, call submit with a one-line summary; the check then runs.")
    return "\n".join(f"{number}. {step}" for number, step in enumerate(steps, 1))


def _example(tools: Sequence[str]) -> str:
    offered = set(tools)
    lines = [next((line for name, line in group if name in offered), None) for group in _EXAMPLE]
    return "\n".join(f"- {line}" for line in lines if line)


# The call the written form shows: the first of these the task offers (one it does not would be an unknown tool).
_WRITTEN = (
    ("read_file", {"path": "app.py"}),
    ("list_dir", {"path": "."}),
    ("run_check", {}),
    ("edit_file", {"path": "app.py", "old": "'helo'", "new": "'hello'"}),
    ("write_file", {"path": "app.py", "content": "def greet(): return 'hello'\n"}),
    ("run_command", {"command": "cat app.py"}),
    ("submit", {"summary": "fixed the typo in greet()"}),
)


def _written(tools: Sequence[str]) -> str:
    name, arguments = next(((name, arguments) for name, arguments in _WRITTEN if name in tools), _WRITTEN[-1])
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _either(names: list[str], joined_by: str) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {joined_by} {names[-1]}" if names else ""
