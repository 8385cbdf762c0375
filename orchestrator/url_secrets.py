"""The secrets of URLs: their user infos' passwords and the values of their settings whose names say they are secrets
(`url_secrets`, `url_password`), and a URL as logs may show it (`shown_url`). Also what stands for a secret in a template
no one filled in (`PLACEHOLDER`): no secret there, nor in any other value."""

from __future__ import annotations

import bisect
import re
from typing import Callable, Iterable
from urllib.parse import unquote, unquote_plus

from orchestrator.oracle_logins import oracle_passwords_hidden
from orchestrator.redactable import REDACTED
from orchestrator.secret_names import secret_setting

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
PLACEHOLDER = re.compile(r"\$\{[^{}]*\}|\$[A-Z_][A-Z0-9_]*|%[A-Za-z_]\w*%|<[^<>]*>|\{\{[^{}]*\}\}|\$\([^()]*\)|`[^`]*`")


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
    values = [value for name, value in settings if secret_setting(name)]
    forms = [*(form for value in values for form in (value, unquote(value), unquote_plus(value))), *found]
    return [form for form in dict.fromkeys(forms) if not PLACEHOLDER.fullmatch(form)]


def _fragment_settings(text: str) -> list[tuple[str, str]]:
    """The settings (name, value) of the fragment of `text`, a URL without its user info: from its first `#` on."""
    before, mark, fragment = text.partition("#")
    return _FRAGMENT_SETTING.findall(mark + fragment) if mark else []


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
    # Read in what is shown, as value_secrets.py reads the value: no `***` holds a `/` or an `@` to make or end a login.
    return oracle_passwords_hidden(shown)


def _hide_setting(setting: re.Match[str]) -> str:
    """The setting `setting` matched, its value as *** where its name says it is a secret."""
    return f"{setting.group(1)}={REDACTED}" if secret_setting(setting.group(1)) else setting.group(0)


def _hide_password(userinfo: re.Match[str]) -> str:
    """The user info `userinfo` matched, its password (urllib's and httpx's reading: all its `@` parts) as ***."""
    user, password = userinfo.group(1, 2)
    return f"{user}:{REDACTED}@" if password is not None else f"{user}@"
