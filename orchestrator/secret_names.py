"""Which names say their value is a secret: an environment variable's (`looks_secret`), and a setting's in a URL's query, a
connection string or an option (`secret_setting`, `secret_variable_setting`, read at `setting_last_word`)."""

from __future__ import annotations

import functools
import re

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


# A setting named as an environment variable is (`SECRET_KEY_BASE=...`, `X=1;API_TOKEN=...`), capitals in two words or
# more: `looks_secret` reads its name, as it reads the variable's, but for a last word that says where one is kept (a file,
# a folder, a variable), whose value is a path or a name: `SECRET_KEY_FILE=/run/secrets/key`. Not ODBC's `DSN=` or `PWD=`.
_VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9]*+(?:_[A-Z0-9]++)++")
_WHERE_KEPT_WORDS = frozenset({"FILE", "PATH", "DIR", "FOLDER", "LOCATION", "ENV", "NAME", "VAR", "ID"})


@functools.lru_cache(maxsize=4096)
def secret_variable_setting(name: str) -> bool:
    """Whether a setting named as an environment variable (`_VARIABLE_NAME`) holds a secret: `looks_secret`'s reading."""
    return bool(_VARIABLE_NAME.fullmatch(name)) and looks_secret(name) and _last_word(name.split("_")) not in _WHERE_KEPT_WORDS


@functools.lru_cache(maxsize=4096)  # asked of every setting of every value and URL: the names repeat
def secret_setting(name: str) -> bool:
    """Whether a setting's name (a URL query's, a connection string's) says its value is a secret: ODBC's `PWD` too, which
    as a variable's name is the shell's folder; and the words only a setting's name says it with (`_SECRET_SETTING_LAST_WORDS`,
    `_SECRET_ENDINGS`)."""
    words = _WORD_BREAK.split(name.upper())
    return (
        looks_secret(name) or name.upper() == "PWD" or _last_word(words) in _SECRET_SETTING_LAST_WORDS
        or any(word.endswith(_SECRET_ENDINGS) for word in words)
    )


@functools.lru_cache(maxsize=4096)  # the same few names (`Password`, `-Dfile.encoding`) in every value
def setting_last_word(name: str) -> str:
    """The last word of a connection string's or an option's setting, split at `.`, `_`, `-` and camel case: what the value
    is. `keyStorePassword`'s and `AccountKey`'s value is a secret; `password.file`'s, `secretKeyRingFile`'s,
    `ssl.key.location`'s, `auth.login.config`'s and `gpg.passphrase.env`'s is where one is kept, a path or a variable's name
    that builds need and that, redacted, would read *** wherever the project's files and logs name it."""
    return _last_word([word.upper() for word in _SETTING_WORD_BREAK.split(name)]) or name
