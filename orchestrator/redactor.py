"""The Redactor: known secret values replaced by *** in what a night writes down, in the forms programs write them in."""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

from orchestrator.escaped_forms import escaped_forms
from orchestrator.netrc_file import netrc_file_passwords
from orchestrator.oracle_logins import oracle_passwords
from orchestrator.redactable import REDACTED, redactable
from orchestrator.secret_names import looks_secret
from orchestrator.url_secrets import url_secrets
from orchestrator.value_secrets import value_secrets


class Redactor:
    """Replaces known secret values in text with ***: as written, as JSON encoders escape them in a string, as repr() and
    ascii() quote them or their bytes, and as URL writers percent-encode them (`escaped_forms`)."""

    def __init__(self, values: Iterable[str]) -> None:
        # Longest first: a secret that contains another is replaced whole. A plain word ("postgres",
        # "password", "localhost": a test database's password) is in the project's own files and every
        # output about them; replaced, read_file would show `***` where the code has it, and the model
        # would write that back.
        # A multi-line value (a PEM key) also line by line: a command may print part of it, or with other line ends.
        # Only a line with no space in it (a PEM key's base64): "-----BEGIN PRIVATE KEY-----", or a JSON key file's
        # `"type": "service_account",`, is in the project's own files too, and replaced there would be written back as ***.
        values = list(values)
        multiline = [value for value in values if "\n" in value or "\r" in value]
        pieces = [line for value in multiline for line in re.split(r"\r\n|\r|\n", value) if not any(space in line.strip() for space in " \t")]
        # A line with spaces (a pretty-printed JSON key's `"private_key": "-----BEGIN ...\nMIIE..."`) gives its
        # long runs that mix letters and digits: grep of the value prints that line alone.
        pieces += [run for value in multiline for run in re.split(r"\s+", value) if len(run) >= 20 and re.search(r"[0-9]", run) and re.search(r"[A-Za-z]", run)]
        pieces += [value.replace("\r\n", "\n") for value in multiline if "\r\n" in value]
        kept = {value.strip() for value in [*values, *pieces] if redactable(value)}
        # Also as JSON text holds it (a call's arguments, a message's, a server's answer, are recorded as such), as a
        # traceback quotes it with repr(): `a"b` is `a\"b` there, and as a URL a tool prints holds it: `a/b` is `a%2Fb`.
        self._use(form for value in kept for form in escaped_forms(value))

    @classmethod
    def of_forms(cls, forms: Iterable[str]) -> "Redactor":
        """A Redactor that replaces `forms` as they are (another's `values`): no lines, pieces or escaped forms derived."""
        redactor = cls.__new__(cls)
        redactor._use(forms)
        return redactor

    def _use(self, forms: Iterable[str]) -> None:
        # Longest first: a form that holds another (a value ending in `\\`, whose plain form starts its escaped
        # ones) is replaced whole, leaving no escape behind.
        self._values = sorted(set(forms), key=len, reverse=True)
        # A shorter text holds none: most strings of a call's arguments and of a message (a key, a role, a path) are.
        self._shortest = len(self._values[-1]) if self._values else 0

    @classmethod
    def for_night(cls, *, api_key: str | None = None, store_url: str | None = None, api_base: str | None = None) -> "Redactor":
        """The values of this process's secret-named variables, the model's API key, the passwords
        (and query values) of the store's and the model endpoint's URLs, or of an Oracle login written there, and those
        of the user's .netrc (`netrc_file_passwords`)."""
        values = [value for name, value in os.environ.items() if looks_secret(name)]
        values += [secret for value in os.environ.values() for secret in value_secrets(value)]
        values += netrc_file_passwords()
        values += [api_key or ""] + [secret for url in (store_url, api_base) for secret in url_secrets(url) + oracle_passwords(url)]
        return cls(values)

    @classmethod
    def for_config(cls, config: Any) -> "Redactor":
        """`for_night` with a config's model key and endpoint and its store's URL: what a night, its recovery and
        the line that ends it redact alike."""
        return cls.for_night(api_key=config.model.api_key, store_url=config.store_url, api_base=config.model.api_base)

    @property
    def values(self) -> tuple[str, ...]:
        """What it replaces, longest first."""
        return tuple(self._values)

    def __call__(self, text: str) -> str:
        if len(text) < self._shortest:
            return text
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text
