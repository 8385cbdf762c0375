"""What git said when a command failed, read down to the one line a person or a note is shown.

GitPython's GitCommandError carries the whole of stderr, wrapped ("stderr: '<text>'"), advice and
hints included: the reason that matters is git's own `fatal:` or `error:` line, or failing that its last.
"""

from __future__ import annotations

import re

# git's words for a branch another worktree has checked out (2.42 and later: "already used by worktree at").
CHECKED_OUT_AT = re.compile(r"is already (?:checked out|used by worktree) at '(.+)'")


def git_reason(exc: Exception) -> str:
    """git's own `fatal:` or `error:` line (advice may follow it), else its last line."""
    return git_said(exc) or _last_line(exc)


def git_said(exc: Exception) -> str:
    """git's own `fatal:` or `error:` line in a GitCommandError's stderr, or ""."""
    # GitPython wraps the whole of stderr as "stderr: '<text>'"; a quote inside git's text stays.
    text = str(getattr(exc, "stderr", "") or "").strip()
    if text.startswith("stderr: '") and text.endswith("'"):
        text = text[len("stderr: '") : -1]
    return _said_in(text)


def stderr_reason(text: str) -> str:
    """git's own `fatal:` or `error:` line in the stderr of a git run directly (not through GitPython), else its last
    line; "" when it said nothing."""
    lines = text.strip().splitlines()
    return _said_in(text) or (lines[-1].strip() if lines else "")


def _said_in(text: str) -> str:
    lines = [line.strip() for line in text.splitlines()]
    said = next((line for line in lines if line.startswith(("fatal:", "error:"))), "")
    # A filter or hook program that is not installed (git-lfs): the shell's line says what git's does not
    # ("the remote end hung up unexpectedly").
    missing = next((line for line in lines if line.endswith(("not found", "No such file or directory")) and not line.startswith(("fatal:", "error:"))), "")
    return f"{said} ({missing})" if said and missing else said


def _last_line(exc: Exception) -> str:
    text = str(getattr(exc, "stderr", "") or exc).strip()
    return text.splitlines()[-1].strip().removeprefix("stderr: ").strip("'") if text else "git failed"
