"""Secrets kept from the agent's commands and the check, and out of what a night writes down.

The agent runs shell commands, and small models debug with `env`: whatever overnight's own
environment holds (the model server's API key, a CI job's token, a database password, the
ssh agent's socket) would land in the transcript, the run store, notes.md (which the next
prompt carries) and, written to a file, on the task's branch that CI then pushes. So:

- the agent's commands and the task's check run without the variables whose names say they
  hold a secret (`looks_secret`) or whose values hold a URL or an Oracle login with a password, a connection string's
  secret setting, an Authorization header, or a secret as a command line, a Cookie header or a .netrc writes it
  (`inline_secrets.py`: `holds_secret`); the
  check (also when the agent runs it) gets those its task names in `pass_env`, the agent's own
  commands never;
- what a tool or the check prints has the values of those variables, the model's API key,
  the run store's password and the user's .netrc passwords replaced by `***` (`Redactor`), however the agent came by them; so
  have the model's own words where they are written down (its text, its calls' arguments, its
  summary: `surrogates.strings_mapped` with the redaction), while its tools get them as it wrote them;
- a file the check given `pass_env` wrote one of its values into stays off the task's branch
  (`PassedSecrets`, which secret_commits.py scans what worktree.commit would commit for).

Not a sandbox: files the user can read (~/.git-credentials, a committed config) stay readable;
the redaction keeps their known values out of the night's records.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from orchestrator.inline_secrets import inline_secrets, netrc_passwords

# Words of a variable's name (split at `_`) that say its value is a secret: OPENAI_API_KEY,
# GITHUB_TOKEN, CI_JOB_TOKEN, AWS_SECRET_ACCESS_KEY, SSH_AUTH_SOCK, GOOGLE_APPLICATION_CREDENTIALS,
# GH_PAT, MYSQL_PWD, DB_PASS, NGROK_AUTHTOKEN, CI_JOB_JWT, SENTRY_DSN. Whole words:
# TOKENIZERS_PARALLELISM and GIT_AUTHOR_NAME are no secrets.
_SECRET_WORDS = frozenset(
    {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH", "PAT", "PWD",
     "AUTHTOKEN", "ACCESSTOKEN"}
)
# Words that say so only at the name's end: DB_PASS, CI_JOB_JWT, SENTRY_DSN; not PASS_RATE, JWT_ALGORITHM, DSN_TIMEOUT.
_SECRET_LAST_WORDS = frozenset({"PASS", "JWT", "DSN"})
# The last words of a webhook's URL, whose path is its token: SLACK_WEBHOOK_URL; not WEBHOOK_PORT, WEBHOOK_PATH, ENABLE_WEBHOOK.
_SECRET_URL_WORDS = ["WEBHOOK", "URL"]
# The same glued to other letters: PGPASSWORD, CLIENTSECRET.
_SECRET_PARTS = ("PASSWORD", "PASSWD", "SECRET", "APIKEY")
# Only in a setting's name (a URL's query, a connection string's), never a variable's, where they name flags and folders
# (VERIFY_SIGNATURE=true, GPG_SIG, TIKTOKEN_CACHE_DIR): at its end, a signed URL's `sig` (Azure's SAS) and
# `X-Amz-Signature`, not SIGNATURE_VERSION; glued to other letters at a word's end, a query's camel-case `apiToken`,
# `refreshToken` and `privateKey`, Azure's AccountKey and SharedAccessKey, not MAX_TOKENS nor Azure's SharedAccessKeyName
# (a policy's name).
_SECRET_SETTING_LAST_WORDS = frozenset({"SIG", "SIGNATURE"})
_SECRET_ENDINGS = ("TOKEN", "PRIVATEKEY", "ACCOUNTKEY", "ACCESSKEY")
_NUMBERING = re.compile(r"V?[0-9]*")
_NOT_SECRETS = frozenset({"PWD", "OLDPWD"})  # the shell's folders
_WORD_BREAK = re.compile(r"[^A-Z0-9]+")  # SSH_AUTH_SOCK; in a URL's query, api-key
_SETTING_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")  # also camel case: keyStore|Password
# Shorter values are not replaced: "1", "true" or a port would mangle every output they appear in.
MIN_REDACTED_CHARS = 8
REDACTED = "***"


@functools.lru_cache(maxsize=4096)  # asked of every variable for every command: the names repeat
def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret."""
    upper = name.upper()
    if upper in _NOT_SECRETS:
        return False
    words = _WORD_BREAK.split(upper)
    return (
        any(part in upper for part in _SECRET_PARTS) or not _SECRET_WORDS.isdisjoint(words)
        or _last_word(words) in _SECRET_LAST_WORDS
        or words[-len(_SECRET_URL_WORDS):] == _SECRET_URL_WORDS
    )


def _last_word(words: list[str]) -> str:
    """The last of a name's `words` before a version or a number: CI_JOB_JWT_V2 (GitLab's), DB_PASS_2."""
    return next((word for word in reversed(words) if not _NUMBERING.fullmatch(word)), "")


