"""Whether a tool's name that inline_secrets.py's `_tool_option` found on a command line plainly names no command that runs:
a plain argument of a command that takes text, not commands (`pytest -k mongo -p plugin`, `pytest -k "mongo or redis" -p
plugin`, `git log --grep mysql -p...`, `pip install mysqlclient ...`), ssh's destination (`ssh mongo -p 2222`), or a name
whose command a `)` or a backquote ends before the option (`$(mysql --version) -pedantic-errors`: gcc's option).

A missed password reaches the model, its transcripts and notes; a false alarm withholds one variable, loudly. So a name
counts unless this is plain: any other command (`npx`, `poetry run`, `RUN`, a prompt's `$`, `ssh host`, `docker exec`,
`find -exec`, `echo ... | sh`) keeps it, and so does a string in quotes that such a command takes (`sh -c "..."`), read as a
command line of its own.

The value is read once, from its start, as a shell reads its words and quotes (`_text_spans`), with no bound on how far back
a command begins. Not with `shlex`: it gives no word's position (the searches find a name by where it is), raises on a quote
never closed (prose's `it's`, a cut-off value) where the rest must still be read, and reads `$(` and a backquote only as
punctuation, as `_TOKEN` does.
"""

from __future__ import annotations

import bisect
import functools
import re

from orchestrator.command_wrappers import CommandReader

# Commands that read their arguments as text, file names or package names, and run none of them. Not `echo` nor `printf`:
# what they print is often piped to a shell or written to a script (`echo mysql -p... | ssh db`), with the password in it.
_TEXT_COMMANDS = frozenset({
    "pytest", "py.test", "grep", "egrep", "fgrep", "rg", "ag", "ack", "git", "find", "ls", "cat", "head", "tail", "wc", "sed",
    "awk", "man", "which", "type", "whereis", "apt", "apt-get", "apt-cache", "dnf", "yum", "brew", "pip", "pip3", "conda", "gem",
})
# Their words that make them run a command after all: `find -exec`, `git bisect run`, `git submodule foreach`, `git rebase -x`,
# `git -c alias...`, git filter-branch's filters, `git difftool --extcmd`, `rg --pre`, `conda run`.
_RUNS_A_COMMAND = {
    "find": re.compile(r"-(?:exec|ok)(?:dir)?+"),
    "git": re.compile(r"run|foreach|exec|-x|--exec.*|-c|--\w+-filter.*|--extcmd.*|-t|--tool.*", re.DOTALL),
    "rg": re.compile(r"--pre.*", re.DOTALL),
    "conda": re.compile(r"run"),
}
# A shell's tokens, from a start, after blanks: a word (its quotes' content in it: `'...'`, `"..."`, bash's `$'...'` with
# its escapes; each closed on its line, or it is none), one character that ends a simple command or opens or closes one (`;`,
# `|`, `&`, a line's end, `(`, `)`, a backquote, a quote not closed on its line), or the end. A quote is read on its line
# only: one that a comment, a heredoc's body or prose (`# it's`) leaves open would else pair with one lines later and turn
# the commands between into a quoted argument. A comment is read as commands (`# mysql -uroot -p...` may be a prompt's).
_TOKEN = re.compile(
    r"""[ \t]*+(?:((?:[^\s;|&()`'"\\$]++|\$(?!')|\\.?|\$'(?:[^'\\\r\n]++|\\.?)*+'|'[^'\r\n]*+'
    |"(?:[^"\\\r\n]++|\\.?)*+")++)|(.|\Z))""",
    re.DOTALL | re.VERBOSE,
)
# A word's parts: in single quotes, in double quotes, in `$'...'`, or none of them.
_WORD_PART = re.compile(r"""'[^']*+'|"(?:[^"\\]++|\\.?)*+"|\$'(?:[^'\\]++|\\.?)*+'|(?:[^'"\\$]++|\$(?!')|\\.?)++""", re.DOTALL)
_QUOTING = re.compile(r"""\\(.)|["']""", re.DOTALL)
_BLANK = re.compile(r"[ \t]")
_QUOTE = re.compile(r"['\"]")
# What a shell that reads a quoted string again (ssh's, on its destination) reads as more than a word's text.
_REREAD = re.compile(r"[;|&()<>`'\"#\r\n]")
_LINE_END = re.compile(r"[\r\n]")
# What ends the command a name begins, once more of them close than open after it, out of quotes.
_PARENTHESES = re.compile(r""""[^"]*+"|'[^']*+'|[()`]""")


