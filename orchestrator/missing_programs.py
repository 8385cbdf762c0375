"""A check whose program is not there, told before the night rather than read as a failing test every iteration."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess

from orchestrator.command_environment import UNATTENDED_ENV

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def missing_program(command: str) -> str | None:
    """The program a shell command starts with, if the shell would not find it ("command not found").

    Only a plain name is judged (after `NAME=value` assignments): one with a `/` is the
    repository's own (the agent may yet write it), and what is not a simple word (`(cd x && make)`,
    a quote left open) is left to the shell. Names not on PATH are asked of the shell itself, so
    builtins and keywords (`cd`, `test`, `[[`, `if`) pass.
    """
    if "PATH=" in command:
        return None  # the check sets its own PATH (`PATH=.venv/bin:$PATH pytest`): the shell's to judge
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    words = list(itertools.dropwhile(lambda word: _ASSIGNMENT.match(word) is not None, words))
    if not words or not _PLAIN_NAME.fullmatch(words[0]) or shutil.which(words[0]):
        return None
    shell = shutil.which("bash") or "/bin/sh"
    known = subprocess.run(
        [shell, "-c", 'command -v -- "$1"', "overnight", words[0]],
        stdin=subprocess.DEVNULL, capture_output=True, env={**os.environ, **UNATTENDED_ENV}, timeout=10,
    )
    return None if known.returncode == 0 else words[0]
