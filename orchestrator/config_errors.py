"""What is wrong with a config, in one line that names the key: pydantic's first error in our words (a misspelt key
with the one it is close to), and where a NUL is, which no path, name or command can carry."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from orchestrator.config_record import Config

# pydantic's words for a wrong shape name its classes ("instance of ModelConfig", "<class 'pathlib.Path'>").
_PLAIN_WORDS = {
    "model_type": "must be a table ([section] with keys under it)",
    "dict_type": "must be a table ([section] with keys under it)",
    "path_type": "must be a path, as a string",
    "tuple_type": "must be a list",
}


def first_error(exc: ValidationError) -> str:
    """pydantic's first error as one line naming the key; a misspelt key rather than the right one it leaves missing."""
    errors = exc.errors()
    error = errors[0]
    unknown = [each for each in errors if each["type"] == "extra_forbidden"]
    if error["type"] == "missing" and unknown:
        # A misspelt key (`promt`) also leaves its right one missing: the typo is what to name.
        error = unknown[0]
    key = key_name(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unknown key {key}{_meant(error, errors)}"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if error["type"] == "tuple_type" and key == "[[task]]":
        return f"{key}: write each task as a [[task]] table (two brackets), one per task"
    if error["type"] in _PLAIN_WORDS:
        return f"{key}: {_PLAIN_WORDS[error['type']]}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def _meant(unknown: Any, errors: list[Any]) -> str:
    """' (did you mean prompt?)' when a key of the same table is spelt close to the unknown one: first one the table
    misses (a misspelt required key leaves it missing), else any of its keys (`max_iteration`)."""
    table, written = unknown["loc"][:-1], str(unknown["loc"][-1])
    missing = [str(each["loc"][-1]) for each in errors if each["type"] == "missing" and each["loc"][:-1] == table]
    close = difflib.get_close_matches(written, missing, n=1) or difflib.get_close_matches(written, _keys_of(table), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _keys_of(table: tuple[Any, ...]) -> list[str]:
    """The keys the table at `table` (a pydantic loc: `("night",)`, `("task", 0)`) may hold; none where it is no table."""
    model: Any = Config
    for step in table:
        if isinstance(step, int):
            continue  # a [[task]]'s number: the table is the list's item
        field = model.model_fields.get(step) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        model = next((kind for kind in (field.annotation, *get_args(field.annotation)) if _is_table(kind)), None)
    return [field.alias or name for name, field in model.model_fields.items()] if _is_table(model) else []


def _is_table(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def first_nul(value: Any, loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Where the first string (a key, a value, a list item) holding a NUL is, as a pydantic loc."""
    if isinstance(value, str):
        return loc if "\0" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = (*loc, repr(key)) if "\0" in key else first_nul(item, (*loc, key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            # [[task]] items are named by their number; a list value (keep, custom) by its key alone.
            found = first_nul(item, (*loc, index) if loc == ("task",) else loc)
            if found is not None:
                return found
    return None


def key_name(loc: tuple[Any, ...]) -> str:
    """('task', 0, 'name') -> '[[task]] #1 name'; ('model', 'name') -> '[model] name'."""
    if not loc:
        return ""
    head, *rest = loc
    if head == "task" and rest and isinstance(rest[0], int):
        index, *rest = rest
        prefix = f"[[task]] #{index + 1}"
    elif head == "task":
        prefix = "[[task]]"
    elif head in Config.model_fields:
        prefix = f"[{head}]"
    else:
        return str(head)
    tail = ".".join(str(part) for part in rest)
    return f"{prefix} {tail}".rstrip()