# Asked for every variable of the environment at each command the agent runs: the same few dozen pairs, read once each.
@functools.lru_cache(maxsize=1024)
def holds_secret(name: str, value: str) -> bool:
    """Whether a variable is withheld: its name says so, or its value holds a URL with a password
    (DATABASE_URL=postgres://app:pw@db/app, GitLab's CI_REPOSITORY_URL with the job token), an Oracle login (scott/pw@//db/orcl),
    a secret setting or header (`Server=db;Password=...`, `Authorization: Bearer ...`), or an option's, a cookie's or a
    .netrc entry's secret (`--password=...`, `Cookie: session=...`): `_value_secrets`."""
    # Only a password the Redactor would hide: `postgres://postgres:postgres@localhost/test`, a CI service
    # database's, is in the project's own files and shown anyway; withheld, the check just fails.
    return looks_secret(name) or any(_redactable(secret) for secret in _value_secrets(value))


def withheld(environment: Mapping[str, str], pass_env: Collection[str] = ()) -> list[str]:
    """The names of `environment` that the agent's commands and the check run without."""
    return sorted(name for name, value in environment.items() if holds_secret(name, value) and name not in pass_env)


def without_secrets(environment: Mapping[str, str], pass_env: Collection[str] = ()) -> dict[str, str]:
    """`environment` less the variables `withheld` names."""
    return {name: value for name, value in environment.items() if name in pass_env or not holds_secret(name, value)}


class Redactor:
    """Replaces known secret values in text with ***: as written, as JSON encoders escape them in a string, as repr() and
    ascii() quote them or their bytes, and as URL writers percent-encode them (`_escaped_forms`)."""

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
        kept = {value.strip() for value in [*values, *pieces] if _redactable(value)}
        # Also as JSON text holds it (a call's arguments, a message's, a server's answer, are recorded as such), as a
        # traceback quotes it with repr(): `a"b` is `a\"b` there, and as a URL a tool prints holds it: `a/b` is `a%2Fb`.
        self._use(form for value in kept for form in _escaped_forms(value))

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
        values += [secret for value in os.environ.values() for secret in _value_secrets(value)]
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


# More than any .netrc: a file that large is no credentials file, and is read no further.
_NETRC_MAX_BYTES = 1 << 20


