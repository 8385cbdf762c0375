"""The tools' JSON schemas, as the model is offered them, and the order it sees the tools in."""

from __future__ import annotations

from typing import Any, Sequence

from orchestrator.tool_names import ALL_TOOLS


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, str]:
    return {"type": "integer", "description": description}


def _function(name: str, description: str, properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required)},
        },
    }


_PATH = _string("File path relative to the project root, like src/app.py")
SCHEMAS: dict[str, dict[str, Any]] = {
    "read_file": _function(
        "read_file",
        "Show the text of one file: all of it, or the lines from start_line to end_line.",
        {
            "path": _PATH,
            "start_line": _integer("First line to show, counting from 1 (default: the first)"),
            "end_line": _integer("Last line to show (default: the last)"),
        },
        ["path"],
    ),
    "write_file": _function(
        "write_file",
        "Create a file, or replace ALL of its text. Give the complete new file content.",
        {"path": _PATH, "content": _string("The complete text the file should have")},
        ["path", "content"],
    ),
    "edit_file": _function(
        "edit_file",
        "Replace one exact piece of text in a file. `old` must appear exactly once in the file, "
        "with the same spaces and indentation; include nearby lines to make it unique.",
        {
            "path": _PATH,
            "old": _string("The exact text to replace, copied from the file"),
            "new": _string("The text to put in its place"),
        },
        ["path", "old", "new"],
    ),
    "list_dir": _function(
        "list_dir",
        "List the files and folders in a folder. Folders end with /.",
        {"path": _string('Folder path relative to the project root; "." is the root (default)')},
        [],
    ),
    "search": _function(
        "search",
        "Find lines matching a regex or plain text in the project's files. Shows file:line: text.",
        {
            "pattern": _string("Regular expression or plain text to look for"),
            "path": _string('File or folder to search in; "." is the whole project (default)'),
        },
        ["pattern"],
    ),
    "run_check": _function(
        "run_check",
        "Run the task's check (its tests). Exit code 0 means the task is done.",
        {},
        [],
    ),
    "submit": _function(
        "submit",
        "Say you are finished. Call it only after run_check passes.",
        {"summary": _string("One or two sentences on what you changed")},
        ["summary"],
    ),
    "run_command": _function(
        "run_command",
        "Run a shell command in the project root and show its output. It cannot read input.",
        {"command": _string("The shell command, like: python -m pytest -x tests/test_app.py")},
        ["command"],
    ),
}


def offered(allowed: Sequence[str]) -> list[str]:
    """The tools a task offers the model, in the order the model sees them."""
    return [name for name in ALL_TOOLS if name in allowed]


def schemas_of(names: Sequence[str]) -> list[dict[str, Any]]:
    return [SCHEMAS[name] for name in names]