def names_no_command_that_runs(value: str, start: int, end: int) -> bool:
    """Whether the tool's name at `value[start:]`, whose option `_tool_option` read up to `end`, plainly runs nothing there:
    a text command's plain argument or ssh's destination (`_argument_not_run`), or its command ended before the option
    (`_ended_before_the_option`)."""
    return _argument_not_run(value, start, end) or _ended_before_the_option(value, start, end)


def _argument_not_run(value: str, start: int, end: int) -> bool:
    """Whether the name at `value[start:]` begins a word or a quoted string's word (after a blank, or right after the quote)
    of an argument that `_text_spans` found runs nothing; only where that shell word ends before the option's end: a quoted
    `"mysql -p..."`, or one the option's value goes on after (awk's `'BEGIN{system("mysql -p'"..."'")}'`), may be a command
    line after all."""
    if start == 0 or value[start - 1] not in " \t\"'":
        return False
    starts, spans = _text_spans(value)
    index = bisect.bisect_right(starts, start) - 1
    if index < 0:
        return False
    span_start, span_end, quoted, word_end = spans[index]
    if not span_start <= start < span_end or word_end >= end:
        return False
    return start > span_start if quoted else value[start - 1] in " \t"


@functools.lru_cache(maxsize=8)  # `_found` asks for each name of each tool: the same value, read once
def _text_spans(value: str) -> tuple[list[int], list[tuple[int, int, bool, int]]]:
    """Where `value` holds arguments that run nothing, in order: each part of a text command's argument (the parts in quotes
    marked, each with its word's end) and ssh's destinations, on the command line `value` is and on those a quoted string
    of another command holds (`sh -c "pytest -k mongo ..."`). Start positions first, for a bisection."""
    spans: list[tuple[int, int, bool, int]] = []
    lines = [(0, len(value), True)]
    while lines:
        line_start, line_end, trusted = lines.pop()
        # A string whose escapes the outer shell removes (`sh -c "grep \\"it's\\" log; ..."`) is read here as written, its
        # quotes paired as the inner shell does not: its names, and those of the strings it holds, count.
        lines += _read_line(value, line_start, line_end, spans if trusted else [], trusted)
    spans.sort()
    return [span[0] for span in spans], spans


def _read_line(
    value: str, start: int, end: int, spans: list[tuple[int, int, bool, int]], trusted: bool
) -> list[tuple[int, int, bool]]:
    """Reads `value[start:end]` as a command line: adds its text arguments' spans to `spans`; returns the quoted strings in
    its other words, each to read as a command line of its own (`trusted` where this one is and they hold no escape).

    A line that leaves a quote open, or whose double quotes hold a `$(` or backquote they do not close (the inner quotes of
    `"$(printf '%s' "it's")"`), a shell reads otherwise from its first quote on: no span nor string from there is kept
    (`grep it's log; mysql -e 'select 1' -p...` holds no quoted `' log; mysql -e '`). A comment ends at its line's end, a
    backslash or a quote before it or not."""
    nested: list[tuple[int, int, bool]] = []
    command: _Command | None = None  # made at its first word: most of a run of `(` or `;` begin none
    outer: list[tuple[str, _Command | None]] = []  # the commands a `(`, `$(` or backquote interrupts
    line, line_spans, line_nested, misread = start, len(spans), 0, False  # where this physical line starts, its first span
    # and string; whether it is misread
    comment = False  # after a word that begins with `#`: a line end in it is no continuation, nor in its quotes
    position = start
    while True:
        token = _TOKEN.match(value, position, end)
        assert token is not None  # `\Z` ends every line
        position = token.end()
        word, mark = token.groups()
        if mark == "":
            break  # the blanks that end the line
        if word is not None and (comment or word[0] == "#") and (cut := _LINE_END.search(word)) is not None:
            # `pip install # note \<newline> mongo -p...`: a comment ends at its line's end, escaped or quoted or not
            position = token.start(1) + cut.start()
            word = word[:cut.start()] or None
            if word is None:
                continue
        comment = comment or word is not None and word[0] == "#"
        if misread and mark not in ("\r", "\n"):
            continue  # up to the line's end
        if word is not None and '"' in word and _opens_a_substitution_in_double_quotes(word) or mark and mark in "'\"$":
            first_quote = _QUOTE.search(value, line, end).start()  # a mark here is a quote not closed on its line, or `$'`
            while len(spans) > line_spans and spans[-1][1] > first_quote:
                spans.pop()
            del nested[line_nested:]
            misread, command = True, None
        elif word is not None:
            command = command or _Command()
            command.read(word, token.start(1), spans, nested, trusted)
        elif mark in "\r\n":
            line, line_spans, line_nested, misread, command, comment = token.end(), len(spans), len(nested), False, None, False
            outer.clear()  # a `(` that a comment or a heredoc's body leaves open closes no `)` lines later
        elif mark in "(`" and not (mark == "`" and outer and outer[-1][0] == "`"):
            if command is not None:
                command.interrupt()
            outer.append((mark, command))
            command = None
        elif mark in ")`" and outer and outer[-1][0] == ("(" if mark == ")" else "`"):
            command = outer.pop()[1]
        else:
            command = None
    return nested