def netrc_file_passwords() -> list[str]:
    """The passwords of the .netrc that curl, git and ftp read (`$NETRC`, else `~/.netrc`): the agent's commands can
    read the file (`cat ~/.netrc`, `curl --netrc -v`), and the redaction keeps its known values out of the records."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        # Without O_NONBLOCK a pipe's open waits for a writer: a FIFO at ~/.netrc (one a password manager fills) held every
        # night's start, and each Redactor.for_night after it, for ever. Only a regular file is read: a device (/dev/tty,
        # /dev/stdin) would be waited on, and a pipe's text would be taken from curl or git, which read it next.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none, or unreadable
        return []
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a folder, a pipe, a device
            return []
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as netrc:
            return netrc_passwords(netrc.read(_NETRC_MAX_BYTES).decode("utf-8", errors="surrogateescape"))
    except OSError:  # the read failed (EIO)
        return []
    finally:
        os.close(descriptor)


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
        for piece in Redactor([value, *_value_secrets(value)]).values:
            names_by_value.setdefault(os.fsencode(piece), set()).add(name)
    return PassedSecrets({value: tuple(sorted(names)) for value, names in names_by_value.items()})


# A value of these characters alone has no other form: every encoder below writes them as they are.
_ONE_FORM = re.compile(r"[A-Za-z0-9_.-]*")
_GO_AS_U = "<>&\u2028\u2029"
_GO_BEFORE_1_22_AS_U = _GO_AS_U + "\b\f"
_GSON_AS_U = "<>&='\u2028\u2029"
_DOTNET_AS_U = "\"'+<>&`"
# An escape of a JSON string's text (kept whole: the `/` of `\\/` is no slash) or a character an encoder may write otherwise.
_RESPELLED = re.compile("\\\\u[0-9a-f]{4}|\\\\.|[" + re.escape("/=" + _GO_AS_U + _DOTNET_AS_U) + "]", re.DOTALL)
# json.dumps's short escapes of the characters some encoder writes as `\u` escapes instead.
_SHORT_ESCAPED = {'\\"': '"', "\\b": "\b", "\\f": "\f"}
# What URL writers keep as it is of a value besides letters, digits, `-._` and `~` (RFC 3986's unreserved characters):
# nothing (Python's quote(safe=""), curl, PHP's rawurlencode), `/` (Python's quote(): a path), space and `+`
# (SQLAlchemy's URL: a store's password), the sub-delimiters a user info may hold (Go's url.UserPassword; yarl's, which
# aiohttp writes, all of them; WHATWG's, which Node's URL and httpx write, `%` too but not `;=`), `!'()*` (JavaScript's
# encodeURIComponent).
_URL_KEPT = ("", "/", " +", "$&+,;=", "!$&'()*+,;=", "!$%&'()*+,", "!'()*")
# What form writers (space as `+`) keep as it is besides letters, digits and `-._`, and `~` only where it is listed:
# Python's quote_plus and urlencode, Go's QueryEscape (`~`); PHP's urlencode (nothing); Java's URLEncoder and WHATWG's
# form, JavaScript's URLSearchParams (`*`); .NET's HttpUtility and WebUtility (`!()*`); yarl's query, aiohttp's params.
_FORM_KEPT = ("~", "", "*", "!()*", "!$'()*,/:?@~")
_PERCENT_ESCAPE = re.compile("%[0-9A-F]{2}")


def _escaped_forms(value: str) -> tuple[str, ...]:
    """`value`, and the same as the JSON encoders in use write it in a string (`_json_forms`), as repr() and ascii() quote a
    str or its bytes holding it (`_repr_forms`), and as URL writers percent-encode it (`_percent_forms`). A value of
    letters, digits and `-_.` (most secrets) is its only form: no cost added. An encoder's mix of these per character is
    not matched: no decoder."""
    if _ONE_FORM.fullmatch(value):
        return (value,)
    return tuple({value, *_json_forms(value), *_repr_forms(value), *_percent_forms(value)})


def _json_forms(value: str) -> set[str]:
    """`value` as JSON encoders write it in a string: Python's json.dumps with and without ensure_ascii (JavaScript's
    JSON.stringify and nlohmann's C++ write the latter), each also with its `\\u` escapes in upper-case hex (Java's Jackson)
    and with `/` as `\\/` (PHP's json_encode); Jackson escaping non-ASCII, which leaves DEL (U+007F) as it is; Go's (`<`,
    `>`, `&`, U+2028 and U+2029 as `\\u` escapes; before Go 1.22 `\\b` and `\\f` too); Java's Gson (Go's, and `=` and `'`,
    by default); .NET's System.Text.Json (`"`, `'`, `+`, `<`, `>`, `&`, the backtick and non-ASCII as upper-case `\\u`
    escapes)."""
    unicode = json.dumps(value, ensure_ascii=False)[1:-1]
    ascii_only = json.dumps(value)[1:-1]
    forms = {
        _respelled(written, upper_hex=upper_hex, slash=slash) for written in (unicode, ascii_only) for upper_hex in (False, True) for slash in (False, True)
    }
    forms.add(_respelled(ascii_only, upper_hex=True, unescaped="\x7f"))
    forms.update(_respelled(unicode, as_u=as_u) for as_u in (_GO_AS_U, _GO_BEFORE_1_22_AS_U, _GSON_AS_U))
    forms.add(_respelled(ascii_only, as_u=_DOTNET_AS_U, upper_hex=True))
    return forms


def _repr_forms(value: str) -> set[str]:
    """`value` as repr() writes it in a str (a traceback's `{value!r}`), as ascii() does (`{value!a}`: non-ASCII as `\\xNN`,
    `\\uNNNN`, `\\UNNNNNNNN`) and as repr() writes its UTF-8 bytes (`b'...'`: non-ASCII as `\\xNN`), each with `'` escaped or
    not (they quote with `"` what holds `'` only). The three differ only for a value holding non-ASCII."""
    forms: set[str] = set()
    for written in (repr('"' + value)[2:-1], ascii('"' + value)[2:-1], repr(b'"' + _utf8(value))[3:-1]):  # both quotes: `'` escaped
        forms.update((written, written.replace("\\'", "'")))
    return forms


def _percent_forms(value: str) -> set[str]:
    """`value` as URL writers percent-encode its UTF-8 bytes into a query, a path or a user info, in upper-case hex as RFC
    3986 asks, each keeping as they are the characters `_URL_KEPT` lists for it; and as form writers encode it (space as
    `+`), each keeping those `_FORM_KEPT` lists. Python's quote_plus, the one that keeps nothing and .NET's form also in
    lower-case hex (.NET's HttpUtility.UrlEncode writes a form so). Other writers match where their choice is one of
    these for the value (JavaScript's encodeURI keeps base64's `/+=`: the value as written); one that re-quotes a whole
    URL keeping most delimiters (requests', httpx's, encodeURI), or hex of mixed case, does not: no decoder."""
    raw = _utf8(value)
    forms = {quote(raw, safe=kept) for kept in _URL_KEPT}
    # quote_plus keeps `~` whatever `safe` says: a form writer that does not writes it %7E.
    forms.update(quote_plus(raw, safe=kept) if "~" in kept else quote_plus(raw, safe=kept).replace("~", "%7E") for kept in _FORM_KEPT)
    in_lower_hex = (quote(raw, safe=""), quote_plus(raw), quote_plus(raw, safe="!()*").replace("~", "%7E"))
    return forms | {_PERCENT_ESCAPE.sub(lambda escape: escape.group().lower(), form) for form in in_lower_hex}


def _utf8(value: str) -> bytes:
    """`value` as a program writes it out: UTF-8, an environment's undecodable bytes (os.fsdecode's escapes) as they were."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no undecodable byte gave (json.loads of "\ud800"): no program writes it
        return value.encode("utf-8", "surrogatepass")


