"""The secret values a task's `pass_env` lets through to its check, as a file may hold them (`passed_secrets`), to keep
off the task's branch (secret_commits.py looks for them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

from orchestrator.redactor import Redactor
from orchestrator.secrecy import holds_secret
from orchestrator.value_secrets import value_secrets


@dataclass(frozen=True)
class PassedSecrets:
    """The values of the secret variables a task's `pass_env` lets through to its check, as bytes a file may hold,
    each with the names of the variables it comes from. The values the Redactor would hide (its length and plain-word
    rules, a multi-line value's lines): a shorter one, or a plain word, is in the project's own files anyway."""

    names_by_value: Mapping[bytes, tuple[str, ...]]

    def __bool__(self) -> bool:
        return bool(self.names_by_value)

    def found_in(self, chunks: Iterable[bytes]) -> frozenset[bytes]:
        """The values that the content `chunks` make up holds, one split across two chunks included."""
        overlap = max(map(len, self.names_by_value), default=1) - 1
        found: set[bytes] = set()
        tail = b""
        for chunk in chunks:
            window = tail + chunk
            found.update(value for value in self.names_by_value if value not in found and value in window)
            tail = window[-overlap:] if overlap else b""
        return frozenset(found)

    def redacted(self, text: str) -> str:
        """`text` with each of the values as ***."""
        # The values are a Redactor's forms already: escaped again, they would only add forms no text holds.
        return Redactor.of_forms(os.fsdecode(value) for value in self.names_by_value)(text)

    def names(self, values: Iterable[bytes]) -> tuple[str, ...]:
        """The variables `values` come from, sorted: what a log may name, never the values."""
        return tuple(sorted({name for value in values for name in self.names_by_value[value]}))


def passed_secrets(pass_env: Collection[str], environment: Mapping[str, str] | None = None) -> PassedSecrets:
    """What of `environment` (overnight's own) the check gets only through `pass_env`: the variables `holds_secret`
    says hold one (the others the agent's own commands get too: no secret to keep from the branch)."""
    environment = os.environ if environment is None else environment
    names_by_value: dict[bytes, set[str]] = {}
    for name in pass_env:
        value = environment.get(name)
        if value is None or not holds_secret(name, value):
            continue
        for piece in Redactor([value, *value_secrets(value)]).values:
            names_by_value.setdefault(os.fsencode(piece), set()).add(name)
    return PassedSecrets({value: tuple(sorted(names)) for value, names in names_by_value.items()})
