"""Calls written as Python lines (`[read_file(path="a.py")]`)."""

from __future__ import annotations

import re

from orchestrator.call_arguments import Arguments
from orchestrator.call_shapes import WrittenCall
from orchestrator.code_fences import CALL_FENCE_LANGUAGES, fences


def calls_as_python(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Calls written as Python, a line each (Llama 3.2's `[read_file(path="a.py")]`, Gemma's ```tool_code):
    only a whole line that calls tools by name, with keyword arguments whose values are literals."""
    import ast

    found: list[WrittenCall] = []
    for fence in fences(text):  # code shown in a ```python fence is code, not a call
        # (An empty body is skipped: replaced, it would put a line break between every two characters.)
        if fence.body and fence.language.lower() not in CALL_FENCE_LANGUAGES:
            text = text.replace(fence.body, "\n")
    for line in text.splitlines():
        line = line.strip()
        if not line or not re.match(r"\[?[\w.]+\(", line) or not line.rstrip(";").endswith((")", ")]")):
            continue
        try:
            tree = ast.parse(line.rstrip(";"), mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        calls = tree.elts if isinstance(tree, ast.List) else [tree]
        if not calls or not all(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in known for c in calls):
            continue
        for call in calls:
            name = call.func.id  # type: ignore[union-attr]
            raw = ast.get_source_segment(line.rstrip(";"), call) or line
            if call.args:
                found.append(WrittenCall(name, Arguments(None, raw), "unparseable", "name every argument (path=\"a.py\"), or write the call as a JSON object"))
                continue
            try:
                arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                found.append(WrittenCall(name, Arguments(None, raw), "unparseable", "an argument is not a plain value (a string, number, list)"))
                continue
            found.append(WrittenCall(name, Arguments(arguments, raw)))
    return found