def _respelled(written: str, *, upper_hex: bool = False, slash: bool = False, as_u: str = "", unescaped: str = "") -> str:
    """JSON string text (json.dumps's, quotes off) as another encoder writes it: its `\\u` escapes in upper-case hex,
    `/` as `\\/`, the characters of `as_u` (`"`, `\\b` and `\\f` too, which json.dumps writes `\\"`, `\\b`, `\\f`) as `\\u`
    escapes, those of `unescaped` as they are."""
    hex_digits = "X" if upper_hex else "x"

    def respell(found: re.Match[str]) -> str:
        token = found.group()
        if token.startswith("\\u"):
            if (character := chr(int(token[2:], 16))) in unescaped:
                return character
            return "\\u" + (token[2:].upper() if upper_hex else token[2:])
        character = _SHORT_ESCAPED.get(token, token)
        if len(character) > 1:  # another escape: `\\\\`, `\\n`
            return token
        if character in as_u:
            return f"\\u{ord(character):04{hex_digits}}"
        return "\\/" if character == "/" and slash else token

    return _RESPELLED.sub(respell, written)


def _redactable(value: str) -> bool:
    """Long enough, and no plain word (below), to be replaced by the Redactor."""
    value = value.strip()
    return len(value) >= MIN_REDACTED_CHARS and not _plain_word(value)


def _plain_word(value: str) -> bool:
    """Letters of one case only, shorter than a generated secret."""
    return len(value) < 16 and value.isalpha() and (value.islower() or value.isupper())


# scheme://user:password@host..., and a query's settings (?password=..., ?key=...). Groups: the user, the password as
# SQLAlchemy reads a [store] url's, and the password's further `@` parts that urllib and httpx read into it.
# Possessive and atomic: backtracking over a value's every `@` took quadratic time. Among other words a URL ends at white
# space, and its user at a `"` that ends a JSON string (RFC 3986 has it percent-encoded): a JSON config's
# `{"api":"https://api:8443","web":"https://localhost","owner":"ops@example.com"}` holds no password.
_USERINFO = re.compile(
    r"""(?<=//)
    ((?:[^:/?#\[\]\s"]              # the user, as SQLAlchemy's: up to its first `:`, an `@` in it included (Azure's
                                    # `admin@server`); a `[` begins an IPv6 host (`http://[::1]:443/simple?next=a@b`)
      |(?<=\w)"(?=\w)               # a `"` among its letters (`my"user`): not one a JSON string ends or begins with
                                    # (`"//localhost","owner":"ops@x"`), nor one of code's (`"//"+user+"x:"+pw+"@"`)
    )*+)
    (?::
        (                           # the password: up to the `@`, so a generated one with `/`, `?` or `#` left
                                    # unencoded counts whole (RFC 3986's reading stopped at the `/` and showed it all)
            (?![0-9]*[/?#]|[0-9]+[,;:)|"])  # but digits then `/?#` are a port (`http://host:8080/users/a@b`), and
                                    # digits then a list's `,;:)|` or a string's end too (`http://es1:9200|http://a@es2`)
            [^@\s]*+)
        ((?>(?:@[^@/?#\s]*+)*(?=@)))  # up to the authority's last `@`, as urllib and httpx read `http://me:pw@rd@host`
    )?@""",
    re.VERBOSE,
)
def _one_urls_userinfo(quote: str = "") -> re.Pattern[str]:
    """The user info of a value that is one URL and nothing else (`quote` ""), or of a string in `quote`s that is one URL.

    A value that is one URL (a config's url, DATABASE_URL) is read as SQLAlchemy reads it: its user and password may hold
    spaces (`pass phrase words`), which a scan for URLs among other words (JAVA_OPTS' `-Dproxy=http://h:3128 -Dme=a@b`,
    pip's space-separated index URLs) must not take for part of them; its query and fragment may hold them too
    (`?driver=ODBC Driver 18`). What begins like a host and then words is no user info.

    A quoted one is a JSON value's or list's (`{"url": "postgresql://u:pass phrase@db/app"}`), a Python repr's, a shell's
    or an env file's (`DATABASE_URL='...'`): its password may hold spaces, its user not (a host, words, a time and an e-mail
    address are none: `"https://status.example down 10:30am, ask ops@example.com"`). Each part ends at the closing quote,
    so a search from every opening one reads each string once."""
    start = rf"(?<={quote})" if quote else r"\s*"  # right after the opening quote; or the value's start
    user_ends = rf"\s{quote}" if quote else r"\r\n"
    end = quote if quote else r"\s*\Z"
    return re.compile(
        rf"""{start}[A-Za-z][\w+.\-]*://  # a scheme, `_` in it too (`oracle+cx_oracle`)
        ([^:/?#\[\]{user_ends}]*+)         # the user, as `_USERINFO`'s
        (?::
            ((?![0-9]*[/?#]|[0-9]+[\s,;:)|{quote}]|\s++(?![^\s@{quote}]++@))  # no port then words (`https://db:3128, ask
                                        # ops@example.com`) or the string's end, no words after a colon: a password that
                                        # begins with a space is one word up to the `@` (`https://u: pw@db`)
                [^@\r\n{quote}]*+)
            ((?>(?:@[^@/?#\s{quote}]*+)*(?=@)))
        )?@
        (?=[^\s?#{quote}]*+(?:[?#][^\r\n{quote}]*+)?{end})  # then a host and path with no space, a query or fragment
                                                          # that may hold them, up to the value's end or the closing quote""",
        re.VERBOSE,
    )


_ONE_URLS_USERINFO = _one_urls_userinfo()