def _opens_a_substitution_in_double_quotes(word: str) -> bool:
    """Whether a double-quoted part of `word` holds a `$(` or backquote it does not close: its `"` that ended it is the
    substitution's own, and the shell's string goes on past it."""
    return any(
        part.group()[0] == '"' and (part.group().count("(") > part.group().count(")") or part.group().count("`") % 2 == 1)
        for part in _WORD_PART.finditer(word)
    )


class _Command:
    """A simple command read one word at a time: which of its words are text arguments (`read`)."""

    def __init__(self) -> None:
        self._reader = CommandReader()
        self._text_command: str | None = None  # once its words are a text command's arguments: its name
        self._settled = False  # no later word can be a text argument: its quoted parts are all there is to read

    def interrupt(self) -> None:
        """A substitution among its words: its output, on ssh's command, is read again there (`ssh db grep x `printf ';'`
        mysql -p...`), so no later word is a text argument."""
        if self._reader.remote:
            self._settled = True

    def read(
        self, word: str, start: int, spans: list[tuple[int, int, bool, int]], nested: list[tuple[int, int, bool]], trusted: bool
    ) -> None:
        """Adds `word`'s spans to `spans` where it is an argument that runs nothing; else its quoted parts to `nested`."""
        quotes = "'" in word or '"' in word
        if self._reader.remote and _read_again_otherwise(word):
            self._settled = True
        if self._settled:
            if quotes:
                _add_quoted(word, start, nested, trusted)
            return
        if "\\" in word:
            unquoted = _QUOTING.sub(r"\1", word)
        else:
            unquoted = word.replace("'", "").replace('"', "") if quotes else word
        name = self._text_command
        if name is None:  # the words before a text command's first argument: its wrappers, its name
            role = self._reader.role(unquoted)
            name = self._reader.command
            if role == "argument" and name in _TEXT_COMMANDS:
                self._text_command = name
            else:
                self._settled = self._reader.unknown or role == "argument" and name != "ssh"
                if role == "destination":
                    spans += _parts(word, start)
                elif quotes:
                    _add_quoted(word, start, nested, trusted)
                return
        runs = _RUNS_A_COMMAND.get(name)
        self._settled = runs is not None and runs.fullmatch(unquoted) is not None
        if self._settled:
            if quotes:
                _add_quoted(word, start, nested, trusted)
        else:
            spans += _parts(word, start)


def _read_again_otherwise(word: str) -> bool:
    """Whether ssh's shell, which reads its command's words again joined by blanks, may read `word` as more than text: what
    this shell's backslashes, expansions and quotes hand it (`ssh db grep x \\; mysql -p...`, `';'`, `"&&"`, `$SEP` run
    mysql there); not a quoted string of plain words (`ssh db pytest -k 'mongo or redis' -p x`)."""
    if "\\" in word or "$" in word:
        return True
    return any(
        part.group()[0] in "'\"" and _REREAD.search(part.group(), 1, len(part.group()) - 1) is not None
        for part in _WORD_PART.finditer(word)
    )


def _parts(word: str, start: int) -> list[tuple[int, int, bool, int]]:
    """The spans of `word`'s parts (at `start`), those in quotes marked, each with the word's end."""
    end = start + len(word)
    if "'" not in word and '"' not in word:
        return [(start, end, False, end)]
    return [(start + part.start(), start + part.end(), part.group()[0] in "'\"", end) for part in _WORD_PART.finditer(word)]


def _add_quoted(word: str, start: int, nested: list[tuple[int, int, bool]], trusted: bool) -> None:
    """Adds the strings in quotes of `word` (at `start`) to `nested`, to read as command lines: those with a blank, as only
    they may hold a name after one (most quoted words are one word: a JSON's keys); trusted where `trusted` and they hold
    no backslash, which the outer shell would have taken out."""
    if not _BLANK.search(word):  # a word's blanks are all in its quotes
        return
    nested += [
        (start + part.start() + 1, start + part.end() - 1, trusted and (part.group()[0] == "'" or "\\" not in part.group()))
        for part in _WORD_PART.finditer(word)
        if part.group()[0] in "'\"" and _BLANK.search(part.group())
    ]


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
