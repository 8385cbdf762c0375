"""Call identity with the noise a small model adds taken out.

Small models re-issue the same call with cosmetic differences: `./a.py` for
`a.py`, a doubled space in a command, a trailing blank. Exact comparison lets
such loops run on; these helpers compare what the call means instead.

Results get the same treatment, narrowly: a re-run check whose only change is
pytest's `in 0.02s` or a timestamp returned the same thing.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any, Callable

from orchestrator.records import ToolCall

# Argument names whose value is a path: `./a.py`, `a.py` and `.//a.py` are one file.
_PATH_KEYS = frozenset({"path", "file", "filename", "dir", "directory", "folder"})


def call_key(call: ToolCall) -> str:
    """Name plus noise-free arguments, in one stable form."""
    key = _recent_keys.get(call)
    if key is MISSING:
        key = _recent_keys.put(call, f"{call.name} {_arguments_text(_without_defaults(call.name, call.arguments))}")
    return key


# Arguments a tool takes at these values when they are left out (orchestrator/tools.py): a model
# that gives one and then leaves it out makes the same call twice (`read_file` with `start_line: 1`).
_DEFAULTS: dict[str, dict[str, Any]] = {"read_file": {"start_line": 1}, "list_dir": {"path": "."}, "search": {"path": "."}}


def _without_defaults(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    defaults = _DEFAULTS.get(name)
    if defaults is None or not any(key in arguments for key in defaults):
        return arguments
    return {key: value for key, value in arguments.items() if not (key in defaults and _is_default(key, value, defaults[key]))}


def _is_default(key: str, value: Any, default: Any) -> bool:
    if type(value) is not type(default):  # True is no 1, "1" no line number
        return False
    return (_str_value(key, value) if type(value) is str else value) == default


MISSING = object()


class PerCall:
    """Answers about the latest few calls. Several guards ask about the same calls (those of one
    answer) in a row. Calls are frozen, and each entry holds the call itself, so an id that another
    object reuses never matches."""

    __slots__ = ("_answers", "_size")

    def __init__(self, size: int = 32) -> None:
        self._answers: dict[int, tuple[ToolCall, Any]] = {}
        self._size = size

    def get(self, call: ToolCall) -> Any:
        """The answer kept for `call`, or MISSING."""
        hit = self._answers.get(id(call))
        return hit[1] if hit is not None and hit[0] is call else MISSING

    def put(self, call: ToolCall, answer: Any) -> Any:
        if len(self._answers) >= self._size:
            self._answers.clear()
        self._answers[id(call)] = (call, answer)
        return answer


_recent_keys = PerCall()
# json.dumps(..., sort_keys=True, ensure_ascii=False) builds an encoder on every call; one is enough.
_encode = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode
# The string encoder that _encode itself uses for keys and str values (ensure_ascii=False).
_quote = json.encoder.encode_basestring
_LITERALS = {None: "null", True: "true", False: "false"}


def _arguments_text(arguments: dict[str, Any]) -> str:
    """_encode of the noise-free arguments; the flat common case (str keys; str, int, bool, None values) by hand.

    JSONEncoder.encode builds a new C encoder on every call, which costs more than the text it makes.
    The text is the same: keys sorted, ", " and ": " separators, strings through the same quoting.
    """
    parts = []
    for key in sorted(arguments) if all(type(key) is str for key in arguments) else ():
        value = arguments[key]
        kind = type(value)
        if kind is str:
            text = _quote(_str_value(key, value))
        elif kind is int:
            text = int.__repr__(value)
        elif value is None or kind is bool:
            text = _LITERALS[value]
        else:
            break
        parts.append(f"{_quote(key)}: {text}")
    else:
        if len(parts) == len(arguments):
            return "{" + ", ".join(parts) + "}"
    return _encode({key: _value(key, value) for key, value in arguments.items()})


class AnswerCopies:
    """Copies of one call within a single answer count once: that burst is one decision of the model.

    `start()` when an answer is announced (after_model_response); `first(key)` in after_tool_call is
    (given its call_key) False for a copy of a call made earlier in the same answer. Before any answer, every call is first.
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: set[str] | None = None

    def reset(self) -> None:
        self._keys = None

    def start(self) -> None:
        self._keys = set()

    def first(self, key: str) -> bool:
        """`key` is the call's call_key."""
        keys = self._keys
        if keys is None:
            return True
        if key in keys:
            return False
        keys.add(key)
        return True