_QUOTED_URLS_USERINFOS = (_one_urls_userinfo('"'), _one_urls_userinfo("'"))
# Oracle's `user/password@connect`, which no URL reader reads: JDBC's thin and OCI URLs
# (`jdbc:oracle:thin:scott/tiger@//db:1521/orcl`, `...@db:1521:orcl`), EZConnect with `//` or a port and a service
# (`scott/tiger@db:1521/orcl`), a TNS descriptor (`scott/tiger@(DESCRIPTION=...)`), and the login the tools take
# (`sqlplus -S scott/tiger@orcl`, `rman target sys/tiger@orcl`, `expdp userid=scott/tiger@orcl`).
# Alone, `a/b@c` is a path, a GitHub Action (`actions/checkout@v4`), a Go module's version (`golang.org/x/tools@v0.1.0`), an
# npm package's (`@scope/pkg@1.2`) or an image (`docs/v1@2x.png`).
# Oracle reads a password with marks other than `_$#` only double-quoted, so an unquoted one ends at a `/`: a search from
# every word of a run of `a/,a/,a/` then reads up to its next `/` only, not to the run's end.
_ORACLE_LOGIN = re.compile(
    r"""(?:
        jdbc:oracle:\w++:                # a JDBC URL's driver (thin, oci)
      | (?<![\w$\#.@:-])                 # a tool, its folder before it (`$ORACLE_HOME/bin/sqlplus`), its options, rman's
        (?i:sqlplus|sqlldr|expdp|impdp|rman|dgmgrl)(?:\.exe)?+(?:\s++-[A-Za-z]\w*+)*+\s++  # database to connect to,
        (?i:(?:target|catalog|auxiliary)\s++)?+(?:\\?+["'])?+  # the login quoted too, also for a shell's
                                    # `\"`: `expdp \"sys/pw@orcl as sysdba\"`
      | (?:\A|(?<=[\n;"']))[ \t]*+(?i:conn(?:ect)?+)[ \t]++  # SQL*Plus's CONNECT: a statement's first word (a line's, after
                                    # a `;` or a quote), the login all that follows but a role, an edition and the statement's
                                    # end: prose's `connect org/repo@main to CI` is none; and with a database (`@`) or a role,
                                    # or ended by a `;` or a quote: a line of its own, GitLab's CI_COMMIT_TITLE `Connect
                                    # web/checkout-flow`, would hide the folder `checkout-flow` wherever it is named
        (?=(?:"[^"\r\n]*+"|[^\s;"'])++(?:[ \t]++(?i:as[ \t]++sys\w*+|edition=[^\s;"']*+))?+[ \t]*+(?:[;"'\r\n]|\Z))
        (?=(?:"[^"\r\n]*+"|[^\s;"'@])*+(?:@|[ \t]++(?i:as[ \t]++sys)|(?:[ \t]++(?i:edition=[^\s;"']*+))?+[ \t]*+[;"'])
           |[^\s;"'@/]++/")          # or with a quoted password
      | (?<=SQL>)[ \t]*+(?i:conn(?:ect)?+)[ \t]++  # at SQL*Plus's prompt, a local login's line too
        (?=(?:"[^"\r\n]*+"|[^\s;"'])++(?:[ \t]++(?i:as[ \t]++sys\w*+|edition=[^\s;"']*+))?+[ \t]*+(?:[;"'\r\n]|\Z))
      | (?<![\w$\#./@:\\-])              # else a word of its own: not a path's part (`a/b/c@//h`) nor a package's (`@s/p@1`)
        (?:(?i:userid)=["']?+            # the tools' `userid=` parameter
          | (?=[A-Za-z][\w$\#.]*+(?:\[[A-Za-z][\w$\#.]*+\])?+/(?:\\?+"[^"\r\n]*+"|[^\s@"'/]++)@  # or EZConnect's `@//`
                                    # (`@tcps://`), a TNS descriptor, or
              (?:(?:tcps?:)?//|\((?i:description)|  # a host (a name or an IPv4 address), a port and a service or SID:
                 (?:[A-Za-z][\w.-]*+|[0-9]++(?:\.[0-9]++){3})(?<!\.):[0-9]{2,5}+[/:][A-Za-z])))  # not `a/b@10:30`,
                                    # `x/y@npm:2.1`, `web/App@localhost:3000`
    )
    [A-Za-z][\w$\#.]*+(?:\[[A-Za-z][\w$\#.]*+\])?+/  # the user, as Oracle's names: letters, digits, `_$#`; a proxy
                                    # user's the user it connects as in brackets (`scott[hr]/pw@orcl`)
    (?:\\?+"((?:[^"\\\r\n]|\\(?!"))*+)\\?+"(?=[@\s"';]|\Z)  # the password: double-quoted (`\"pass word\"` too),
      | ([^\s@"'/]++(?=["']?+@)         # or up to a connect's `@` (`"scott/tiger"@orcl` too),
         | [^\s@"'/.&;]++(?=[\s"';]|\Z)))  # or, with none (a local login), without a file's `.`, a query's `&` or a
                                    # statement's `;`: a tool's name before a path (`sqlplus scripts/deploy.sql`) gives none""",
    re.VERBOSE,
)
# A setting's name holds no `?`: read from each `?` of a run of them, one without `=` was scanned to its end as often.
_QUERY_SETTING = re.compile(r"(?<=[?&])([^=&#\s?]+)=([^&#\s]*)")
# Before a query, settings after `;` as JDBC's SQL Server URL has them (`jdbc:sqlserver://db:1433;user=sa;password=...`).
_PARAMETER_SETTING = re.compile(r"(?<=;)([^=;&?#\s]+)=([^;\s]*)")
# After a `#`, the settings of a fragment: OAuth's implicit grant hands its token to a redirect URL so
# (`https://app/callback#access_token=...&token_type=Bearer`).
_FRAGMENT_SETTING = re.compile(r"(?<=[#&])([^=&#\s?]+)=([^&#\s]*)")
_RUN = re.compile(r"\S+")
# What stands for a password in a template no one filled in (`postgresql://app:${DB_PASSWORD}@db/app` in a compose file's
# environment, `?api_key=<your-api-key>`, `{{ secrets.TOKEN }}`, `%DB_PASS%`): no secret, and the project's own files
# hold it, which read_file would show as *** and the model write back so.
# A bare `$NAME` only as variables are named, in capitals: a generated password may begin with `$` (`$ecretPa55`). A
# command's output a shell puts there (`--password="$(pass show db/prod)"`, `` --token `cat ~/.token` ``) too.
_PLACEHOLDER = re.compile(r"\$\{[^{}]*\}|\$[A-Z_][A-Z0-9_]*|%[A-Za-z_]\w*%|<[^<>]*>|\{\{[^{}]*\}\}|\$\([^()]*\)|`[^`]*`")
# An HTTP Authorization header's credentials, as a variable of headers holds them (`Authorization: Basic dXNlcjpwdw==`,
# OpenTelemetry's OTEL_EXPORTER_OTLP_HEADERS=`Authorization=Bearer%20...`), a Proxy-Authorization's too: after its scheme,
# if any.
_AUTHORIZATION = re.compile(
    r"""(?<!\w)[Aa]uthorization[ \t]*+[:=][ \t]*+
    (?:(?i:basic|bearer|token|digest|negotiate|apikey)(?:[ \t]++|%20))?+
    ([^\s,;"']++)""",
    re.VERBOSE,
)
# A PEM private key (RSA's, OpenSSH's, an encrypted one, PGP's key block) with its line breaks, or as an env file or a JSON
# key file (`"private_key": "-----BEGIN PRIVATE KEY-----\nMIIE...`) writes it on one line, with `\n` escapes. Read up to
# its END, never past another BEGIN: a run of BEGINs with no END is read once, not to its end from each.
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?:(?!-----BEGIN ).)*?-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----",
    re.DOTALL,
)
# A setting of a connection string that is no URL (ADO.NET's and ODBC's `Server=db;User Id=sa;Password=...;`, Azure's
# `...;AccountKey=...`, libpq's `host=db password=...`), a Java system property (`-Djavax.net.ssl.keyStorePassword=...`) or an
# MSBuild property (`dotnet publish -p:Password=...`, `/p:`, `/property:`): a name at the value's start, after a `;`,
# white space, `-D` or `-p:`, and its value up to the next `;` or white space, or quoted
# (`Password="a;b"`, ODBC's `PWD={a;b}`). Groups: the name, then the value as one of those. Not a `--name=value` option:
# make's MAKEFLAGS holds `--jobserver-auth=fifo:/tmp/GMfifo123`, a path to leave as it is (`inline_secrets` reads the
# options whose names say they take a secret). A quoted value is read up to 256 characters, more than a password: a quote
# never closed was read to the value's end from each of many.
_CONNECTION_SETTING = re.compile(
    r"""(?:\A|(?<=[;\s])|(?<=-D)|(?<=[/-]p:)|(?<=[/-]property:))([A-Za-z][\w.-]*+)[ \t]*+=[ \t]*+
    (?:"([^"]{0,256}+)"|'([^']{0,256}+)'|\{(?!\{)([^}]{0,256}+)\}|([^;\s]*+))""",
    re.VERBOSE,
)


