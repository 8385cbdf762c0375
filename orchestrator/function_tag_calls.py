"""Calls written in `<function=name>` tags, their arguments as JSON or in `<parameter=p>` tags."""

from __future__ import annotations

import re

from orchestrator.call_arguments import CUT_OFF, Arguments, read_arguments
from orchestrator.call_shapes import WrittenCall

_FUNCTION_TAG = re.compile(r"<function=([^>\s]*)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER_TAG = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def calls_in_function_tags(text: str, known: set[str], cut: bool, *, ends_the_answer: bool = True) -> list[WrittenCall]:
    """`<function=name>{json}</function>` or `<function=name><parameter=p>v</parameter></function>`. A last value
    that no tag closes, in a call that runs to the answer's end (`ends_the_answer`: `text` is all of it), is cut off."""
    found: list[WrittenCall] = []
    for name, body, closing in _FUNCTION_TAG.findall(text):
        if cut and not closing:
            found.append(WrittenCall(name, Arguments(None, body), "unparseable", CUT_OFF))
        elif "<parameter=" in body:
            parameters = _PARAMETER_TAG.findall(body)
            values = {key: value for key, value in parameters}
            if ends_the_answer and not closing and body.rfind("</parameter>") < body.rfind("<parameter="):
                last = parameters[-1][0] if parameters else ""  # none when the text stops inside the first one's name
                found.append(WrittenCall(name, Arguments(values, body, f"the answer ends inside <parameter={last}>", ends_mid_value=True)))
                continue
            found.append(WrittenCall(name, Arguments(values, body)))
        else:
            found.append(WrittenCall(name, read_arguments(body.strip())))
    return found
