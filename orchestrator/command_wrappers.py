"""Which word of a simple command names the command it runs (`CommandReader`): after a line's labels, variables set for it
and the wrappers that run the command after their own options (`sudo -u me`, `time -p`, `env A=1`, `nice -n 5`,
`timeout -s KILL 30`, `xargs -n1`, ...), read as each wrapper's options are (which take a value, which none); ssh's
destination is its argument and what follows it a command of its own.

Where a word may be an option's value or the command (an option a wrapper's table does not list, a runner with no table:
`poetry run`, `uv run`), the command is unknown: the caller then counts every name on it as run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What may come before a command on a line that is no shell's: a prompt (`$ `), a YAML list's dash, a Dockerfile's RUN, a
# YAML key or a Procfile's process type (`script:`, `web:`).
_LINE_LABEL = re.compile(r"[$#>-]|RUN|[\w-]++:")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*+=(.*)", re.DOTALL)
_DURATION = re.compile(r"[0-9.]++[smhd]?+")
_PYTHON = re.compile(r"python[0-9.]*+")
_NICENESS = re.compile(r"--?[0-9]++")


@dataclass(frozen=True)
class _Options:
    """A command's options: the short ones that take no value (`flags`), those that take one (`valued`: attached or the
    next word), the long ones that take one unless after `=`, the long flags, and how many arguments come before the
    command it runs (timeout's duration)."""

    flags: str = ""
    valued: str = ""
    long_valued: frozenset[str] = frozenset()
    long_flags: frozenset[str] = frozenset()
    arguments: int = 0


# The wrappers whose options are known, from their manuals (sudo 1.9, GNU coreutils, findutils and time, bash's builtins).
# xargs's `-e`, `-i` and `-l` take a value only attached; as flags they are listed with the others.
_WRAPPERS = {
    "sudo": _Options(
        "AbEeHiKklnPSsVv", "CDghpRrTtUu",
        frozenset({"--user", "--group", "--chdir", "--prompt", "--role", "--type", "--other-user", "--host", "--close-from",
                   "--command-timeout", "--chroot"}),
        frozenset({"--preserve-env", "--login", "--non-interactive", "--stdin", "--shell", "--set-home", "--background",
                   "--askpass", "--preserve-groups", "--reset-timestamp", "--remove-timestamp"}),
    ),
    "doas": _Options("Lns", "Cu"),
    "env": _Options(
        "i0v", "uCSPa", frozenset({"--unset", "--chdir", "--split-string", "--argv0"}),
        frozenset({"--ignore-environment", "--null", "--debug"}),
    ),
    "nice": _Options("", "n", frozenset({"--adjustment"})),
    "ionice": _Options("t", "cnpPu", frozenset({"--class", "--classdata", "--pid", "--pgid", "--uid"}), frozenset({"--ignore"})),
    "timeout": _Options(
        "v", "ks", frozenset({"--signal", "--kill-after"}), frozenset({"--preserve-status", "--foreground", "--verbose"}), 1
    ),
    "time": _Options(
        "pvaq", "fo", frozenset({"--format", "--output"}), frozenset({"--portability", "--verbose", "--append", "--quiet"})
    ),
    "nohup": _Options(),
    "xargs": _Options(
        "0ortpxeil", "aEdILnPs",
        frozenset({"--arg-file", "--delimiter", "--max-lines", "--max-args", "--max-procs", "--max-chars", "--process-slot-var"}),
        frozenset({"--null", "--no-run-if-empty", "--verbose", "--interactive", "--exit", "--open-tty", "--show-limits"}),
    ),
    "exec": _Options("cl", "a"),
    "command": _Options("pvV"),
    "builtin": _Options(),
    "stdbuf": _Options("", "ioe", frozenset({"--input", "--output", "--error"})),
    "setsid": _Options("cfw", "", frozenset(), frozenset({"--ctty", "--fork", "--wait"})),
}
# Runners whose options are not tabled here (a word after an option may be its value or the command), and the shell's
# words after which a command begins.
_RUNNERS = frozenset({"chrt", "taskset", "poetry", "uv", "pipenv", "pdm", "hatch", "run"})
_SHELL_WORDS = frozenset({"if", "then", "elif", "else", "do", "while", "until", "!", "{"})
# ssh's options (OpenSSH 9): the destination follows them, then more of them, then the command it runs there.
_SSH = _Options("46AaCfGgKkMNnqsTtVvXxYy", "BbcDEeFIiJLlmOoPpQRSWw")


def basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


class CommandReader:
    """Reads a simple command's words one at a time (`role`), as written, quotes removed (`"pytest"` is pytest)."""

    # Its state before a command's first word, as class attributes: a reader is made for each command of a long value,
    # and most read one or two words.
    command: str | None = None  # once known: the command's name, without its path
    remote = False  # the command ssh runs on its destination, whose words a shell there reads again
    unknown = False  # a word that may be an option's value or the command: no command is known
    _labels = True
    _assigned: str | None = None
    _wrapper: _Options | None = None
    _runner = False  # after a runner with no table: any option, a duration
    _after_option = False
    _value_pending = False
    _arguments = 0
    _python = 0  # 1 after `python`, 2 after `python -m`: the module is the command
    _ssh_stage = 0  # 1: ssh's options, 2: after its destination

    def _start(self) -> None:
        """Back to the state before a command's first word: the class's."""
        self.__dict__.clear()

    def role(self, word: str) -> str:
        """What `word` is: "before" the command (a label, a variable, a wrapper or its option), the "command", an "argument"
        of the known command, the ssh "destination", or "other" (a word of a command not known)."""
        if self.unknown:
            return "other"
        if self._python:
            return self._module(word)
        if self.command is not None:
            return self._argument(word)
        option = word.startswith("-") and word != "-"
        after_option, self._after_option = self._after_option, option
        labelled, self._labels = self._labels and _LINE_LABEL.fullmatch(word) is not None, False
        if labelled:
            return "before"
        if self._value_pending:
            self._value_pending = False
            return "before"
        if (assignment := _ASSIGNMENT.fullmatch(word)) is not None:  # `CMD=pytest -k mongo`, `env A=1 mysql`
            if self._wrapper is None and not self._runner:
                self._assigned = assignment.group(1)
            return "before"
        if option and (self._wrapper is not None or self._runner):
            return self._wrapper_option(word)
        if self._wrapper is not None and self._arguments > 0:  # timeout's duration
            self._arguments -= 1
            return "before"
        if self._runner and _DURATION.fullmatch(word):
            return "before"
        if self._runner and after_option and word not in _WRAPPERS and word not in _RUNNERS:
            return self._unknown()  # `uv run --with x pytest`: x may be --with's value or the command
        if word in _WRAPPERS:
            self._wrapper, self._runner, self._arguments = _WRAPPERS[word], False, _WRAPPERS[word].arguments
            return "before"
        if word in _RUNNERS or word in _SHELL_WORDS:
            self._wrapper, self._runner = None, True
            return "before"
        if option:
            if self._assigned is None:
                return self._unknown()
            self.command = basename(self._assigned)
            return self._argument(word)
        name = basename(word.lstrip("@"))
        self.command = name
        self._python = 1 if _PYTHON.fullmatch(name) else 0
        self._ssh_stage = 1 if name == "ssh" else 0
        return "command"

    def _module(self, word: str) -> str:
        """`python -m pytest`: the module is the command; `python` with anything else first is python."""
        if self._python == 1 and word == "-m":
            self._python = 2
            return "before"
        if self._python == 2:
            self._python = 0
            self.command = word
            return "command"
        self._python = 0
        return self._argument(word)

    def _wrapper_option(self, word: str) -> str:
        """A wrapper's option: a value it takes is the next word's role; an option its table does not know leaves the
        command unknown."""
        if self._runner:
            return "before"
        options = self._wrapper
        assert options is not None
        if word == "--":
            return "before"
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name in options.long_valued:
                self._value_pending = "=" not in word
                return "before"
            return "before" if name in options.long_flags else self._unknown()
        if options is _WRAPPERS["nice"] and _NICENESS.fullmatch(word):
            return "before"
        return self._short_options(word, options, "before")

    def _argument(self, word: str) -> str:
        """An argument of the known command; ssh's destination, and the command of its own that follows it."""
        if self._ssh_stage == 0:
            return "argument"
        if self._value_pending:
            self._value_pending = False
            return "other"
        if word.startswith("-") and word != "-":
            return self._short_options(word, _SSH, "other")
        if self._ssh_stage == 1:
            self._ssh_stage = 2
            return "destination"
        self._start()  # the command ssh runs on the destination: read as a command of its own
        self.remote = True
        return self.role(word)

    def _short_options(self, word: str, options: _Options, role: str) -> str:
        """`-nu` read letter by letter: `role` when its table knows each; the first that takes a value takes the rest of
        the word, or the next word when it ends there."""
        for index, letter in enumerate(word[1:], 1):
            if letter in options.valued:
                self._value_pending = index == len(word) - 1
                return role
            if letter not in options.flags:
                return self._unknown()
        return role

    def _unknown(self) -> str:
        self.unknown = True
        self.command = None
        return "other"
