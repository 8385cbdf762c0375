"""The secrets a variable's value holds whose name does not say it holds one (`value_secrets`): its URLs', its
connection string's or options' settings', an Authorization header's, a PEM private key, a command line's, a cookie
header's and a .netrc's (`inline_secrets.py`), and its Oracle logins' passwords."""

from __future__ import annotations

import re

from orchestrator.inline_secrets import inline_secrets
from orchestrator.oracle_logins import oracle_passwords
from orchestrator.secret_names import looks_secret, secret_setting, secret_variable_setting, setting_last_word
from orchestrator.url_secrets import PLACEHOLDER, url_secrets

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


def value_secrets(value: str) -> list[str]:
    """The secrets of a variable's value whose name does not say it holds one: its URLs' (`url_secrets`), a connection
    string's or an option's settings' (`_setting_secrets`), a command line's, a cookie header's and a .netrc's
    (`inline_secrets`), and Oracle's logins' passwords (`oracle_passwords`)."""
    # JDBC's Oracle URL holds no `://` (`jdbc:oracle:thin:@//db:1521/svc?user=scott&password=...`).
    found = url_secrets(value) if "://" in value or "jdbc:" in value else []
    if "=" in value:
        found += _setting_secrets(value)
    found += inline_secrets(value)
    if "uthorization" in value:
        found += _AUTHORIZATION.findall(value)
    if "PRIVATE KEY" in value:
        found += [form for key in _PRIVATE_KEY.findall(value) for form in (key, key.replace("\\n", "\n"))]
    return [secret for secret in found + oracle_passwords(value) if not PLACEHOLDER.fullmatch(secret)]


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
    secret = secret_setting if ";" in text else looks_secret
    named = ((setting.group(1), setting) for setting in _CONNECTION_SETTING.finditer(text))
    secret_settings = [setting for name, setting in named if secret(setting_last_word(name)) or secret_variable_setting(name)]
    return [next(part for part in setting.groups()[1:] if part is not None) for setting in secret_settings]
