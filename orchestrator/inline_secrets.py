"""Secrets a variable's value holds as a command line, an HTTP header or a .netrc file writes them (secrecy.py's
`_value_secrets` reads the rest): a deploy job's `DEPLOY_ARGS=--api-key ...`, `MYSQL_CMD=mysql -u app -p...`, a header
list's `Cookie: session=...`, a .netrc's `machine host login bob password ...`.

Each is read only where its name leaves no doubt that a secret follows: `--password-file PATH` names where one is kept,
`mkdir -p build` and `ssh -p 2222` are no mysql, `Cookie: <redacted>` holds none. Every search from a start reads a
bounded stretch or up to the next start (possessive, bounded repeats), so a value is read in time linear in its length:
a 1 MB run of near misses in well under a second.
"""

from __future__ import annotations

import re

# A command line's option whose name ends in a word that says its value is a secret (`--password=...`, `--token ...`,
# `--api-key ...`, `-storepassword ...`; split at `-` and `_`): its value after `=`, or the next word where that is no
# option (`--password --user me`: mysql then asks for it). Quoted up to 256 characters, as `_CONNECTION_SETTING` reads one.
# Not `--password-file`, `--token-count`, `--max-tokens`, nor a redirection (`--with-token < token.txt`).
_OPTION = re.compile(
    r"""(?<![\w-])--?+([A-Za-z][\w-]*+)(?:=|[ \t]++(?=[^\s-]))
    (?:"([^"]{0,256}+)"|'([^']{0,256}+)'|([^\s;|&<>()"'`]++))""",
    re.VERBOSE,
)
_SECRET_OPTION_LAST_WORDS = frozenset({"PASSWORD", "PASSWD", "PASSPHRASE", "TOKEN", "APIKEY", "AUTHTOKEN", "ACCESSTOKEN"})
# Only after another word: `--client-secret`, `--secret-key`, `--api-key`, `--access-key`; `--secret id=x,src=f` is
# docker's secret's spec, `--key key.pem` curl's file.
_SECRET_OPTION_PAIRS = frozenset({("CLIENT", "SECRET"), ("APP", "SECRET"), ("SECRET", "KEY"), ("API", "KEY"), ("ACCESS", "KEY")})
# A flag before a positional argument (`psql --no-password mydb_prod`, `git push --ask-password origin`), no option's value.
_FLAG_FIRST_WORDS = frozenset({"NO", "ASK", "PROMPT", "WITH", "USE", "SHOW", "PRINT", "GENERATE", "REQUIRE"})
# The MySQL and MariaDB clients' `-pPASSWORD`, attached (a `-p` alone asks for it; the next word is the database): after
# the tool's name among its first 32 other words on the same command. A search from each `mysql` reads up to the next
# or 32 words: a run of `/mysql` words is not read to its end from each.
_MYSQL_PASSWORD = re.compile(
    r"""(?<![\w.-])(?:mysql|mariadb)[\w-]*+(?:\.exe)?+
    (?:[ \t]++(?!-p|mysql|mariadb)[^\s;|&]++){0,32}+
    [ \t]++-p(?:"([^"]{0,256}+)"|'([^']{0,256}+)'|([^\s;|&<>()"'`]++))""",
    re.VERBOSE,
)
# An HTTP Cookie or Set-Cookie header (curl -v's `> Cookie:` and `< set-cookie:`, a headers dict's `"Cookie": "..."`), and
# curl's `--cookie` option: the value up to the line's end (or the closing quote). Its cookies' values are the secrets
# (`_COOKIE_PAIR`), a Set-Cookie's first only (its attributes, `Path=/`, follow).
_COOKIE = re.compile(r"""(?<![\w-])(?:((?i:set-)?)(?i:cookie)["']?+[ \t]*+:|--cookie(?:=|[ \t]++))[ \t]*+["']?+([^\r\n"']*+)""")
_COOKIE_PAIR = re.compile(r"(?:\A|;)[ \t]*+([^=;\s,]++)=([^;\s,]*+)")
# A .netrc's entry (curl's, git's, ftp's): `machine HOST` or `default`, then keyword and value pairs in any order up to
# its `password`; on one line or several. At most 8 pairs before it: a run of `login machine` is not read to its end from
# each `machine`.
_NETRC_PASSWORD = re.compile(
    r"(?<!\S)(?:machine\s++\S++|default)(?:\s++(?:login|account|port)\s++\S++){0,8}+\s++password\s++(\S++)"
)


def inline_secrets(value: str) -> list[str]:
    """The secrets `value` holds as an option (`_OPTION`, `_MYSQL_PASSWORD`), a cookie (`_COOKIE`) or a .netrc entry
    (`netrc_passwords`) writes them, as written."""
    found: list[str] = []
    if "-" in value:
        found += [_written(option.groups()[1:]) for option in _OPTION.finditer(value) if _secret_option(option.group(1))]
        if "-p" in value:
            found += [_written(login.groups()) for login in _MYSQL_PASSWORD.finditer(value)]
    if "ookie" in value or "OOKIE" in value:
        headers = _COOKIE.finditer(value)
        found += [secret for header in headers for secret in _cookie_values(header.group(2), every=not header.group(1))]
    return found + netrc_passwords(value)


def netrc_passwords(text: str) -> list[str]:
    """The passwords of the .netrc entries in `text`."""
    return _NETRC_PASSWORD.findall(text) if "password" in text else []


def _secret_option(name: str) -> bool:
    """Whether an option's name (no dashes before it) says its value is a secret."""
    words = re.split(r"[-_]+", name.upper())
    named_secret = words[-1] in _SECRET_OPTION_LAST_WORDS or tuple(words[-2:]) in _SECRET_OPTION_PAIRS
    return named_secret and words[0] not in _FLAG_FIRST_WORDS


def _cookie_values(header: str, *, every: bool) -> list[str]:
    """The values of a Cookie header's cookies (`every`), or of a Set-Cookie's own one."""
    pairs = _COOKIE_PAIR.findall(header)
    return [value for _name, value in (pairs if every else pairs[:1])]


def _written(parts: tuple[str | None, ...]) -> str:
    """The one of a match's alternative groups that matched: a value quoted one way or the other, or bare."""
    return next(part for part in parts if part is not None)