def url_secrets(url: str | None) -> list[str]:
    """The secret parts of a URL: its user info's password, and the values of settings whose names say they are secrets
    (`password`, `key`, `api_key`) in its query or after a `;`; each as written and percent-decoded."""
    if not url:
        return []
    userinfos = _userinfos(url)
    # SQLAlchemy's password, and urllib's and httpx's where it holds an `@` (they read up to the authority's last).
    passwords = [form for one in userinfos if one.group(2) is not None for form in (one.group(2), one.group(2) + one.group(3))]
    # As written, and as a program that used it prints it (the Redactor adds the encoded forms of what is decoded).
    found = [form for password in passwords for form in (password, unquote(password))]
    without_userinfos = _replaced(url, userinfos, lambda userinfo: "")
    head, mark, query = without_userinfos.partition("?")  # a `?` in the password starts no query
    settings = [*_PARAMETER_SETTING.findall(head), *_QUERY_SETTING.findall(mark + query), *_fragment_settings(without_userinfos)]
    # A query is read as a form too: its `+` a space.
    values = [value for name, value in settings if _secret_setting(name)]
    forms = [*(form for value in values for form in (value, unquote(value), unquote_plus(value))), *found]
    return [form for form in dict.fromkeys(forms) if not _PLACEHOLDER.fullmatch(form)]


