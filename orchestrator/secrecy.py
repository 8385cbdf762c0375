"""Which of the environment's variables the agent's commands and the check run without (`holds_secret`, `withheld`,
`without_secrets`); and, below, how secrets are kept from those commands and out of what a night writes down.

The agent runs shell commands, and small models debug with `env`: whatever overnight's own
environment holds (the model server's API key, a CI job's token, a database password, the
ssh agent's socket) would land in the transcript, the run store, notes.md (which the next
prompt carries) and, written to a file, on the task's branch that CI then pushes. So:

- the agent's commands and the task's check run without the variables whose names say they
  hold a secret (secret_names.py: `looks_secret`) or whose values hold a URL or an Oracle login with a password, a
  connection string's secret setting, an Authorization header, or a secret as a command line, a Cookie header or a .netrc
  writes it (value_secrets.py, url_secrets.py, oracle_logins.py, inline_secrets.py: `holds_secret`); the
  check (also when the agent runs it) gets those its task names in `pass_env`, the agent's own
  commands never;
- what a tool or the check prints has the values of those variables, the model's API key,
  the run store's password and the user's .netrc passwords (netrc_file.py) replaced by `***` (redactor.py's `Redactor`, in
  the forms escaped_forms.py lists), however the agent came by them; so
  have the model's own words where they are written down (its text, its calls' arguments, its
  summary: `surrogates.strings_mapped` with the redaction), while its tools get them as it wrote them;
- a file the check given `pass_env` wrote one of its values into stays off the task's branch
  (passed_secrets.py's `PassedSecrets`, which secret_commits.py scans what worktree.commit would commit for).

Not a sandbox: files the user can read (~/.git-credentials, a committed config) stay readable;
the redaction keeps their known values out of the night's records.
"""

from __future__ import annotations

import functools
from typing import Collection, Mapping

from orchestrator.redactable import redactable
from orchestrator.secret_names import looks_secret
from orchestrator.value_secrets import value_secrets


# Asked for every variable of the environment at each command the agent runs: the same few dozen pairs, read once each.
@functools.lru_cache(maxsize=1024)
def holds_secret(name: str, value: str) -> bool:
    """Whether a variable is withheld: its name says so, or its value holds a URL with a password
    (DATABASE_URL=postgres://app:pw@db/app, GitLab's CI_REPOSITORY_URL with the job token), an Oracle login (scott/pw@//db/orcl),
    a secret setting or header (`Server=db;Password=...`, `Authorization: Bearer ...`), or an option's, a cookie's or a
    .netrc entry's secret (`--password=...`, `Cookie: session=...`): `value_secrets`."""
    # Only a password the Redactor would hide: `postgres://postgres:postgres@localhost/test`, a CI service
    # database's, is in the project's own files and shown anyway; withheld, the check just fails.
    return looks_secret(name) or any(redactable(secret) for secret in value_secrets(value))


def withheld(environment: Mapping[str, str], pass_env: Collection[str] = ()) -> list[str]:
    """The names of `environment` that the agent's commands and the check run without."""
    return sorted(name for name, value in environment.items() if holds_secret(name, value) and name not in pass_env)


def without_secrets(environment: Mapping[str, str], pass_env: Collection[str] = ()) -> dict[str, str]:
    """`environment` less the variables `withheld` names."""
    return {name: value for name, value in environment.items() if name in pass_env or not holds_secret(name, value)}
