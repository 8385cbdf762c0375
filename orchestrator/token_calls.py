"""Calls written after a model's own call tokens, each a name then its arguments' JSON: Mistral's
`[TOOL_CALLS]read_file[ARGS]{...}` and DeepSeek's `<｜tool▁call▁begin｜>`."""

from __future__ import annotations

import functools
import re
from typing import Any

from orchestrator.call_arguments import CUT_OFF, Arguments, read_arguments
from orchestrator.call_shapes import WrittenCall
from orchestrator.strict_json import json_error, raw_decode

# Mistral's newer form, `[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}`: the name, then its arguments' JSON.
# (A name starts where no name character is before it, and is taken whole: linear in a long word.)
_NAME_THEN_ARGUMENTS = re.compile(r"(?<![\w.-])([\w.-]++)\[ARGS\]")
# DeepSeek's tokens (V3, R1): `<｜tool▁call▁begin｜>[function<｜tool▁sep｜>]name[<｜tool▁sep｜>]{json}` or a ```json fence.
_DEEPSEEK_CALL = re.compile(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>)?([\w.-]+)(?:<｜tool▁sep｜>)?\s*(?:```(?:json)?\s*)?")


def calls_after_names(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    return _calls_named_before_json(_NAME_THEN_ARGUMENTS, text, cut, where=functools.partial(_begins_a_mistral_call, known=known))


def _begins_a_mistral_call(text: str, match: re.Match[str], previous_end: int, known: set[str]) -> bool:
    """`name[ARGS]` is a call when it names a tool (after prose, in a list, in backticks), or, naming
    none, where the model begins a call: the answer's start, after `[TOOL_CALLS]`, right after the call
    before, or a line's start. Elsewhere an unknown name (`x = options[ARGS]` in a file an edit writes)
    is text."""
    if match.group(1) in known:
        return True
    start = match.start()
    before = text[:start].rstrip(" \t")
    after_a_call = previous_end >= 0 and not text[previous_end:start].strip(" \t\n,;")
    return not before.strip() or before.endswith(("[TOOL_CALLS]", "\n")) or after_a_call


def calls_in_deepseek_tokens(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    return _calls_named_before_json(_DEEPSEEK_CALL, text, cut)


def _calls_named_before_json(form: re.Pattern[str], text: str, cut: bool, where: Any = None) -> list[WrittenCall]:
    """Calls written as a name `form` matches, followed by the arguments' JSON; not a match inside the
    arguments of the call before it, nor one `where(text, match, previous_end)` refuses."""
    found: list[WrittenCall] = []
    previous_end = -1
    for match in form.finditer(text):
        if match.start() < previous_end:
            continue  # inside the call before: its arguments' text
        if where is not None and not where(text, match, previous_end):
            continue
        try:
            value, end = raw_decode(text, match.end())
            found.append(WrittenCall(match.group(1), Arguments(value, text[match.end() : end])))
            previous_end = end
        except ValueError as exc:
            previous_end = match.end()  # where its arguments end is not known: a call may follow them
            rest = text[match.end() :].split("<｜tool▁call▁end｜>", 1)[0].split("```", 1)[0].strip()
            if cut:
                found.append(WrittenCall(match.group(1), Arguments(None, rest), "unparseable", CUT_OFF))
            else:
                found.append(WrittenCall(match.group(1), read_arguments(rest) if rest else Arguments(None, rest, json_error(exc))))
    return found