def _fragment_settings(text: str) -> list[tuple[str, str]]:
    """The settings (name, value) of the fragment of `text`, a URL without its user info: from its first `#` on."""
    before, mark, fragment = text.partition("#")
    return _FRAGMENT_SETTING.findall(mark + fragment) if mark else []


def _value_secrets(value: str) -> list[str]:
    """The secrets of a variable's value whose name does not say it holds one: its URLs' (`url_secrets`), a connection
    string's or an option's settings' (`_setting_secrets`), a command line's, a cookie header's and a .netrc's
    (`inline_secrets`), and Oracle's logins' passwords (`_ORACLE_LOGIN`)."""
    # JDBC's Oracle URL holds no `://` (`jdbc:oracle:thin:@//db:1521/svc?user=scott&password=...`).
    found = url_secrets(value) if "://" in value or "jdbc:" in value else []
    if "=" in value:
        found += _setting_secrets(value)
    found += inline_secrets(value)
    if "uthorization" in value:
        found += _AUTHORIZATION.findall(value)
    if "PRIVATE KEY" in value:
        found += [form for key in _PRIVATE_KEY.findall(value) for form in (key, key.replace("\\n", "\n"))]
    return [secret for secret in found + oracle_passwords(value) if not _PLACEHOLDER.fullmatch(secret)]


def _setting_secrets(value: str) -> list[str]:
    """The values of the settings (`_CONNECTION_SETTING`) of `value` and of the strings it quotes (`_QUOTED`: a container's
    `--env="SECRET_KEY_BASE=..."`, `-e 'A=1 API_TOKEN=...'`, a JSON list's) whose names say they are secrets."""
    quoted = [one.group(1) or one.group(2) or "" for one in _QUOTED.finditer(value)] if '"' in value or "'" in value else []
    return [secret for text in (value, *quoted) if "=" in text for secret in _named_setting_secrets(text)]


# A string in quotes, read up to 256 characters as `_CONNECTION_SETTING` reads a quoted value: one never closed is not read
# to the value's end from each of many quotes.
_QUOTED = re.compile(r""""([^"\r\n]{0,256}+)"|'([^'\r\n]{0,256}+)'""")


def _named_setting_secrets(text: str) -> list[str]:
    """The values of the settings of `text` whose names say they are secrets (`_CONNECTION_SETTING`)."""
    # ODBC's `PWD` only in a string of `;`-separated settings: `env PWD=/home/me/app make` names a folder.
    secret = _secret_setting if ";" in text else looks_secret
    named = ((setting.group(1), setting) for setting in _CONNECTION_SETTING.finditer(text))
    secret_settings = [setting for name, setting in named if secret(_setting_last_word(name)) or _secret_variable_setting(name)]
    return [next(part for part in setting.groups()[1:] if part is not None) for setting in secret_settings]


# A setting named as an environment variable is (`SECRET_KEY_BASE=...`, `X=1;API_TOKEN=...`), capitals in two words or
# more: `looks_secret` reads its name, as it reads the variable's, but for a last word that says where one is kept (a file,
# a folder, a variable), whose value is a path or a name: `SECRET_KEY_FILE=/run/secrets/key`. Not ODBC's `DSN=` or `PWD=`.
_VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9]*+(?:_[A-Z0-9]++)++")
_WHERE_KEPT_WORDS = frozenset({"FILE", "PATH", "DIR", "FOLDER", "LOCATION", "ENV", "NAME", "VAR", "ID"})


@functools.lru_cache(maxsize=4096)
def _secret_variable_setting(name: str) -> bool:
    """Whether a setting named as an environment variable (`_VARIABLE_NAME`) holds a secret: `looks_secret`'s reading."""
    return bool(_VARIABLE_NAME.fullmatch(name)) and looks_secret(name) and _last_word(name.split("_")) not in _WHERE_KEPT_WORDS


@functools.lru_cache(maxsize=4096)  # asked of every setting of every value and URL: the names repeat
def _secret_setting(name: str) -> bool:
    """Whether a setting's name (a URL query's, a connection string's) says its value is a secret: ODBC's `PWD` too, which
    as a variable's name is the shell's folder; and the words only a setting's name says it with (`_SECRET_SETTING_LAST_WORDS`,
    `_SECRET_ENDINGS`)."""
    words = _WORD_BREAK.split(name.upper())
    return (
        looks_secret(name) or name.upper() == "PWD" or _last_word(words) in _SECRET_SETTING_LAST_WORDS
        or any(word.endswith(_SECRET_ENDINGS) for word in words)
    )


@functools.lru_cache(maxsize=4096)  # the same few names (`Password`, `-Dfile.encoding`) in every value
def _setting_last_word(name: str) -> str:
    """The last word of a connection string's or an option's setting, split at `.`, `_`, `-` and camel case: what the value
    is. `keyStorePassword`'s and `AccountKey`'s value is a secret; `password.file`'s, `secretKeyRingFile`'s,
    `ssl.key.location`'s, `auth.login.config`'s and `gpg.passphrase.env`'s is where one is kept, a path or a variable's name
    that builds need and that, redacted, would read *** wherever the project's files and logs name it."""
    return _last_word([word.upper() for word in _SETTING_WORD_BREAK.split(name)]) or name


