"""Secrets a variable's value holds as a command line, an HTTP header or a .netrc file writes them (value_secrets.py's
`value_secrets` reads the rest): a deploy job's `DEPLOY_ARGS=--api-key ...`, a header list's `Cookie: session=...`, a
.netrc's `machine host login bob password ...`, a tool's own option that takes a password (`MYSQL_CMD=mysql -u app -p...`,
`curl -u user:...`, `sshpass -p ...`, `redis-cli -a ...`, `keytool -storepass ...`, `sqlcmd -P ...`, `bcp`'s and `osql`'s
`-P ...`, `mongosh -p ...`, `htpasswd -b`'s last argument).

Each is read only where its name leaves no doubt that a secret follows: `--password-file PATH` names where one is kept,
`mkdir -p build`, `ssh -p 2222` are no mysql, `sort -u` no curl, a published port (`docker run --name mongo -p 27017:27017`)
no mongo's password, `Cookie: <redacted>` holds none, nor a tool's name that plainly runs nothing there (tool_not_run.py:
`pytest -k mongo -p plugin`, `$(mysql --version) -pedantic-errors`). Every search from a start reads a bounded stretch or up
to the next start (possessive, bounded repeats), so a value is read in time linear in its length: a 1 MB run of near misses
in well under a second.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from orchestrator.tool_not_run import names_no_command_that_runs

# A command line's option whose name ends in a word that says its value is a secret (`--password=...`, `--token ...`,
# `--api-key ...`, `-storepassword ...`; split at `-`, `_` and camel case): its value after `=`, or the next word where
# that is no option (`--password --user me`: mysql then asks for it), or after `:` as Windows tools write it
# (`--password:...`, `/TargetPassword:...`). Quoted up to 256 characters, as `_CONNECTION_SETTING` reads one. Groups: the
# name after dashes, the name after a `/`, then the value as one of those. Not `--password-file`, `--token-count`,
# `--max-tokens`, nor a redirection (`--with-token < token.txt`).
_OPTION = re.compile(
    r"""(?:(?<![\w-])--?+([A-Za-z][\w-]*+)(?:[=:]|[ \t]++(?=[^\s-]))|(?<![^\s"'])/([A-Za-z][\w-]*+):)
    (?:"([^"]{0,256}+)"|'([^']{0,256}+)'|([^\s;|&<>()"'`]++))""",
    re.VERBOSE,
)
_SECRET_OPTION_LAST_WORDS = frozenset({"PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "APIKEY", "AUTHTOKEN", "ACCESSTOKEN"})
# Only after another word: `--client-secret`, `--secret-key`, `--api-key`, `--access-key`; `--secret id=x,src=f` is
# docker's secret's spec, `--key key.pem` curl's file.
_SECRET_OPTION_PAIRS = frozenset({("CLIENT", "SECRET"), ("APP", "SECRET"), ("SECRET", "KEY"), ("API", "KEY"), ("ACCESS", "KEY")})
# A flag before a positional argument (`psql --no-password mydb_prod`, `git push --ask-password origin`), no option's value.
# Also one that says there is none (`adduser --disabled-password app-user`, `--skip-password`, `--allow-empty-password`).
_FLAG_FIRST_WORDS = frozenset(
    {"NO", "ASK", "PROMPT", "WITH", "USE", "SHOW", "PRINT", "GENERATE", "REQUIRE", "DISABLED", "DISABLE", "SKIP", "ALLOW", "EMPTY"}
)
# Split at `-`, `_` and camel case: `/TargetPassword:...` (SqlPackage's), `--secretKey ...`.
_OPTION_WORD_BREAK = re.compile(r"[-_]+|(?<=[a-z0-9])(?=[A-Z])")
# The clients whose `--password` takes no value but after `=` (MySQL's and MariaDB's) or none at all (PostgreSQL's: it
# asks for one): the word after it is the database (`mysql -u app --password shop_production`), which a project's config
# names everywhere. Their names begin a word or end a path, as `_tool_option` reads them; a command ends at `;`, `|`,
# `&` or a line's end.
_PROMPTING_CLIENT = re.compile(r"""(?<![^\s;|&(`'"=/\\])(?:mysql\w*+|mariadb\w*+|psql|pg_\w++|createdb|dropdb)(?:\.exe)?+(?=\s)""")
_COMMAND_END = re.compile(r"[;|&\r\n]")
# An option's value as a command writes it: in quotes (up to 256 characters) or bare. Groups: one for each way.
_WORD_VALUE = r"""(?:"([^"]{0,256}+)"|'([^']{0,256}+)'|([^\s;|&<>()"'`]++))"""
# curl's `-u user:password` (`--user`, `-U`/`--proxy-user` a proxy's): the password after the user's first `:` (`-u user`
# alone has none: curl asks for it).
_USER_PASSWORD = r"""(?:"[^":]{0,256}+:([^"]{1,256}+)"|'[^':]{0,256}+:([^']{1,256}+)'|[^\s:;|&<>()"'`]*+:([^\s;|&<>()"'`]++))"""


def _command_name(tools: str) -> str:
    """A pattern of one of `tools` as a command names it: alone, or ending a path that does not begin with `-` (a compiler's
    `-I/usr/include/mysql` names no mysql), with or without `.exe`."""
    return rf"(?!-)(?:[\w.~+:${{}}%-]*+[/\\])*+(?:{tools})(?:\.exe)?+"


def _tool_option(tools: str, option: str, value: str = _WORD_VALUE, *, words: str = r"[^\s;|&]++") -> re.Pattern[str]:
    """An option of `tools` that takes a secret (`option`, then its `value`): only after the tool's name, among its first 32
    `words` on the same command: `sort -u`, `ls -a`, `git -P` and `ssh -p 22` hold none. The name begins a word (a Makefile
    recipe's `@mysql` too), or ends a path that does not begin with `-`: a compiler's `-I/usr/include/mysql -pedantic-errors`
    holds none. A search from each name reads up to the next word that holds a name where a search starts (`/usr/bin/mysql`,
    `x=mysql`, `"mysql`) or 32 words: each word is read from one name, not from each of 32 before it (`x=curl ` 32 times,
    then a 1 MB path). `_found` leaves out the names that plainly run nothing."""
    name = _command_name(tools)
    return re.compile(
        rf"""(?<![^\s;|&(`'"=@]){name}
        (?:[ \t]++(?!{option}{value}|(?:[^\s;|&]*[(`'"=@])?{name}\s)(?:{words})){{0,32}}+[ \t]++{option}{value}""",
        re.VERBOSE,
    )


# What follows a `-p` on a command that names mysql or mongo but is no password: another tool's, a container's published
# port (`docker run --name mysql -p3306:3306 mysql:8`, `-p "127.0.0.1:27017:27017/tcp"`, a range `-p 27017-27019:27017-27019`,
# the container's port alone `-p 27017`), ssh's (`ssh mongo -p 2222`), pytest's plugin turned off (`tox -e mysql --
# -pno:randomly`, `pytest -k mongo -p no:cacheprovider`). A port has a `:` or up to 5 digits (65535 is the highest): a
# password of digits is told apart only when longer (`mongosh -u app -p 73920184`); shorter, the Redactor would not replace
# it anyway (redactable.py's MIN_REDACTED_CHARS). The port is the whole value as `_WORD_VALUE` reads it: in quotes, or bare up
# to a quote or a backtick (`["docker run --name mysql -p3306:3306"]`).
_PORT = r"(?:[0-9.\[\]-]*+(?::[0-9.\[\]-]*+)++|[0-9]{1,5}+(?:-[0-9]{1,5}+)?+)(?:/(?:tcp|udp|sctp))?+"
_NO_PASSWORD = rf"""(?:"{_PORT}"|'{_PORT}'|{_PORT}(?![^\s;|&<>()"'`]))|["']?+no:"""
# sshpass's options that take a value (`-P` the prompt to wait for, `-f` a file, `-d` a descriptor), then its other options:
# what may come before its `-p` (`sshpass -P assword -p ...`). No value is `sshpass`: a run of `sshpass -P ` is read up to
# the next name, as `_tool_option` reads other words.
_SSHPASS_OPTIONS = r"""-[Pfd][ \t]*+(?!sshpass\s)(?:"[^"]{0,256}+"|'[^']{0,256}+'|[^\s;|&<>()"'`]++)|-(?!p)[^\s;|&]++"""
# Each tool's name, to look for before its search, and the searches that read its secret options' values.
_TOOL_OPTIONS = (
    ("curl", _tool_option("curl", r"(?:-u|--user|-U|--proxy-user)[ \t]*+", _USER_PASSWORD)),
    # sshpass's own options come before the command it runs: `sshpass -f file ssh -p 2222 host`'s `-p` is ssh's port.
    ("sshpass", _tool_option("sshpass", r"-p[ \t]*+(?=[^\s-])", words=_SSHPASS_OPTIONS)),
    ("redis-cli", _tool_option("redis-cli", r"(?:-a[ \t]*+|--pass[ \t]++)(?=[^\s-])")),
    # Not `-storepass:env NAME` nor `-storepass:file PATH`: a variable's name and a file's.
    *((tool, _tool_option(tool, r"-(?:src|dest)?+(?:store|key)pass[ \t]++(?=[^\s-])")) for tool in ("keytool", "jarsigner")),
    # SQL Server's command-line tools: `sqlcmd`, `bcp` and `osql` (`-E`, `-T`: a trusted connection, no password).
    *((tool, _tool_option(tool, r"-P[ \t]*+(?=[^\s-])")) for tool in ("sqlcmd", "bcp", "osql")),
    # The MySQL and MariaDB clients' `-pPASSWORD`, attached: a `-p` alone asks for it (the next word is the database).
    # Not `mysql_config`, `mariadb-config` nor `mysql_config_editor`: they print a build's flags or keep logins, take no password.
    *((name, _tool_option(rf"{name}(?![-_]config)[\w-]*+", rf"-p(?!{_NO_PASSWORD})")) for name in ("mysql", "mariadb")),
    # The MongoDB shells' and tools' `-p PASSWORD`, or attached; a `-p` alone asks for it.
    ("mongo", _tool_option(
        r"mongo(?:sh|dump|restore|export|import|files|stat|top)?+",
        rf"-p[ \t]*+(?=[^\s-])(?!{_NO_PASSWORD})",
    )),
)
# curl's `-b name=value` sends cookies (`_COOKIE` reads its `--cookie`); `-b cookies.txt` names a cookie jar.
_CURL_COOKIES = _tool_option("curl", r"-b[ \t]*+")
# Apache's `htpasswd -b FILE USER PASSWORD` (`-nb USER PASSWORD` prints the entry instead): the last of its arguments after
# flags that include `b`; a number after a flag is its value (`-C 10`, bcrypt's cost). Groups: the flags, then the arguments.
_HTPASSWD = re.compile(
    rf"""(?<![^\s;|&(`'"=@]){_command_name("htpasswd")}
    ((?:[ \t]++-[A-Za-z]++(?:[ \t]++[0-9]++(?=\s))?+){{1,8}}+)((?:[ \t]++(?!-){_WORD_VALUE}){{2,3}}+)""",
    re.VERBOSE,
)
_HTPASSWD_FLAGS = re.compile(r"(?<=-)[A-Za-z]++")
_ARGUMENT = re.compile(_WORD_VALUE)
# An HTTP Cookie or Set-Cookie header (curl -v's `> Cookie:` and `< set-cookie:`, a headers dict's `"Cookie": "..."`), and
# curl's `--cookie` option: the value up to the line's end (or the closing quote). Its cookies' values are the secrets
# (`_COOKIE_PAIR`), a Set-Cookie's first only (its attributes, `Path=/`, follow).
# A cookie's value may be quoted (`sid="..."`, RFC 6265): a quote right after a `=` opens one, read up to 256 characters.
_COOKIE = re.compile(
    r"""(?<![\w-])(?:((?i:set-)?)(?i:cookie)["']?+[ \t]*+:|--cookie(?:=|[ \t]++))[ \t]*+["']?+
    ((?:[^\r\n"']|(?<==)"[^"\r\n]{0,256}+")*+)""",
    re.VERBOSE,
)
_COOKIE_PAIR = re.compile(r"""(?:\A|;)[ \t]*+([^=;\s,]++)=(?:"([^"]*+)"|([^;\s,"]*+))""")
# A .netrc's entry (curl's, git's, ftp's): `machine HOST` or `default`, then keyword and value pairs in any order up to
# its `password`; on one line or several. At most 8 pairs before it: a run of `login machine` is not read to its end from
# each `machine`. A value may be quoted, as curl (7.84 on) and Python's netrc read it, with backslash escapes
# (`login "bob smith" password "pass word"`): read up to 256 characters, as `_OPTION` reads one. Groups: the password
# quoted (its escapes as written), or bare.
_NETRC_VALUE = r'"(?:[^"\\\r\n]|\\.){0,256}+"|\S++'
_NETRC_PASSWORD = re.compile(
    rf"""(?<!\S)(?:machine\s++(?:{_NETRC_VALUE})|default)(?:\s++(?:login|account|port)\s++(?:{_NETRC_VALUE})){{0,8}}+
    \s++password\s++(?:"((?:[^"\\\r\n]|\\.){{0,256}}+)"|(\S++))""",
    re.VERBOSE,
)
_NETRC_ESCAPE = re.compile(r"\\(.)")


def inline_secrets(value: str) -> list[str]:
    """The secrets `value` holds as an option (`_OPTION`, `_TOOL_OPTIONS`), a cookie (`_COOKIE`) or a .netrc entry
    (`netrc_passwords`) writes them, as written."""
    found: list[str] = []
    if "-" in value or "/" in value:
        found += _option_secrets(value)
        found += _tool_secrets(value)
    if "ookie" in value or "OOKIE" in value:
        headers = _COOKIE.finditer(value)
        found += [secret for header in headers for secret in _cookie_values(header.group(2), every=not header.group(1))]
    return found + netrc_passwords(value)


def _tool_secrets(value: str) -> list[str]:
    """The values of the secret options of the tools `value` names (`_TOOL_OPTIONS`, `_HTPASSWD`), and curl's `-b` cookies."""
    found = [_written(option.groups()) for name, search in _TOOL_OPTIONS if name in value for option in _found(search, value)]
    if "curl" in value:
        cookies = [_written(option.groups()) for option in _found(_CURL_COOKIES, value)]
        found += [secret for cookie in cookies if "=" in cookie for secret in _cookie_values(cookie, every=True)]
    if "htpasswd" in value:
        found += [password for login in _found(_HTPASSWD, value) if (password := _htpasswd_password(login)) is not None]
    return found


def _found(search: re.Pattern[str], value: str) -> Iterator[re.Match[str]]:
    """`search`'s matches in `value` (a tool's name, then its option), but those whose name plainly runs nothing there
    (tool_not_run.py); after one of those, from the next character: a later name it read past may still run."""
    position = 0
    while (match := search.search(value, position)) is not None:
        if names_no_command_that_runs(value, match.start(), match.end()):
            position = match.start() + 1
        else:
            yield match
            position = match.end()


def _htpasswd_password(login: re.Match[str]) -> str | None:
    """The password of an `htpasswd` command (`_HTPASSWD`): its last argument when its flags say it is given (`-b`), the
    second with `-n` (no file), the third otherwise."""
    flags = "".join(_HTPASSWD_FLAGS.findall(login.group(1)))
    arguments = [_written(argument.groups()) for argument in _ARGUMENT.finditer(login.group(2))]
    count = 2 if "n" in flags else 3
    return arguments[count - 1] if "b" in flags and len(arguments) >= count else None


def netrc_passwords(text: str) -> list[str]:
    """The passwords of the .netrc entries in `text`: a quoted one as written and as curl reads it, its escapes undone."""
    if "password" not in text:
        return []
    found = [_written(entry.groups()) for entry in _NETRC_PASSWORD.finditer(text)]
    return found + [unescaped for one in found if (unescaped := _NETRC_ESCAPE.sub(r"\1", one)) != one]


def _option_secrets(value: str) -> list[str]:
    """The values of the options of `value` whose names say they are secrets (`_OPTION`), but the word after a database
    client's `--password` (`_PROMPTING_CLIENT`)."""
    options = [option for option in _OPTION.finditer(value) if _secret_option(_written(option.groups()[:2]))]
    clients = [client.start() for client in _PROMPTING_CLIENT.finditer(value)] if options else []
    command_starts = [0] + [end.end() for end in _COMMAND_END.finditer(value)] if clients else [0]
    return [_written(option.groups()[2:]) for option in options if not _prompts(option, clients, command_starts)]


def _prompts(option: re.Match[str], clients: list[int], command_starts: list[int]) -> bool:
    """Whether `option` is a `--password` followed by a word on a command of a client that takes no such value
    (`clients`: where their names start; `command_starts`: where each command of the value starts, sorted)."""
    if option.group(1) is None or option.group(1).upper() != "PASSWORD" or option.string[option.end(1)] not in " \t":
        return False
    command_start = command_starts[bisect.bisect_right(command_starts, option.start()) - 1]
    client = bisect.bisect_left(clients, command_start)
    return client < len(clients) and clients[client] < option.start()


def _secret_option(name: str) -> bool:
    """Whether an option's name (no dashes before it) says its value is a secret."""
    words = [word.upper() for word in _OPTION_WORD_BREAK.split(name) if word]
    named_secret = words[-1] in _SECRET_OPTION_LAST_WORDS or tuple(words[-2:]) in _SECRET_OPTION_PAIRS
    return named_secret and words[0] not in _FLAG_FIRST_WORDS


def _cookie_values(header: str, *, every: bool) -> list[str]:
    """The values of a Cookie header's cookies (`every`), or of a Set-Cookie's own one."""
    pairs = list(_COOKIE_PAIR.finditer(header))
    return [_written(pair.groups()[1:]) for pair in (pairs if every else pairs[:1])]


def _written(parts: tuple[str | None, ...]) -> str:
    """The one of a match's alternative groups that matched: a value quoted one way or the other, or bare."""
    return next(part for part in parts if part is not None)