class SeenResults:
    """The outcomes (ok, output) each call returned in this run.

    An outcome is known when it came before exactly (a set: one lookup however many)
    or, for a command, equal but for volatile parts to one of the call's last few
    distinct outcomes (comparing without volatile parts costs; a re-run drifts little).
    """

    __slots__ = ("_exact", "_recent", "keep")

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._exact: dict[str, set[tuple[bool, str]]] = {}
        self._recent: dict[str, list[tuple[bool, str]]] = {}

    def clear(self) -> None:
        self._exact.clear()
        self._recent.clear()

    def note(self, tool: str, key: str, ok: bool, output: str) -> str:
        """Remember the outcome; return "known", "new" (the call returned something else before) or "first"."""
        outcome = (ok, output)
        exact = self._exact.get(key)
        if exact is None:
            self._exact[key] = {outcome}
            self._recent[key] = [outcome]
            return "first"
        if outcome in exact:
            return "known"
        exact.add(outcome)
        recent = self._recent[key]
        if tool in RUNS_COMMANDS and any(was == ok and same_output(output, earlier) for was, earlier in recent):
            return "known"
        recent.append(outcome)
        if len(recent) > self.keep:
            del recent[0]
        return "new"


def path_argument(call: ToolCall) -> str | None:
    """The call's path argument without noise (`./a.py` is `a.py`), or None when it has none."""
    path = _recent_paths.get(call)
    if path is MISSING:
        path = None
        for key, value in call.arguments.items():
            if key in _PATH_KEYS and isinstance(value, str) and value.strip():
                path = str(_value(key, value))
                break
        _recent_paths.put(call, path)
    return path


# The guards that follow file contents ask about the same call in a row.
_recent_paths = PerCall()


def _value(key: str, value: Any) -> Any:
    # Multi-line text (file content, edits) is left exact: there, whitespace is meaning. A newline
    # at either end (`cat notes.txt\n`) does not make a command or a path multi-line.
    if not isinstance(value, str):
        return value
    return _str_value(key, value)


def _str_value(key: str, value: str) -> str:
    if "\n" in value and "\n" in value.strip():  # the first test spares a copy of one-line values
        return value
    squeezed = " ".join(value.split())
    if key in _PATH_KEYS and squeezed:
        return _normpath(squeezed)
    return squeezed


def _normpath(path: str) -> str:
    """posixpath.normpath, remembered: the same few paths come back all run long."""
    normal = _normal_paths.get(path)
    if normal is None:
        if len(_normal_paths) >= 1024:
            _normal_paths.clear()
        normal = _normal_paths[path] = posixpath.normpath(path)
    return normal


_normal_paths: dict[str, str] = {}


# What changes from one run of the same command to the next and means nothing: a duration with a
# decimal point (pytest's "in 0.02s", "took 1.2s", "0.03 seconds"; an integer "3s" may be a count
# the model cares about, so it is left), an ISO timestamp, a clock time, a memory address (8+ hex digits:
# a shorter 0x… is more likely a value), pytest's
# numbered temporary folder. Each is replaced by a placeholder; everything else is kept exact.
_VOLATILE = re.compile(
    r"\b\d+\.\d+ ?(?:s|ms|us|µs|ns|secs?|seconds?)\b"
    r"|\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\b\d{1,2}:\d\d:\d\d(?:[.,]\d+)?\b"
    r"|\b0x[0-9a-fA-F]{8,}\b"
    r"|(?<=/pytest-of-)[^/\s]+/pytest-\d+"
)


def volatile_free(output: str) -> str:
    """`output` with durations, timestamps, addresses and pytest's tmp folder numbers blanked."""
    return _VOLATILE.sub("…", output)


# Only what a command prints varies from one run to the next; a file read twice is the file, and an
# edited timeout or timestamp in it is a real change.
RUNS_COMMANDS = frozenset({"run_check", "run_command"})


def same_result(tool: str, output: str, other: str) -> bool:
    """Whether two results of `tool` say the same thing: volatile parts are set aside for commands only."""
    return output == other or (tool in RUNS_COMMANDS and same_output(output, other))


def same_output(output: str, other: str) -> bool:
    """Whether two results say the same thing once their volatile parts are set aside."""
    if output == other:
        return True
    # No volatile part spans a line, so only the lines where the two differ need the (slow) regex.
    start = _shared(output, other, lambda text, n: text[:n])
    start = output.rfind("\n", 0, start) + 1
    output, other = output[start:], other[start:]
    end = _shared(output, other, lambda text, n: text[len(text) - n :])
    cut = output.find("\n", len(output) - end)
    cut = len(output) if cut < 0 else cut
    tail = len(output) - cut
    return volatile_free(output[:cut]) == volatile_free(other[: len(other) - tail])


def _shared(one: str, two: str, part: Callable[[str, int], str]) -> int:
    """The length of the longest common prefix or suffix (`part` cuts one), found by halving."""
    low, high = 0, min(len(one), len(two))
    while low < high:
        middle = (low + high + 1) // 2
        if part(one, middle) == part(two, middle):
            low = middle
        else:
            high = middle - 1
    return low