def oracle_passwords(text: str | None) -> list[str]:
    """The passwords of the Oracle logins in `text` (`_ORACLE_LOGIN`), as written."""
    if not text or "/" not in text:
        return []
    return [login.group(1) if login.group(1) is not None else login.group(2) for login in _ORACLE_LOGIN.finditer(text)]


def url_password(url: str) -> str | None:
    """The password of a URL's user info, as written; None when it has none."""
    userinfo = _userinfo(url)
    return userinfo.group(2) if userinfo is not None else None


def _userinfo(url: str) -> re.Match[str] | None:
    """The user info of `url` (its groups: the user, and the password or None), read as one URL's when the text is one."""
    return next(iter(_userinfos(url)), None)


def _userinfos(text: str) -> list[re.Match[str]]:
    """The user infos of `text`: that of a value that is one URL (`_ONE_URLS_USERINFO`), those of quoted strings that are one
    URL (`_one_urls_userinfo`), and every other one among other words (`_USERINFO`) after it: the further URLs of a list
    (`https://a/simple,https://u:token@b/simple`, Kombu's `;`). In order, none overlapping another: `_replaced` joins them."""
    one_url = _ONE_URLS_USERINFO.match(text)
    start = one_url.end() if one_url is not None else 0
    quoted = sorted((one for pattern in _QUOTED_URLS_USERINFOS for one in pattern.finditer(text, start)), key=re.Match.start)
    # A quoted string holds one URL: a `'` within a `"` string's (`"postgresql://u:it's@db"`) begins none.
    quoted = [one for index, one in enumerate(quoted) if index == 0 or one.start() >= quoted[index - 1].end()]
    unquoted: list[re.Match[str]] = []
    # A user info lies in a run without white space and ends at an `@`: each run is searched up to its last `@` only, and
    # one with no `//` before it not at all, so a run with many `//` and no `@` after them (a minified JSON of
    # `http://host:8080` URLs) is not read to its end from each `//`.
    for run in _RUN.finditer(text, start):
        last_at = text.rfind("@", run.start(), run.end())
        if last_at >= 0 and text.find("//", run.start(), last_at) >= 0:
            unquoted += _USERINFO.finditer(text, run.start(), last_at + 1)
    # One a quoted string's (read up to its last `@`, its password's spaces in it) holds is that string's, read once.
    starts = [one.start() for one in quoted]
    unquoted = [
        one for one in unquoted if (before := bisect.bisect_right(starts, one.start())) == 0 or one.start() >= quoted[before - 1].end()
    ]
    return ([one_url] if one_url is not None else []) + sorted([*quoted, *unquoted], key=re.Match.start)


def _replaced(text: str, userinfos: Iterable[re.Match[str]], replacement: Callable[[re.Match[str]], str]) -> str:
    """`text` with each of `userinfos` (in order) from its user on as `replacement` gives it: in one join, as a value
    with thousands of them was copied whole for each."""
    pieces: list[str] = []
    end = 0
    for userinfo in userinfos:
        pieces += [text[end : userinfo.start(1)], replacement(userinfo)]
        end = userinfo.end()
    return "".join([*pieces, text[end:]])


def shown_url(url: str) -> str:
    """`url` as logs and errors may show it: the password of its user info, settings whose names say they are secrets
    (in its query or after a `;`), and an Oracle login's password (`jdbc:oracle:thin:scott/tiger@//db/orcl`), as ***.
    Also for a string that is no valid URL (a typo in a config)."""
    # First: a `?` in the password starts no query.
    head, mark, query = _replaced(url, _userinfos(url), _hide_password).partition("?")
    shown = _PARAMETER_SETTING.sub(_hide_setting, head) + _QUERY_SETTING.sub(_hide_setting, mark + query)
    if "#" in shown:
        before, mark, fragment = shown.partition("#")
        shown = before + _FRAGMENT_SETTING.sub(_hide_setting, mark + fragment)
    # Read in what is shown, as `_value_secrets` reads the value: no `***` holds a `/` or an `@` to make or end a login.
    return _ORACLE_LOGIN.sub(_hide_oracle_password, shown) if "/" in shown else shown


def _hide_setting(setting: re.Match[str]) -> str:
    """The setting `setting` matched, its value as *** where its name says it is a secret."""
    return f"{setting.group(1)}={REDACTED}" if _secret_setting(setting.group(1)) else setting.group(0)


def _hide_password(userinfo: re.Match[str]) -> str:
    """The user info `userinfo` matched, its password (urllib's and httpx's reading: all its `@` parts) as ***."""
    user, password = userinfo.group(1, 2)
    return f"{user}:{REDACTED}@" if password is not None else f"{user}@"


def _hide_oracle_password(login: re.Match[str]) -> str:
    """The Oracle login `login` matched, its password (quoted or not) as ***."""
    group = 1 if login.group(1) is not None else 2
    start, end = login.start(group) - login.start(), login.end(group) - login.start()
    return login.group()[:start] + REDACTED + login.group()[end:]
