"""Find the calls a model wrote in its answer's text, which no server parsed into native calls.

Small models that ignore the tools API write calls in many forms: in `<tool_call>`
tags, in code fences, as bare JSON (a line each, or `{...}; {...}`), after a sentence,
in `<function=name>` blocks, in Mistral's (`name[ARGS]{...}`) and DeepSeek's tokens, or
as Python lines (`[read_file(path="a.py")]`). `calls_in_text` gives the calls of the
first form that has any, each with its name and its arguments as read
(orchestrator/call_arguments.py), or, when it cannot be read (cut off, cut by a fence's
```, unreadable), what is wrong with it; orchestrator/toolcalls.py then checks each
against its tool's schema.

This module finds the `<tool_call>` tags and fences and reads them; each other form is a module of its own: the
Mistral and DeepSeek tokens (token_calls.py), `<function=name>` tags (function_tag_calls.py), bare JSON
(bare_json_calls.py), JSON after a sentence (prose_calls.py), Python lines (python_calls.py). They share the code
fences (code_fences.py), one JSON block's calls (json_block_calls.py), the calls whose JSON does not read
(broken_calls.py) and the shapes a call's JSON takes (call_shapes.py).
"""

from __future__ import annotations

import re

from orchestrator.bare_json_calls import calls_in_bare_json
from orchestrator.call_arguments import CUT_OFF, Arguments
from orchestrator.call_shapes import CALL_FORM, WrittenCall, call_shapes
from orchestrator.code_fences import CALL_FENCE_LANGUAGES, FENCE, FENCE_MARK, CutJson, fence_at, fences
from orchestrator.function_tag_calls import calls_in_function_tags
from orchestrator.json_block_calls import calls_in_block
from orchestrator.prose_calls import calls_after_prose
from orchestrator.python_calls import calls_as_python
from orchestrator.repaired_json import repair
from orchestrator.token_calls import calls_after_names, calls_in_deepseek_tokens

_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
# The tokens Llama 3 (`<|python_tag|>`) and Mistral (`[TOOL_CALLS]`) put before a call, left in
# the text when the server does not parse them: the call's JSON starts where they end.
_CALL_MARKER = re.compile(r"^([ \t]*)(?:<\|python_tag\|>|\[TOOL_CALLS\])", re.MULTILINE)
_NAME_IN_TEXT = re.compile(r'"(?:name|tool)"\s*:\s*"([^"]*)"')


def calls_in_text(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """Calls in the first form that has any: tags, fences, bare JSON, then JSON after a sentence."""
    # An unclosed tag whose body is no call (`I will call it with a <tool_call>.`) is the model talking about
    # the form; a closed one is surely meant as a call, and said to be unreadable when it is.
    tagged = [tag for tag in _TOOL_CALL_TAG.finditer(text) if tag.group(2) or _meant_as_a_call(tag.group(1), known)]
    if tagged:
        # A tag neither closed nor followed by another runs to the answer's end: what it holds may stop mid-value.
        ends = [not tag.group(2) and tag.end() == len(text) for tag in tagged]
        return [found for tag, end in zip(tagged, ends) for found in _calls_in_tag(tag.group(1), known, cut, ends_the_answer=end)]
    for finder in (calls_after_names, calls_in_deepseek_tokens):
        found = finder(text, known, cut)
        if found:
            return found
    text = _CALL_MARKER.sub(r"\1", text)
    for finder in (_calls_in_fences, calls_in_function_tags, calls_in_bare_json, calls_after_prose, calls_as_python):
        found = finder(text, known, cut)
        if found:
            return found
    return []


def _meant_as_a_call(body: str, known: set[str]) -> bool:
    """Whether a `<tool_call>` body starts as a call: JSON, a fence, `<function=`, or a tool's name first."""
    inner = body.strip()
    if inner.startswith(("{", "[", FENCE_MARK, "<function=")):
        return True
    first = re.match(r"[\w.-]+", inner)
    return first is not None and first.group(0) in known


def _calls_in_tag(body: str, known: set[str], cut: bool, *, ends_the_answer: bool) -> list[WrittenCall]:
    """A `<tool_call>` body is surely meant as a call: if it cannot be read, say so."""
    inner = body.strip()
    fenced = FENCE.match(inner)
    if fenced:
        fence, _ = fence_at(inner, fenced)
        if fence.cut:
            return _cut_by_the_fence(fence.cut, known) or _unreadable_tag(fence.body, cut)
        inner = fence.body.strip()
    if inner.startswith("<function="):
        return calls_in_function_tags(inner, known, cut, ends_the_answer=ends_the_answer)
    return calls_in_block(inner, known, cut) or _unreadable_tag(inner, cut)


def _unreadable_tag(inner: str, cut: bool) -> list[WrittenCall]:
    guess = _NAME_IN_TEXT.search(inner)
    detail = CUT_OFF if cut else f"the <tool_call> body is not {CALL_FORM}"
    return [WrittenCall(guess.group(1) if guess else "", Arguments(None, inner), "unparseable", detail)]


def _calls_in_fences(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    found: list[WrittenCall] = []
    for fence in fences(text):
        if fence.language.lower() in CALL_FENCE_LANGUAGES:
            body = fence.body[: fence.cut.start] if fence.cut else fence.body
            found.extend(calls_in_block(body, known, cut) or calls_in_bare_json(body, known, cut))
            found.extend(_cut_by_the_fence(fence.cut, known) if fence.cut else [])
    return found


def _cut_by_the_fence(cut: CutJson, known: set[str]) -> list[WrittenCall]:
    """Repaired, such a call would run with its text cut at the ```: it is reported instead."""
    detail = (
        f"the call's JSON is not valid ({cut.error}), so the ``` inside one of its strings ended "
        "the code fence there; write the whole call again as valid JSON"
    )
    shapes = call_shapes(repair(cut.text), known) or []
    return [WrittenCall(name, Arguments(None, cut.text), "unparseable", detail) for name, _ in shapes]
