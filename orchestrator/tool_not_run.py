"""Whether a tool's name that inline_secrets.py's `_tool_option` found on a command line plainly names no command that runs:
a plain argument of a command that takes text, not commands (`pytest -k mongo -p plugin`, `git log --grep mysql -p...`,
`pip install mysqlclient ...`), or a name whose command a `)` or a backquote ends before the option
(`$(mysql --version) -pedantic-errors`: gcc's option).

A missed password reaches the model, its transcripts and notes; a false alarm withholds one variable, loudly. So a name
counts unless this is plain: any other command (`npx`, `poetry run`, `RUN`, a prompt's `$`, `ssh host`, `docker exec`,
`find -exec`, `echo ... | sh`) keeps it, and so does a command whose start is more than `_LOOK_BACK` characters before.
"""

from __future__ import annotations

import itertools
import re

# Commands that read their arguments as text, file names or package names, and run none of them. Not `echo` nor `printf`:
# what they print is often piped to a shell or written to a script (`echo mysql -p... | ssh db`), with the password in it.
_TEXT_COMMANDS = frozenset({
    "pytest", "py.test", "grep", "egrep", "fgrep", "rg", "ag", "ack", "git", "find", "ls", "cat", "head", "tail", "wc", "sed",
    "awk", "man", "which", "type", "whereis", "apt", "apt-get", "apt-cache", "dnf", "yum", "brew", "pip", "pip3", "conda", "gem",
})
# Their words that make them run a command after all: `find -exec`, `git bisect run`, `git submodule foreach`, `git rebase -x`,
# `git -c alias...`, git filter-branch's filters, `git difftool --extcmd`, `rg --pre`.
_RUNS_A_COMMAND = {
    "find": re.compile(r"-(?:exec|ok)(?:dir)?+"),
    "git": re.compile(r"run|foreach|exec|-x|--exec.*|-c|--\w+-filter.*|--extcmd.*|-t|--tool.*", re.DOTALL),
    "rg": re.compile(r"--pre.*", re.DOTALL),
}
# Commands that run the command after their own options, variables and a duration (`sudo -u me pytest ...`, `timeout 30 ...`,
# `poetry run ...`), and the shell's words after which a command begins.
_PREFIX_WORDS = frozenset({
    "sudo", "doas", "env", "exec", "command", "builtin", "nice", "ionice", "nohup", "timeout", "time", "stdbuf", "xargs",
    "setsid", "chrt", "taskset", "poetry", "uv", "pipenv", "pdm", "hatch", "run", "if", "then", "elif", "else", "do", "while",
    "until", "!", "{",
})
# What may come before a command on a line that is no shell's: a prompt (`$ `), a YAML list's dash, a Dockerfile's RUN, a
# YAML key or a Procfile's process type (`script:`, `web:`).
_LINE_LABEL = re.compile(r"[$#>-]|RUN|[\w-]++:")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*+=(.*)", re.DOTALL)
_DURATION = re.compile(r"[0-9.]++[smhd]?+")
_PYTHON = re.compile(r"python[0-9.]*+")
# Where a simple command begins: after `;`, `|`, `&`, `(`, a backquote, a line's end, or a quote (`sh -c "pytest ..."`).
# Quotes are not paired: a command misread from one begins later than it does, and keeps its name counted unless that
# shorter command is itself a text command's.
_COMMAND_START = re.compile(r"""[;|&(`\r\n"']""")
_LOOK_BACK = 512
# What ends the command a name begins, once more of them close than open after it, out of quotes.
_PARENTHESES = re.compile(r""""[^"]*+"|'[^']*+'|[()`]""")


def names_no_command_that_runs(value: str, start: int, end: int) -> bool:
    """Whether the tool's name at `value[start:]`, whose option `_tool_option` read up to `end`, plainly runs nothing there:
    a text command's plain argument (`_argument_of_a_text_command`), or its command ended before the option
    (`_ended_before_the_option`)."""
    return _argument_of_a_text_command(value, start) or _ended_before_the_option(value, start, end)


def _argument_of_a_text_command(value: str, start: int) -> bool:
    """Whether the name at `value[start:]` is a plain argument (after a blank, not right after a quote, `=`, `(` ...) of a
    simple command that `_TEXT_COMMANDS` names, after its variables and prefix commands (`TEST=1 time pytest -k mongo`), with
    none of `_RUNS_A_COMMAND`'s words before the name."""
    if start == 0 or value[start - 1] not in " \t":
        return False
    earliest = max(0, start - _LOOK_BACK)
    command_start = _COMMAND_START.search(value[earliest:start][::-1])  # the last before the name, in one pass
    if command_start is None and earliest > 0:
        return False  # its command begins too far back to read
    words = value[start - command_start.start() if command_start else 0:start].split()
    command, arguments = _command_of(words)
    runs = _RUNS_A_COMMAND.get(command or "")
    return command in _TEXT_COMMANDS and not (runs and any(runs.fullmatch(word) for word in arguments))


def _command_of(words: list[str]) -> tuple[str | None, list[str]]:
    """The name of the command `words` begin, without its path, and its arguments: after variables set for it and prefix
    commands with their options, after a line's labels (`_LINE_LABEL`); `python -m pytest`'s is pytest, `CMD=pytest -k`'s
    pytest, a Makefile recipe's `@pytest` pytest. No name where a word may be an
    option's value or the command (`sudo -u git mysql`: git may be sudo's user) or no word is the command."""
    assigned = None
    after_prefix = False
    labels = len(list(itertools.takewhile(_LINE_LABEL.fullmatch, words)))
    for index, word in enumerate(words[labels:], labels):
        if (assignment := _ASSIGNMENT.fullmatch(word)) is not None:
            assigned = assignment.group(1)
        elif word in _PREFIX_WORDS:
            after_prefix = True
        elif after_prefix and (word.startswith("-") or _DURATION.fullmatch(word)):
            continue
        elif after_prefix and index > 0 and words[index - 1].startswith("-"):
            return None, []
        elif word.startswith("-"):
            return (_basename(assigned), words[index:]) if assigned else (None, [])
        elif _PYTHON.fullmatch(name := _basename(word.lstrip("@"))) and len(words) > index + 2 and words[index + 1] == "-m":
            return words[index + 2], words[index + 3:]
        else:
            return name, words[index + 1:]
    return None, []


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _ended_before_the_option(value: str, start: int, end: int) -> bool:
    """Whether a `)` or a backquote out of quotes ends the name's command between it and its option: it closes a `(`, `$(` or
    backquote open before the name (`$(mysql --version) -pedantic-errors`), not one of its own (`mysql -h $(hostname) -p...`,
    `mysql -e "select now()" -p...`)."""
    between = value[start:end]
    if ")" not in between and "`" not in between:
        return False
    depth = 0
    backquotes = 0
    for mark in _PARENTHESES.finditer(between):
        character = mark.group()
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
            if depth < 0:
                return True
        elif character == "`":
            backquotes += 1
    return backquotes % 2 == 1
