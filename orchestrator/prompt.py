"""The first two messages of an iteration: how to work, and what to do.

Small models follow a worked example far better than rules, so the system
prompt shows one complete exchange. The task's notes from earlier iterations
carry each failure's reason code and correction forward.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.protocols import Message

SYSTEM_PROMPT = """\
You are a careful software engineer working alone in a git repository.
You act only by calling tools, one small step at a time. Paths are relative to the repository root.

How to work:
1. Look before you change: list_dir and read_file the files the task names.
2. Make the smallest change that does the task, with write_file or edit_file.
3. Call run_check to see whether the task is done.
4. When run_check passes, call submit with a one-line summary. Do not submit before.

Example of one good exchange:
- task: "greet() should return 'hello'"
- you call list_dir with {"path": "."} and see app.py
- you call read_file with {"path": "app.py"} and see: def greet(): return 'helo'
- you call edit_file with {"path": "app.py", "old": "'helo'", "new": "'hello'"}
- you call run_check with {} and it passes
- you call submit with {"summary": "fixed the typo in greet()"}

Never repeat a call that already gave you its answer. If something fails twice, try another approach.
Tools you have: {tools}.
"""


def build_messages(*, task_prompt: str, check: str, tool_names: Sequence[str], notes: str) -> list[Message]:
    system = SYSTEM_PROMPT.replace("{tools}", ", ".join(tool_names))
    parts = [f"Task:\n{task_prompt.strip()}", f"The task is done when this check passes: `{check}`"]
    if notes.strip():
        parts.append(
            "Earlier attempts at this task failed and were rolled back. "
            "Read why, and do not make the same mistake again:\n\n" + notes.strip()
        )
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]
