"""Secrets stay out of the agent's commands, the check, and what a night writes down (orchestrator/secrecy.py and the modules its docstring names)."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from traceback import format_exception
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus, unquote, unquote_plus, urlencode, urlsplit

import httpx
import pytest
import yarl
from sqlalchemy.engine import URL, make_url

from orchestrator.inline_secrets import inline_secrets
from orchestrator.records import ToolCall
from orchestrator.redactable import REDACTED
from orchestrator.redactor import Redactor
from orchestrator.scripted import call
from orchestrator.secrecy import withheld
from orchestrator.secret_names import looks_secret
from orchestrator.tools import Toolbox
from orchestrator.url_secrets import shown_url, url_secrets
from runs.engine import safe_url
from tests.conftest import git
from tests.test_night import notes_text, overnight, report_json

OPENAI_KEY = "sk-test-0123456789abcdef"
CI_TOKEN = "ghp_ci0123456789token"
DB_PASSWORD = "db-pass-0123456789"


@pytest.fixture
def secrets_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What overnight's environment holds on a CI runner or a developer's machine."""
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GITHUB_TOKEN", CI_TOKEN)
    monkeypatch.setenv("PGPASSWORD", DB_PASSWORD)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a word inside a name is no secret


def test_names_that_say_secret() -> None:
    secret = ["OPENAI_API_KEY", "GITHUB_TOKEN", "CI_JOB_TOKEN", "PGPASSWORD", "MYSQL_PWD", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "SSH_AUTH_SOCK", "GOOGLE_APPLICATION_CREDENTIALS", "GH_PAT", "HF_TOKEN", "password", "api-key"]
    plain = ["PATH", "HOME", "PWD", "OLDPWD", "LD_LIBRARY_PATH", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME", "DBUS_SESSION_BUS_ADDRESS",
             "PYTHONPATH", "sslmode", "sslkey", "LANG", "JWT_ALGORITHM", "PASS_RATE", "DSN_TIMEOUT"]
    secret += ["DB_PASS", "CI_JOB_JWT", "SENTRY_DSN", "NGROK_AUTHTOKEN"]
    assert [name for name in secret if not looks_secret(name)] == []
    assert [name for name in plain if looks_secret(name)] == []


def test_urls_are_shown_without_their_passwords() -> None:
    assert shown_url("postgresql+psycopg://u:s3cret@db:5432/o?password=s3cret2&sslmode=require") == (
        "postgresql+psycopg://u:***@db:5432/o?password=***&sslmode=require"
    )
    assert shown_url("postgresql//u:s3cret@db/o") == "postgresql//u:***@db/o"  # no valid URL: a typo in the config
    assert shown_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1"
    assert sorted(url_secrets("http://me:APIBASESECRET@h:1/v1?key=QUERYSECRET&lang=en")) == ["APIBASESECRET", "QUERYSECRET"]
    assert "s3cret" not in safe_url("postgresql+psycopg://u@db/o?password=s3cret")
    assert "s3cret" not in safe_url("postgresql//u:s3cret@db/o")


def test_redaction_replaces_known_values_longest_first_and_leaves_short_ones() -> None:
    redact = Redactor(["abcdefgh12", "abcdefgh12345", "short"])
    assert redact("x abcdefgh12345 y abcdefgh12 short") == "x *** y *** short"
    # A PEM key written with CRLF, printed with LF or only in part (`head -2`): every line of it.
    key = "-----BEGIN KEY-----\r\nMIIEabcdefghijklmn0123\r\nQWERTYuiop98765432\r\n-----END KEY-----"
    assert "MIIE" not in Redactor([key])("head: -----BEGIN KEY-----\nMIIEabcdefghijklmn0123\n")


def test_the_agents_commands_run_without_secret_variables(tmp_path: Path, secrets_in_environment: None) -> None:
    """`env` shows none of them; a task's pass_env lets one through; its value is still redacted in what the tool returns."""
    (tmp_path / "config.toml").write_text(f'api_key = "{OPENAI_KEY}"\n')  # a file the agent may read
    toolbox = Toolbox(tmp_path, ("run_command", "run_check"), check_command="env", redact=Redactor.for_night())
    shown = toolbox.execute(ToolCall("run_command", {"command": "env; cat config.toml"})).output
    assert OPENAI_KEY not in shown and CI_TOKEN not in shown and DB_PASSWORD not in shown
    assert "GITHUB_TOKEN" not in shown and "PGPASSWORD" not in shown and "TOKENIZERS_PARALLELISM=false" in shown
    assert 'api_key = "***"' in shown
    checked = toolbox.execute(ToolCall("run_check", {})).output
    assert "GITHUB_TOKEN" not in checked and "TOKENIZERS_PARALLELISM" in checked

    # pass_env: the check gets it (its value redacted in what the tool returns); the agent's own commands never do.
    passing = Toolbox(tmp_path, ("run_command", "run_check"), check_command="env", pass_env=("GITHUB_TOKEN",), redact=Redactor.for_night())
    assert "GITHUB_TOKEN=***\n" in passing.execute(ToolCall("run_check", {})).output
    assert "GITHUB_TOKEN" not in passing.execute(ToolCall("run_command", {"command": "env"})).output


def test_a_night_writes_no_secret_down(config_file, server, repo: Path, tmp_path: Path, secrets_in_environment: None) -> None:
    """An agent that runs `env` into a file and a check that prints the environment: the transcript, the run store,
    notes.md and the committed file hold none of the secrets; the check with pass_env sees its token."""
    check = f'env; [ ${{#GITHUB_TOKEN}} = {len(CI_TOKEN)} ] && [ -z "$OPENAI_API_KEY" ] && python check_greet.py'
    config = config_file(tasks=[
        {"name": "fix-greet", "prompt": "fix greet", "check": check, "pass_env": ["GITHUB_TOKEN"],
         "tools": ["run_command", "edit_file", "submit"]},
    ], night={"max_iterations": 2, "max_turns": 8})
    server.enqueue(
        call("run_command", {"command": "env > environment.txt; printenv PGPASSWORD"}),
        call("submit", {"summary": "first try"}),  # the check fails: its output becomes the note's evidence
        call("run_command", {"command": "env > environment.txt"}),
        call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
        call("submit", {"summary": "fixed"}),
    )
    assert overnight("run", "--config", str(config)) == 0
    state = tmp_path / "state"
    written = [notes_text(config), git(repo, "show", "overnight/fix-greet:environment.txt")]
    written += [path.read_text() for path in (state / "transcripts").iterdir()]
    with sqlite3.connect(state / "runs.db") as db:
        written += [json.dumps(row) for row in db.execute("select * from events")]
    for text in written:
        assert OPENAI_KEY not in text and CI_TOKEN not in text and DB_PASSWORD not in text
    assert "GITHUB_TOKEN" not in written[1] and "OPENAI_API_KEY" not in written[1]


def test_state_dir_and_the_kept_git_config_are_the_owners_alone(config_file, server, repo: Path, tmp_path: Path) -> None:
    """Transcripts and the run store hold what commands printed; a .git/config only its owner may read
    (it holds a remote's token) stays so after the agent changed it and overnight put it back."""
    config_path = repo / ".git" / "config"
    config_path.chmod(0o600)
    config = config_file(tasks=[{"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "edit_file", "submit"]}])
    server.enqueue(
        call("run_command", {"command": "git config --local agent.was here"}),
        call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
        call("submit", {"summary": "fixed"}),
    )
    old_umask = os.umask(0o022)
    try:
        assert overnight("run", "--config", str(config)) == 0
    finally:
        os.umask(old_umask)
    assert "agent.was" not in config_path.read_text()  # put back
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700


def test_errors_show_no_password(tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store URL with its password in the query, or mistyped; a model endpoint with credentials in it."""
    for url in ("postgresql+psycopg://u@127.0.0.1:1/db?password=s3cretA", "postgresql//u:s3cretB@127.0.0.1/db"):
        config = tmp_path / "overnight.toml"
        config.write_text(
            f'[model]\nname = "openai/x"\napi_base = "http://127.0.0.1:9/v1"\n[repo]\npath = "{repo}"\n'
            f'[store]\nurl = "{url}"\n[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n'
        )
        for command in ("run", "report"):
            capsys.readouterr()
            assert overnight(command, "--config", str(config)) != 0
            said = capsys.readouterr()
            assert "s3cret" not in said.out + said.err, said


def test_an_unreachable_endpoint_is_named_without_its_credentials(config_file, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_file(model={"api_base": "http://me:APIBASESECRET@127.0.0.1:9/v1?key=QUERYSECRET", "retries": 0})
    capsys.readouterr()
    assert overnight("run", "--config", str(config)) == 3
    said = capsys.readouterr()
    assert "SECRET" not in said.out + said.err and "127.0.0.1:9" in said.out + said.err


def test_a_plain_word_password_does_not_mangle_the_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSTGRES_PASSWORD", "postgres")
    monkeypatch.setenv("PASSWORD", "password")
    (tmp_path / "db.py").write_text('def check_password(): return connect(user="postgres")\n')
    shown = Toolbox(tmp_path, ("read_file",), check_command="true", redact=Redactor.for_night()).execute(
        ToolCall("read_file", {"path": "db.py"})).output
    assert 'check_password(): return connect(user="postgres")' in shown


def test_the_file_tools_output_is_redacted_too(tmp_path: Path) -> None:
    """A known secret in a file of the worktree (a committed .env) is replaced in what read_file and search
    return, as in a command's output: the transcript, the store and notes.md keep every tool output."""
    (tmp_path / ".env").write_text(f"OPENAI_API_KEY={OPENAI_KEY}\n")
    toolbox = Toolbox(tmp_path, ("read_file", "search"), check_command="true", redact=Redactor([OPENAI_KEY]))
    read = toolbox.execute(ToolCall("read_file", {"path": ".env"}))
    found = toolbox.execute(ToolCall("search", {"pattern": "OPENAI", "path": "."}))
    assert read.ok and read.output == "OPENAI_API_KEY=***\n"
    assert found.ok and found.output == ".env:1: OPENAI_API_KEY=***"


def test_url_passwords_in_any_variable_are_withheld_and_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://app:hunter2hunter2@db/app")
    monkeypatch.setenv("CI_REPOSITORY_URL", "https://gitlab-ci-token:glcbt-JOBTOKEN-123@gitlab.example.com/g/p.git")
    monkeypatch.setenv("DB_PASS", "dbpass-XYZ12345")
    assert {"DATABASE_URL", "CI_REPOSITORY_URL", "DB_PASS"} <= set(withheld(os.environ))
    toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", redact=Redactor.for_night())
    out = toolbox.execute(ToolCall("run_command", {"command": "env > env.txt; echo postgres://app:hunter2hunter2@db"})).output
    assert "hunter2" not in out and "hunter2" not in (tmp_path / "env.txt").read_text()
    assert "JOBTOKEN" not in (tmp_path / "env.txt").read_text()


def test_a_secret_the_output_cap_cuts_leaves_no_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-LEAKY-0123456789abcdefghij"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", redact=Redactor.for_night(), max_output_chars=2000)
    for pad in range(600, 700, 3):
        out = toolbox.execute(ToolCall("run_command", {"command": f"python3 -c \"print('a'*{pad}+'{secret}'+'b'*5000)\""})).output
        assert secret[:12] not in out and secret[-12:] not in out, pad


def test_a_url_whose_password_would_not_be_redacted_is_not_withheld() -> None:
    """A CI service database's URL: its password is a plain word the Redactor leaves; withheld, the check fails."""
    from orchestrator.secrecy import withheld

    env = {"DATABASE_URL": "postgres://postgres:postgres@localhost:5432/test", "REDIS_URL": "redis://:dev@localhost",
           "PROD_URL": "postgres://app:Xk3-9fq!Lm2@db/app"}
    assert withheld(env) == ["PROD_URL"]


class TestAReviewsFindings:
    def test_a_secret_word_before_a_version_or_number_still_says_so(self) -> None:
        """GitLab's CI_JOB_JWT_V1/_V2 were secret-named before the last-word rule; DB_PASS_2 too."""
        from orchestrator.secret_names import looks_secret

        assert all(looks_secret(name) for name in ("CI_JOB_JWT_V2", "CI_JOB_JWT_V1", "DB_PASS_2", "SENTRY_DSN"))
        assert not any(looks_secret(name) for name in ("PASS_RATE", "JWT_ALGORITHM", "DSN_TIMEOUT", "PASS_V2_RATE"))

    def test_lines_of_a_multi_line_secret_that_code_has_too_are_not_replaced_there(self) -> None:
        from orchestrator.redactor import Redactor

        pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n"
        key_file = '{\n  "type": "service_account",\n  "private_key_id": "0123456789abcdef0123"\n}'
        redact = Redactor([pem, key_file])
        code = 'if text.startswith("-----BEGIN PRIVATE KEY-----"):\n    kind = {"type": "service_account",}'
        assert redact(code) == code
        assert redact("MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7") == "***" and "***" in redact(pem.replace("\n", "\r\n"))


def test_a_secret_that_json_escapes_is_redacted_in_json_text_too() -> None:
    """A value holding `"`, `\\`, a control character or a non-ASCII letter is replaced in JSON text that holds it
    (a call's arguments as the model or overnight wrote them), escaped with or without ensure_ascii, as in plain text."""
    value = 's3cr3t"qu0te\\back\x01-\u00e9-123'
    redact = Redactor([value])
    assert redact(f"echo {value}") == "echo ***"
    for ensure_ascii in (True, False):
        assert redact(json.dumps({"content": value}, ensure_ascii=ensure_ascii)) == '{"content": "***"}'


class TestEscapedFormsOfASecret:
    """A secret value as other JSON encoders than Python's, and Python's repr(), write it is replaced too."""

    BASE64 = "Zm9v/YmFy+cXV4PQ=="  # a generated password or token: `/` and `+`
    MIXED = "s3cr3t\"qu0te-\u00e9-<&>-'x"
    CONTROL = "pw-\u00e9\x1f-0123"

    @pytest.mark.parametrize(("value", "written"), [
        (BASE64, r'"Zm9v\/YmFy+cXV4PQ=="'),  # PHP's json_encode: `\/`
        (BASE64, r'"Zm9v/YmFy\u002BcXV4PQ=="'),  # .NET's System.Text.Json: HTML-sensitive characters as \u, upper-case hex
        (MIXED, r'"s3cr3t\u0022qu0te-\u00E9-\u003C\u0026\u003E-\u0027x"'),  # .NET's
        (MIXED, '"s3cr3t\\"qu0te-\u00e9-\\u003c\\u0026\\u003e-\'x"'),  # Go's encoding/json: <, > and & as \u
        (MIXED, '"s3cr3t\\"qu0te-\\u00E9-<&>-\'x"'),  # Java's Jackson escaping non-ASCII: upper-case hex
        (CONTROL, '"pw-\u00e9\\u001F-0123"'),  # Jackson's default: control characters in upper-case hex
        (CONTROL, r'"pw-\u00E9\u001F-0123"'),
    ])
    def test_a_value_as_another_json_encoder_writes_it(self, value: str, written: str) -> None:
        """JSON text holding the value as PHP, Go, .NET or Jackson escape it is left holding `***` where the string was."""
        assert json.loads(written) == value  # the text is the value, as that encoder writes it
        assert Redactor([value])(f'{{"key": {written}}}') == '{"key": "***"}'

    def test_a_value_in_a_tracebacks_repr(self) -> None:
        """A value holding a backslash, a line end or a quote, which repr() escapes, is replaced in a traceback that quotes it
        with !r (an exception's message), and in the repr of a str holding both quotes."""
        value = "C:\\keys\\s3cr3t\n'0123'"
        redact = Redactor([value])
        try:
            raise ValueError(f"no key at {value!r}")
        except ValueError as error:
            shown = redact("".join(format_exception(error)))
        assert "s3cr3t" not in shown and "ValueError: no key at \"***\"" in shown, shown
        assert redact(repr(f'"{value}')) == "'\"***'"

    def test_forms_that_hold_one_another_leave_no_escape_behind(self) -> None:
        """A value ending in a backslash, whose plain form starts its escaped ones: each text is left valid, the value as ***,
        and *** stays *** escaped again."""
        value = "s3cret/0123\\"
        redact = Redactor([value])
        for text in (json.dumps({"key": value}), json.dumps({"key": value}).replace("/", "\\/"), repr(value), repr(f'"{value}\'')):
            assert "s3cret" not in redact(text), text
        assert json.loads(redact(json.dumps({"key": value}))) == {"key": "***"}
        assert json.loads(redact(json.dumps({"key": value}).replace("/", "\\/"))) == {"key": "***"}
        assert redact(repr(value)) == "'***'" and json.dumps(REDACTED) == '"***"' and repr(REDACTED) == "'***'"

    def test_an_ordinary_value_has_no_other_form(self) -> None:
        """Letters, digits and `-_.`: the value is all a Redactor looks for, so it costs nothing more."""
        ordinary = ["sk-test-0123456789abcdef", "ghp_ci0123456789token", "db-pass.0123456789"]
        assert sorted(Redactor(ordinary).values) == sorted(ordinary)


class TestUrlAndBytesFormsOfASecret:
    """A secret value as a URL writer percent-encodes it, as bytes' repr() and as ascii() write it is replaced too."""

    BASE64 = "Zm9v/YmFy+cXV4PQ=="  # a generated key: `/`, `+`, `=`
    SPACED = "correct horse/battery+staple=9"
    ACCENTED = "pässwört-0123"
    NON_ASCII = "clé-\u20ac-\U0001f511-0123"  # \xNN, \uNNNN and \UNNNNNNNN in ascii()

    @pytest.mark.parametrize("value", [BASE64, SPACED, ACCENTED])
    @pytest.mark.parametrize("encode", [
        lambda value: quote(value, safe=""),  # a query value, a URL's password: Go's QueryEscape, encodeURIComponent, curl
        quote,  # Python's default keeps `/`: a path
        quote_plus,  # a form, urlencode(): space as `+`
        lambda value: urlencode({"api_key": value}),  # requests' params, an HTTP library's debug line
        lambda value: URL.create("postgresql", username="app", password=value, host="db").render_as_string(hide_password=False),
    ], ids=["quote-safe-none", "quote", "quote_plus", "urlencode", "sqlalchemy-url"])
    def test_a_value_percent_encoded_by_a_url_writer(self, value: str, encode) -> None:
        """A value holding reserved or non-ASCII characters, written into a URL by Python's or SQLAlchemy's encoder, reads ***."""
        written = encode(value)
        assert value not in written  # the encoder did respell it
        shown = Redactor([value])(f"GET https://api.example/v1?{written} 200")
        assert "***" in shown and value[:6] not in unquote_plus(shown), shown

    @pytest.mark.parametrize(("value", "written", "decode"), [
        (BASE64, "Zm9v%2fYmFy%2bcXV4PQ%3d%3d", unquote_plus),  # .NET's HttpUtility.UrlEncode: lower-case hex
        (SPACED, "correct+horse%2fbattery%2bstaple%3d9", unquote_plus),  # the same, space as `+`
        (ACCENTED, "p%c3%a4ssw%c3%b6rt-0123", unquote_plus),
        (BASE64, "Zm9v%2FYmFy+cXV4PQ==", unquote),  # Go's url.UserPassword: a user info's `+` and `=` kept
        ("it's(a)*secret!/0123", "it's(a)*secret!%2F0123", unquote),  # JavaScript's encodeURIComponent: `!'()*` kept
    ])
    def test_a_value_as_another_url_writer_writes_it(self, value: str, written: str, decode) -> None:
        """A value percent-encoded in lower-case hex (.NET's HttpUtility) or with some reserved characters kept (Go's user info,
        JavaScript's encodeURIComponent) reads ***."""
        assert decode(written) == value  # the text is the value, as that writer writes it
        assert Redactor([value])(f"postgres://app:{written}@db/app") == "postgres://app:***@db/app"

    PUNCTUATED = "Zx9!$&'()*+,;=/?:@ ~q%-0123"  # a generated password: URL delimiters, a space, `~` and `%`

    @pytest.mark.parametrize("encode", [
        lambda value: str(httpx.URL("https://db.example/").copy_with(username="app", password=value)),  # WHATWG's user info: Node's URL too
        lambda value: str(yarl.URL.build(scheme="https", user="app", password=value, host="db.example")),  # aiohttp's
        lambda value: str(yarl.URL("https://api.example/v1").with_query({"api_key": value})),  # aiohttp's params: space as `+`
    ], ids=["httpx-password", "yarl-user-info", "yarl-query"])
    def test_a_value_percent_encoded_by_an_http_client(self, encode) -> None:
        """A password holding URL delimiters, a space, `~` and `%`, written into a URL by httpx or by aiohttp's yarl, reads ***."""
        written = encode(self.PUNCTUATED)
        assert self.PUNCTUATED not in written  # the encoder did respell it
        shown = Redactor([self.PUNCTUATED])(written)
        assert "***" in shown and "0123" not in shown, shown

    @pytest.mark.parametrize("written", [
        "Zx9!%24%26%27()*%2b%2c%3b%3d%2f%3f%3a%40+%7eq%25-0123",  # .NET's HttpUtility.UrlEncode: `!()*` kept, `~` encoded, lower-case hex
        "Zx9!%24%26%27()*%2B%2C%3B%3D%2F%3F%3A%40+%7Eq%25-0123",  # .NET's WebUtility.UrlEncode: the same in upper-case hex
        "Zx9%21%24%26%27%28%29*%2B%2C%3B%3D%2F%3F%3A%40+%7Eq%25-0123",  # Java's URLEncoder, JavaScript's URLSearchParams: `*` kept
        "Zx9%21%24%26%27%28%29%2A%2B%2C%3B%3D%2F%3F%3A%40+%7Eq%25-0123",  # PHP's urlencode: `~` encoded too
    ], ids=["dotnet-httputility", "dotnet-webutility", "java-urlsearchparams", "php"])
    def test_a_value_as_a_form_encoder_that_encodes_tilde_writes_it(self, written: str) -> None:
        """A value holding `~` and `*`, `!`, `(`, `)`, as the form encoders that write `~` as %7E and keep some of the others
        write it, reads ***."""
        assert unquote_plus(written) == self.PUNCTUATED  # the text is the value, as that writer writes it
        assert Redactor([self.PUNCTUATED])(f"POST api_key={written}&x=1") == "POST api_key=***&x=1"

    def test_a_url_password_is_redacted_decoded_and_encoded(self) -> None:
        """A store URL's password written encoded is replaced as a program prints it decoded, and one written raw as it is
        printed encoded; a query's secret setting likewise."""
        encoded = quote(self.BASE64, safe="")
        for password in (encoded, self.BASE64):
            redact = Redactor.for_night(store_url=f"postgresql://app:{password}@db/app")
            for shown in (self.BASE64, encoded, quote(self.BASE64)):
                assert redact(f"connecting with {shown}.") == "connecting with ***.", (password, shown)
        redact = Redactor.for_night(api_base=f"https://api.example/v1?api_key={encoded}")
        assert redact(f"key={self.BASE64};") == "key=***;"
        api_base = f"https://api.example/v1?api_key={self.BASE64}"  # left unencoded: a server reads its `+` as a space
        [as_read] = parse_qs(urlsplit(api_base).query)["api_key"]
        assert Redactor.for_night(api_base=api_base)(f"key={as_read};") == "key=***;"

    def test_a_value_in_bytes_repr_and_ascii(self) -> None:
        """A value holding non-ASCII letters, as repr() of its UTF-8 bytes and as ascii() write it (a traceback's {value!a},
        a log of the bytes), reads ***; with a quote, in both of repr's quotings."""
        value = f"{self.NON_ASCII}'s"
        redact = Redactor([value])
        for written in (repr(value.encode()), ascii(value), repr(f'"{value}'.encode()), ascii(f'"{value}'), repr(os.fsencode(value))):
            assert written.count("0123") == 1 and "0123" not in redact(written), written
        try:
            raise ValueError(f"no key {value!a} in {value.encode()!r}")
        except ValueError as error:
            assert "no key \"***\" in b\"***\"" in redact("".join(format_exception(error)))

    def test_a_value_of_undecodable_bytes_as_a_url_and_bytes_repr_write_them(self) -> None:
        """A variable's value that is not UTF-8 (os.fsdecode's surrogate escapes) is replaced as its bytes are percent-encoded
        and repr()'d."""
        raw = b"pw-\xe9\xff-0123456"
        redact = Redactor([os.fsdecode(raw)])
        for written in (quote(raw, safe=""), repr(raw)):
            assert "0123" not in redact(written), written

    @pytest.mark.parametrize(("value", "written"), [
        ("pw\x7f-\u00e9-0123456", '"pw\x7f-\\u00E9-0123456"'),  # Jackson's ESCAPE_NON_ASCII: DEL (127) as it is, non-ASCII escaped
        ("pw\b-\f<0123456", r'"pw\u0008-\u000c\u003c0123456"'),  # Go before 1.22: `\b`, `\f` as \u escapes
        ("Zm9vYmFy0123+/A=", r'"Zm9vYmFy0123+/A\u003d"'),  # Gson's default (HTML-safe): a padded base64 key's `=` as \u003d
        ("it's-<0123456>&\u00e9", '"it\\u0027s-\\u003c0123456\\u003e\\u0026\u00e9"'),  # Gson: `'` too, non-ASCII as it is
    ])
    def test_a_value_as_jackson_and_older_go_write_it(self, value: str, written: str) -> None:
        """JSON text holding the value as Jackson escaping non-ASCII, Go before 1.22, or Gson write it reads *** where the string was."""
        assert json.loads(written) == value
        assert Redactor([value])(f'{{"key": {written}}}') == '{"key": "***"}'

    def test_an_ascii_value_gets_its_url_forms_and_no_bytes_ones(self) -> None:
        """Letters, digits and `-_.` are the value's one form; an ASCII value with `/` gets its JSON and percent-encoded forms,
        none of bytes' repr or ascii()'s `\\x` escapes."""
        assert Redactor(["sk-test-0123456789abcdef"]).values == ("sk-test-0123456789abcdef",)
        forms = set(Redactor(["abc/def0123456"]).values)
        assert forms >= {"abc/def0123456", "abc%2Fdef0123456", "abc%2fdef0123456", "abc\\/def0123456"}
        assert not any(form.startswith("b'") or "\\x" in form for form in forms)


def test_a_pretty_printed_json_keys_private_key_line_is_redacted() -> None:
    """Review 4: lines with spaces were no longer pieces, so `grep private_key` of a JSON key printed the key."""
    import json

    key = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
    value = json.dumps({"type": "service_account", "private_key": f"-----BEGIN PRIVATE KEY-----\n{key}\n-----END PRIVATE KEY-----\n"}, indent=2)
    redact = Redactor([value])
    line = next(line for line in value.splitlines() if "private_key" in line)
    assert key not in redact(line)
    assert redact('"type": "service_account",') == '"type": "service_account",'


def written_down(config: Path, said: str) -> list[str]:
    """What a night left to read: `said` (its output), notes.md and every row of the run store."""
    state = config.parent / "state"
    written = [said, notes_text(config)]
    with sqlite3.connect(state / "runs.db") as db:
        for (table,) in db.execute("select name from sqlite_master where type = 'table'"):
            written += [json.dumps(row) for row in db.execute(f"select * from {table}")]  # noqa: S608 - the store's own tables
    return written


class TestModelErrorsKeepSecretsOut:
    API_KEY = "sk-configkey-0123456789zz"
    BASE_PASSWORD = "basepw-0123456789UIO"

    def _config(self, config_file, server) -> Path:
        host = server.url.split("//", 1)[1]
        return config_file(model={"api_key": self.API_KEY, "api_base": f"http://me:{self.BASE_PASSWORD}@{host}", "retries": 0})

    def _written(self, config: Path, said: str) -> list[str]:
        return written_down(config, said)

    def _night_answered_with(self, config_file, server, capsys, *, status: int, text: str, exit_code: int) -> tuple[Path, pytest.CaptureResult[str]]:
        """A night (JSON logs) whose model server answers its first request with `status` and `text`: (config, what it printed)."""
        from orchestrator.scripted import Reply

        config = self._config(config_file, server)
        server.enqueue(Reply(status=status, text=text))
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", "json") == exit_code
        return config, capsys.readouterr()

    def test_a_rejected_request_whose_error_quotes_the_key_leaves_it_out_of_notes_logs_store_and_prompt(
        self, config_file, server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A server's 400 quoting the API key and api_base's password (an iteration_error): notes.md, the next prompt, the logs and the store show ***."""
        text = f"bad request: key {self.API_KEY} for http://me:{self.BASE_PASSWORD}@host/v1"
        config, said = self._night_answered_with(config_file, server, capsys, status=400, text=text, exit_code=1)
        written = self._written(config, said.out + said.err) + [json.dumps(server.requests)]
        assert "bad request: key ***" in notes_text(config)
        assert [text for text in written if self.API_KEY in text or self.BASE_PASSWORD in text] == []

    def test_an_unreachable_endpoint_whose_error_quotes_the_key_leaves_it_out_of_the_exit_line(
        self, config_file, server, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A 401 quoting the API key (ModelUnreachable, exit 3): the error line, the logs and the store show ***."""
        text = f"Incorrect API key provided: {self.API_KEY}"
        config, said = self._night_answered_with(config_file, server, capsys, status=401, text=text, exit_code=3)
        assert "Incorrect API key provided: ***" in said.err
        assert [text for text in self._written(config, said.out + said.err) if self.API_KEY in text] == []


class TestNightErrorsKeepSecretsOut:
    TOKEN = "deploy-tok-0123456789abc"

    @pytest.mark.parametrize("log_format", ["json", "human"])
    def test_an_error_quoting_a_secret_shows_stars_in_notes_logs_and_store(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, log_format: str
    ) -> None:
        """An iteration_error whose text quotes a secret (a git filter's message at the commit) reaches notes.md and the log as ***."""
        monkeypatch.setenv("DEPLOY_TOKEN", self.TOKEN)
        # It fails once, at the commit's `git add`, and passes files through after: the rollback then works.
        failed_once = repo.parent / "filter-failed-once"
        git(repo, "config", "filter.leak.clean", f"test -e {failed_once} && cat || {{ touch {failed_once}; echo 'refused with {self.TOKEN}' >&2; exit 3; }}")
        git(repo, "config", "filter.leak.smudge", "cat")
        git(repo, "config", "filter.leak.required", "true")
        config = config_file(
            tasks=[{"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}],
            night={"max_iterations": 1},
        )
        command = "echo '*.py filter=leak' > .gitattributes && sed -i s/helo/hello/ greet.py"
        server.enqueue(call("run_command", {"command": command}), call("submit", {"summary": "fixed"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", log_format) == 1
        said = capsys.readouterr()
        assert "iteration_error" in said.err and "refused with ***" in said.err
        assert "refused with ***" in notes_text(config)
        assert [text for text in written_down(config, said.out + said.err) if self.TOKEN in text] == []


    @pytest.mark.parametrize("log_format", ["json", "human"])
    def test_the_error_line_of_a_night_that_fails_on_it_shows_stars(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, log_format: str
    ) -> None:
        """A checkout filter that quotes a secret and fails: the night ends on the task's worktree (exit 2), its error line shows ***."""
        monkeypatch.setenv("DEPLOY_TOKEN", self.TOKEN)
        git(repo, "config", "filter.leak.clean", "cat")
        git(repo, "config", "filter.leak.smudge", f"echo 'refused with {self.TOKEN}' >&2; exit 3")
        git(repo, "config", "filter.leak.required", "true")
        (repo / ".gitattributes").write_text("*.py filter=leak\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-qm", "a filter")
        config = config_file(night={"max_iterations": 1})
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", log_format) == 2
        said = capsys.readouterr()
        last = said.err.strip().splitlines()[-1]
        assert "fix-greet" in last and "refused with ***" in last
        assert [text for text in written_down(config, said.out + said.err) if self.TOKEN in text] == []


    def test_a_bugs_traceback_shows_stars(self, config_file, server, tmp_path: Path) -> None:
        """A bug that ends `overnight run` (a user's guard raising what no handler takes) prints its traceback, exit 1, its secret values as ***."""
        (tmp_path / "bug_guard.py").write_text(
            "import os\n"
            "class GuardBug(BaseException):\n"
            "    pass\n"
            "class Buggy:\n"
            "    def after_tool_call(self, ctx, call, result):\n"
            "        raise GuardBug('push to https://ci:' + os.environ['DEPLOY_TOKEN'] + '@git.example.com failed')\n"
        )
        config = config_file(guards={"custom": ["bug_guard:Buggy"]}, night={"max_iterations": 1})
        server.enqueue(call("list_dir", {"path": "."}))
        done = self._run(config, tmp_path)
        assert done.returncode == 1, done.stderr
        # After the night's log lines: the traceback a bug report needs, from the command down to the failing frame.
        traceback = done.stderr[done.stderr.find("Traceback (most recent call last):"):]
        assert traceback.startswith("Traceback") and "in run_night" in traceback and "in after_tool_call" in traceback, done.stderr
        assert traceback.rstrip().endswith("bug_guard.GuardBug: push to https://ci:***@git.example.com failed"), done.stderr
        assert self.TOKEN not in done.stderr + done.stdout

    def test_the_error_line_of_a_guard_that_cannot_be_imported_shows_stars(self, config_file, server, tmp_path: Path) -> None:
        """A user's guard whose import fails quoting a secret: exit 2 before the state dir is made, its error line shows ***."""
        (tmp_path / "unimportable_guard.py").write_text("import os\nraise RuntimeError('no licence for ' + os.environ['DEPLOY_TOKEN'])\n")
        config = config_file(guards={"custom": ["unimportable_guard:Guard"]})
        done = self._run(config, tmp_path)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("overnight: error: [guards] custom:") and line.endswith("(RuntimeError: no licence for ***)"), line
        assert self.TOKEN not in done.stderr + done.stdout

    def _run(self, config: Path, guards_folder: Path) -> subprocess.CompletedProcess[str]:
        """`overnight run` as cron starts it, with DEPLOY_TOKEN set and the user's guards importable from `guards_folder`."""
        python_path = os.pathsep.join(filter(None, [str(guards_folder), os.environ.get("PYTHONPATH")]))
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            env={**os.environ, "DEPLOY_TOKEN": self.TOKEN, "PYTHONPATH": python_path},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )


# Passwords SQLAlchemy reads whole, up to their `@`, that a URL should have percent-encoded: generated ones hold `/`
# (base64) or `?`, a pass phrase holds spaces. Each is checked absent by its first ten characters.
SQLALCHEMY_PASSWORDS = pytest.mark.parametrize(
    "password", ["Xk3-9fqLm2/w0rd?Secret", "correct horse Battery9 staple"], ids=["unencoded-marks", "spaces"]
)


class TestPasswordsAsSQLAlchemyReadsThem:
    @SQLALCHEMY_PASSWORDS
    def test_a_url_variable_with_such_a_password_is_withheld_and_redacted(self, password: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """DATABASE_URL with `/` and `?` or spaces in its password: the agent's commands run without it, and a file that holds it reads ***."""
        monkeypatch.setenv("DATABASE_URL", f"postgres://app:{password}@db/app")
        (tmp_path / "settings.py").write_text(f'DATABASE = "postgres://app:{password}@db/app"\n')
        assert "DATABASE_URL" in withheld(os.environ)
        toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", redact=Redactor.for_night())
        out = toolbox.execute(ToolCall("run_command", {"command": "env; cat settings.py"})).output
        assert password[:10] not in out and 'DATABASE = "postgres://app:***@db/app"' in out
        url = f"postgresql+psycopg://app:{password}@db:5432/app?sslmode=require"
        assert make_url(url).password == password  # what the store logs in with
        assert password in url_secrets(url) and shown_url(url) == "postgresql+psycopg://app:***@db:5432/app?sslmode=require"
        assert url_secrets("http://host:8080/users/a@example.com") == []  # a port, then a path: no password

    @SQLALCHEMY_PASSWORDS
    def test_the_store_urls_such_password_is_redacted_in_what_the_agent_reads(
        self, password: str, tmp_path: Path, repo: Path, server, pg_store_url: str
    ) -> None:
        """A PostgreSQL [store] url with such a password: the agent that cats the config sees ***, in the transcript and the store too."""
        store_url = pg_store_url.replace("://postgres@", f"://postgres:{password}@")  # trust auth takes any password
        config = tmp_path / "overnight.toml"
        from tests.conftest import write_config

        write_config(config, api_base=server.url, repo=repo, extra=f"\n[store]\nurl = {json.dumps(store_url)}\n", tasks=[
            {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "edit_file", "submit"]}])
        server.enqueue(
            call("run_command", {"command": f"cat {config}"}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": "fixed"}),
        )
        assert overnight("run", "--config", str(config)) == 0
        transcripts = [path.read_text() for path in (tmp_path / "state" / "transcripts").iterdir()]
        assert any("postgres:***@" in text for text in transcripts)
        assert not any(password[:10] in text for text in [*transcripts, json.dumps(server.requests)])

    @SQLALCHEMY_PASSWORDS
    def test_an_api_base_with_such_a_password_is_refused_without_showing_it(
        self, password: str, config_file, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """urllib's error quoted the password's start ("Port could not be cast to integer value as 'Xk3-9fqLm2'"), the
        space's error the whole URL: the line says what to do, with ***."""
        config = config_file(model={"api_base": f"http://me:{password}@127.0.0.1:9/v1"})
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 2
        said = capsys.readouterr()
        assert password[:10] not in said.out + said.err and "http://me:***@127.0.0.1:9/v1" in said.err and "percent-encode" in said.err


class TestPasswordsWithSpaces:
    # Only a value that is one URL may hold a password with spaces.
    PASSWORD = "correct horse Battery9 staple"

    def test_a_value_that_is_one_url_gives_its_password_whole(self) -> None:
        url = f"postgresql+psycopg://app:{self.PASSWORD}@db:5432/app?sslmode=require"
        assert shown_url(f"  http://me:{self.PASSWORD}@h/v1?key=QUERYSECRET ") == "  http://me:***@h/v1?key=*** "
        assert withheld({"DATABASE_URL": url}) == ["DATABASE_URL"]

    def test_among_other_words_a_url_ends_at_a_space(self) -> None:
        """A proxy's port and then options; pip's space-separated index URLs: the words after a URL are no password."""
        env = {"JAVA_OPTS": "-Dproxy=http://proxy:3128 -Dmail=ops@example.com",
               "GIT_PROXY": "http://proxy:3128 -Dmail=ops@example.com",
               "PIP_INDEX_URL": "https://a.example/simple https://b.example/simple?next=c@d",
               "PIP_EXTRA_INDEX_URL": "https://a.example/simple https://u:tok-0123456789@b.example/simple"}
        assert withheld(env) == ["PIP_EXTRA_INDEX_URL"]
        assert url_secrets(env["PIP_EXTRA_INDEX_URL"]) == ["tok-0123456789"]
        assert shown_url(env["JAVA_OPTS"]) == env["JAVA_OPTS"] and shown_url(env["GIT_PROXY"]) == env["GIT_PROXY"]


class TestUrlPasswordsAsTheirReadersReadThem:
    """What SQLAlchemy, urllib and httpx take for a URL's password is found, and words that only look like one are not."""

    PASSWORD = "correct horse Battery9 staple"

    def test_a_user_with_an_at_sign_keeps_its_password_found(self) -> None:
        """SQLAlchemy's user ends at its first `:`, so Azure's `admin@server` user is followed by a password."""
        for password in ("Passw0rd!xyz", self.PASSWORD):
            url = f"postgresql://admin@myserver:{password}@myserver.postgres.database.azure.com/app"
            assert make_url(url).password == password
            assert password in url_secrets(url) and withheld({"DATABASE_URL": url}) == ["DATABASE_URL"]
            assert shown_url(url) == "postgresql://admin@myserver:***@myserver.postgres.database.azure.com/app"

    def test_one_urls_query_and_fragment_may_hold_spaces_and_its_scheme_an_underscore(self) -> None:
        """`?driver=ODBC Driver 18`, `?application_name=night job`, `#a b` and `oracle+cx_oracle://` leave a value one URL."""
        for url in (f"mssql+pyodbc://sa:{self.PASSWORD}@db/app?driver=ODBC Driver 18 for SQL Server",
                    f"postgresql://app:{self.PASSWORD}@db/app?application_name=night job",
                    f"postgresql://app:{self.PASSWORD}@db/app#a b",
                    f"oracle+cx_oracle://scott:{self.PASSWORD}@db:1521/orcl"):
            assert make_url(url).password == self.PASSWORD
            assert self.PASSWORD in url_secrets(url) and withheld({"DATABASE_URL": url}) == ["DATABASE_URL"]
            assert "horse" not in shown_url(url) and ":***@db" in shown_url(url)

    def test_a_password_httpx_reads_past_an_at_sign_is_hidden_whole(self) -> None:
        """httpx and urllib read an api_base's password up to the authority's last `@`; SQLAlchemy up to its first."""
        api_base = "http://me:Secret@Hunter2long@127.0.0.1:9/v1"
        assert httpx.URL(api_base).password == urlsplit(api_base).password == "Secret@Hunter2long"
        assert "Secret@Hunter2long" in url_secrets(api_base)
        assert shown_url(api_base) == "http://me:***@127.0.0.1:9/v1"
        assert Redactor.for_night(api_base=api_base)("401 for me:Secret@Hunter2long") == "401 for me:***"

    def test_every_urls_password_among_other_words_is_found(self) -> None:
        """pip's space-separated index URLs: the second's token is found after a first with a user and no password, or with one."""
        after_a_user = "https://me@a.example/simple https://u:tokB-0123456789@b.example/simple"
        after_a_password = "https://u:tokA-0123456789@a.example/simple https://u:tokB-0123456789@b.example/simple"
        after_an_ipv6_host = "http://[::1]:443/simple https://u:tokB-0123456789@b.example/simple"
        assert withheld({"PIP_EXTRA_INDEX_URL": after_a_user}) == ["PIP_EXTRA_INDEX_URL"]
        assert url_secrets(after_a_user) == url_secrets(after_an_ipv6_host) == ["tokB-0123456789"]
        assert url_secrets(after_a_password) == ["tokA-0123456789", "tokB-0123456789"]

    def test_words_after_a_host_and_its_port_are_no_password(self) -> None:
        """A port then a comma, an IPv6 host, an `@` in a path or query: nothing is withheld, nothing hidden (builds need them)."""
        env = {"DESCRIPTION": "https://db:3128, ask ops@example.com",
               "DOCS": "http://[::1]:5432/, mail ops@example.com",
               "GIT_PROXY": "http://[::1]:8080 -Dmail=ops@example.com",
               "PIP_EXTRA_INDEX_URL": "https://a.example/simple https://[::1]:443/simple?next=ops@example.com",
               "REPO": "ssh://git@[::1]:22/a@b"}
        assert withheld(env) == []
        assert all(url_secrets(value) == [] and shown_url(value) == value for value in env.values())


class TestUrlListsJdbcAndJsonValues:
    """URLs in `,`/`;` lists, a JDBC SQL Server URL's `;password=`, and JSON configs: passwords found, none made up, fast."""

    def test_every_urls_password_of_a_list_is_found_after_a_first_with_one(self) -> None:
        """A value that begins with a whole URL has its further URLs' passwords found too: `,` and Kombu's `;` lists, or a query
        then a space before the next."""
        for value in ("https://u:tokA-0123456789@a.example/simple,https://u:tokB-0123456789@b.example/simple",
                      "amqp://u:tokA-0123456789@mq1//;amqp://u:tokB-0123456789@mq2//",
                      "postgresql://u:tokA-0123456789@db/app?sslmode=require postgresql://v:tokB-0123456789@db2/app"):
            assert url_secrets(value) == ["tokA-0123456789", "tokB-0123456789"]
            assert "tok" not in shown_url(value)
            assert Redactor.for_night(store_url=value)("second: tokB-0123456789") == "second: ***"

    def test_a_jdbc_sql_server_urls_password_setting_is_found(self) -> None:
        """`jdbc:sqlserver://host;user=sa;password=...`: its settings follow `;`, with no query."""
        url = "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password=S3rverPass!x;encrypt=true"
        assert url_secrets(url) == ["S3rverPass!x"] and withheld({"JDBC_URL": url}) == ["JDBC_URL"]
        assert shown_url(url) == "jdbc:sqlserver://db:1433;databaseName=app;user=sa;password=***;encrypt=true"

    def test_a_json_config_or_a_list_of_hosts_with_ports_holds_no_password(self) -> None:
        """Hosts and ports then `;`, `|` or a JSON string's end, an `@` later: nothing withheld or hidden (builds need them)."""
        services = {"api": "https://api.internal:8443", "web": "https://localhost", "owner": "dev+ci@corp.example"}
        env = {"SERVICES": json.dumps(services, separators=(",", ":")),
               "ALERTS": "https://hooks.internal:8080;dev+ci@corp.example;mailto:ops@example.com",
               "DESCRIPTION": "redis://localhost:6379; ask ops@example.com",
               "ES_HOSTS": "http://es1:9200|http://elastic@es2:9200"}
        assert withheld(env) == []
        assert all(url_secrets(value) == [] and shown_url(value) == value for value in env.values())

    def test_long_values_without_a_password_are_read_in_linear_time(self) -> None:
        """A 125 kB minified JSON of `http://host:port` URLs and a 20 kB run of `?` are read in milliseconds for each command, not
        in seconds."""
        services = json.dumps({f"svc{number}": f"http://svc{number}:8080" for number in range(4000)}, separators=(",", ":"))
        marks = "https://example.com/" + "?" * 20000
        started = time.perf_counter()
        assert withheld({"SERVICES": services, "MARKS": marks}) == []
        assert shown_url(services) == services and shown_url(marks) == marks
        assert time.perf_counter() - started < 1.0


class TestOracleLoginsAndQuotedUrls:
    """Oracle's `user/password@connect` logins, URLs with a pass phrase in a quoted string, and a user with a `"`: passwords found,
    and the paths, packages, emails and ssh logins beside them left as they are."""

    PASSWORD = "Tiger-Pass99"
    PHRASE = "correct horse Battery9 staple"
    # Each beside the login: none is one (a path, an image, a GitHub Action, a Go module's, an npm package's version, an ssh login).
    ORDINARY = ("src/a/b@c docs/v1@2x.png actions/checkout@v4 golang.org/x/tools@v0.1.0 @scope/pkg@1.2 git@github.com:org/repo.git"
                " first.last@x.org ssh ops@db.example sqlplus /nolog jdbc:oracle:thin:@//db:1521/orcl fe80::1/64")

    @pytest.mark.parametrize("login", [
        "scott/{}@//db.example:1521/orcl",
        "scott/{}@db.example:1521/orcl",
        "jdbc:oracle:thin:scott/{}@//db.example:1521/svc",
        "jdbc:oracle:thin:scott/{}@db.example:1521:sid",
        "jdbc:oracle:oci:scott/{}@orcl",
        "sqlplus scott/{}@orcl",
        "sqlplus -S -L ops$batch/{}@orcl @run.sql",
        'sqlplus scott/"{}"@orcl',
        "expdp userid=scott/{}@orcl directory=dp",
        '/opt/oracle/bin/sqlplus -S "scott/{}@orcl"',
        "scott/{}@tcps://db.example:2484/svc",
        'scott/"{}"@//db.example:1521/orcl',
        "scott/{}@(DESCRIPTION=(ADDRESS=(PROTOCOL=TCP)(HOST=db.example)(PORT=1521))(CONNECT_DATA=(SERVICE_NAME=orcl)))",
        "rman target sys/{}@orcl",
        "jdbc:oracle:thin:@//db.example:1521/svc?user=scott&password={}",
        'expdp \\"sys/{}@orcl as sysdba\\" directory=dp',
        'sqlplus -S "scott/\\"{}\\"@orcl"',
        "\nwhenever sqlerror exit 1;\nCONNECT scott/{}@orcl\nselect 1 from dual;",
        "\nconn sys/{}@db.example:1521/orcl AS SYSDBA;",
        "\nSQL> connect scott/{}",
        "\nCONNECT scott/{};",
        "echo 'connect scott/{}@orcl' | sqlplus -S /nolog",
        "scott[hr]/{}@//db.example:1521/orcl",
        "sqlplus scott[hr]/{}@orcl",
        "\nCONNECT scott[hr]/{}@orcl",
        '\nCONNECT scott/"{}";',
        "\nconnect sys/{} as sysdba",
    ], ids=["ezconnect", "ezconnect-port", "jdbc-thin-service", "jdbc-thin-sid", "jdbc-oci", "sqlplus", "sqlplus-options",
            "sqlplus-quoted", "expdp-userid", "sqlplus-path-quoted-login", "ezconnect-tcps", "ezconnect-quoted", "tns-descriptor",
            "rman-target", "jdbc-thin-query", "expdp-sysdba-shell-escaped", "sqlplus-shell-escaped-quotes",
            "sql-script-connect", "conn-as-sysdba", "connect-at-the-prompt", "connect-local-statement", "connect-echoed",
            "proxy-user-ezconnect", "proxy-user-sqlplus",
            "proxy-user-connect", "connect-quoted-statement", "connect-local-as-sysdba"])
    def test_an_oracle_logins_password_is_withheld_and_redacted(self, login: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A variable holding an Oracle login among ordinary text is withheld, and its password alone reads ***: a quoted one
        with its spaces too."""
        password = self.PHRASE if '"{}' in login else self.PASSWORD
        value = f"{self.ORDINARY} {login.format(password)}"
        monkeypatch.setenv("ORACLE_LOGIN_LINE", value)
        assert withheld({"ORACLE_LOGIN_LINE": value, "ORDINARY": self.ORDINARY}) == ["ORACLE_LOGIN_LINE"]
        assert Redactor.for_night()(value) == f"{self.ORDINARY} {login.format(REDACTED)}"

    @pytest.mark.parametrize("value", [
        "sqlplus scripts/deploy.sql",
        "cp sqlplus bin/sqlplus.bak",
        "expdp dumps/export_2024.dmp",
        "https://intranet.example/page?userid=org/Employee42&lang=en",
        '{"note": "https://status.example.com down since 10:30am, ask ops@example.com"}',
        "['https://mirror.example synced 2024-01-01T10:15Z by admin@mirror.example']",
    ], ids=["sqlplus-script", "sqlplus-backup", "expdp-dump-file", "userid-in-query", "json-note", "repr-list"])
    def test_a_path_after_a_tools_name_or_words_after_a_quoted_host_hold_no_password(
        self, value: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A file after a tool's name, and a quoted string of a host, words, a time and an e-mail address, are neither withheld
        nor redacted, while a local login's password stays found."""
        monkeypatch.setenv("ORDINARY_LINE", value)
        assert withheld({"ORDINARY_LINE": value, "LOGIN": f"sqlplus -S scott/{self.PASSWORD}"}) == ["LOGIN"]
        assert Redactor.for_night()(value) == value

    @pytest.mark.parametrize("value", [
        "connect org/repo@main to CI", "Connect actions/checkout@v4 in the workflow", "connect a/b@c.com as needed",
        "reconnect scott/Tiger-Pass99@orcl", "connect to db/app@localhost", "items[idx]/a@b.com", "see docs[1]/x@2x.png",
        "users[admin]/config@main", "# connect via ssh/tunnel@bastion", "Connect web/checkout-flow",
        "conn redis/cache-layer\nmore",
    ], ids=["connect-in-prose", "connect-an-action", "connect-and-words", "reconnect", "connect-to", "indexed-path", "indexed-image",
            "indexed-path-on-a-branch", "comment", "connect-a-folder-commit-title", "conn-a-folder-line"])
    def test_connect_and_brackets_in_ordinary_text_hold_no_login(self, value: str) -> None:
        """`connect` before a package, a path or words, and a bracketed name in a path, read as no Oracle login: nothing
        withheld, redacted or hidden."""
        value = f"{self.ORDINARY}\n{value}"
        assert withheld({"ORDINARY_LINE": value}) == [] and shown_url(value) == value

    @pytest.mark.parametrize("written", [
        '["postgresql://app:{}@db/app"]',
        '{{"url": "postgresql://app:{}@db:5432/app?sslmode=require", "api": "https://api:8443", "owner": "ops@example.com"}}',
        '{{\n  "db": {{\n    "url": "mysql://app:{}@db/app"\n  }},\n  "owner": "ops@example.com"\n}}',
        "{{'url': 'redis://app:{}@cache:6379/0', 'mail': 'ops@example.com'}}",
        '--db "postgresql://app:{}@db/app" --mail ops@example.com',
        "DATABASE_URL='postgresql://app:{}@db/app'",
        '{{"url": "mssql+pyodbc://app:{}@db/app?driver=ODBC Driver 18"}}',
    ], ids=["json-list", "json-object", "pretty-json", "python-repr", "shell-quoted", "env-file", "query-with-spaces"])
    def test_a_quoted_urls_pass_phrase_is_found_and_hidden(self, written: str) -> None:
        """A string in quotes that is one URL has its password with spaces read whole, as a value that is one URL has."""
        value = written.format(self.PHRASE)
        assert url_secrets(value) == [self.PHRASE] and withheld({"SETTINGS": value}) == ["SETTINGS"]
        assert shown_url(value) == written.format(REDACTED)

    @pytest.mark.parametrize("written", ['x postgresql://my"user:{}@db/app', '-Ddb=postgresql://a"b:{}@db/app -Dmail=ops@example.com'],
                             ids=["among-words", "java-option"])
    def test_a_user_with_a_quote_among_other_words_keeps_its_password_found(self, written: str) -> None:
        """A `"` in a user that ends no JSON string (`my"user`) leaves its password found, as in a value that is one URL."""
        value = written.format(self.PASSWORD)
        assert url_secrets(value) == [self.PASSWORD] and shown_url(value) == written.format(REDACTED)

    @pytest.mark.parametrize("login", [
        "scott/{}@db.example:1521/orcl", "jdbc:oracle:thin:scott/{}@//db.example:1521/svc", 'scott/"{}"@//db.example:1521/orcl',
    ], ids=["ezconnect", "jdbc-thin", "quoted"])
    def test_an_oracle_login_is_shown_without_its_password(self, login: str) -> None:
        """shown_url, which config errors and the model's name quote a configured URL with, shows an Oracle login's password
        as ***, as the Redactor does, and leaves the ordinary text beside it as it is."""
        password = self.PHRASE if '"{}' in login else self.PASSWORD
        assert shown_url(f"{self.ORDINARY} {login.format(password)}") == f"{self.ORDINARY} {login.format(REDACTED)}"

    @pytest.mark.parametrize("where", ["api_base", "store_url"])
    def test_a_config_error_about_an_oracle_login_hides_its_password(self, where: str, tmp_path: Path) -> None:
        """An Oracle login written where a model endpoint or a store URL goes is refused, the error quoting it with its password
        as ***; and a night's redaction given it as that endpoint or store hides the password."""
        from orchestrator.config import load_config
        from orchestrator.errors import ConfigError
        from tests.conftest import write_config

        login = f"scott/{self.PASSWORD}@db.example:1521/orcl"
        api_base, store = (login, "") if where == "api_base" else ("http://127.0.0.1:9/v1", f'[store]\nurl = "{login}"\n')
        with pytest.raises(ConfigError) as refused:
            load_config(write_config(tmp_path / "overnight.toml", api_base=api_base, repo=tmp_path, extra=store))
        assert "scott/***@db.example:1521/orcl" in str(refused.value) and self.PASSWORD not in str(refused.value)
        assert Redactor.for_night(**{where: login})(f"connecting as {login}") == "connecting as scott/***@db.example:1521/orcl"


class TestConnectionStringsAndSignedUrls:
    """Secrets that are no URL's password: a connection string's, a Java option's, a signed URL's signature, a query's
    camel-case token, an Authorization header's credentials and a webhook's URL; found, and the ordinary settings beside them
    left as they are."""

    PASSWORD = "Str0ng-Passw0rd"

    @pytest.mark.parametrize("written", [
        "Server=db;Database=app;User Id=sa;Password={};",
        "Driver={{ODBC Driver 18}};Server=db;Uid=sa;Pwd={{{}}};",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={};EndpointSuffix=core.windows.net",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={}",
        "host=db dbname=app user=app password={}",
        "-Xmx2g -Djavax.net.ssl.keyStorePassword={} -Dfile.encoding=UTF-8",
        "https://acct.blob.core.windows.net/c?sv=2021-08-06&ss=b&sig={}",
        "https://bucket.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        "https://api.example/v1/items?apiToken={}&pageSize=10",
        "https://auth.example/keys?privateKey={}&lang=en",
        "Accept: application/json\nAuthorization: Basic {}",
        "x-team=ops,Authorization=Bearer%20{}",
        "Proxy-Authorization: Bearer {}",
        "https://app.example/callback#access_token={}&state=af0ifjsldkj",
    ], ids=["ado-net", "odbc-braced", "azure-storage", "azure-service-bus", "libpq", "java-property", "azure-sas", "aws-presigned",
            "camel-case-token", "camel-case-private-key", "authorization-header", "otel-headers", "proxy-authorization",
            "oauth-fragment"])
    def test_a_settings_secret_is_withheld_and_redacted(self, written: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A variable whose name says nothing, holding a connection string, options or a signed URL with a secret setting, is
        withheld, and that setting's value alone reads ***: the names and values beside it, a policy's name too, as they are."""
        value = written.format(self.PASSWORD)
        monkeypatch.setenv("CONNECTION", value)
        assert withheld({"CONNECTION": value}) == ["CONNECTION"]
        assert Redactor.for_night()(value) == written.format(REDACTED)

    def test_an_oauth_fragments_token_is_shown_as_stars(self) -> None:
        """A redirect URL's fragment that carries an access token (OAuth's implicit grant) shows it as ***, its other
        settings and an ordinary fragment as they are."""
        callback = "https://app.example/cb#access_token={}&state=af0ifj"
        assert shown_url(callback.format(self.PASSWORD)) == callback.format(REDACTED)
        assert shown_url("https://docs.example/page#section-2") == "https://docs.example/page#section-2"

    def test_a_private_key_in_a_json_key_file_is_withheld_and_redacted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A service account's JSON key in a variable whose name says nothing is withheld, and its private key reads ***,
        whole as the JSON holds it and line by line as a program that read it prints it."""
        lines = ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7", "QWERTYuiop98765432asdfghjklZXCVB"]
        key = "\\n".join(["-----BEGIN PRIVATE KEY-----", *lines, "-----END PRIVATE KEY-----"])
        value = f'{{"type": "service_account", "client_email": "ci@proj.iam.gserviceaccount.com", "private_key": "{key}"}}'
        monkeypatch.setenv("GCP_SA_JSON", value)
        assert withheld({"GCP_SA_JSON": value}) == ["GCP_SA_JSON"]
        redact = Redactor.for_night()
        assert redact(value).endswith('"private_key": "***"}') and "ci@proj.iam.gserviceaccount.com" in redact(value)
        assert redact(f"key line {lines[0]}") == "key line ***"

    @pytest.mark.parametrize("template", [
        "postgresql://app:${DB_PASSWORD}@db/app", "https://api.example/v1?api_key=<your-api-key>", "redis://:$REDIS_PASS@cache:6379/0",
        "-Dspring.datasource.password=${DB_PASSWORD:-dev}", "Server=db;User Id=sa;Password={{ secrets.DB_PASSWORD }};",
        "Server=db;Password=%DB_PASS%;",
    ], ids=["url-variable", "query-placeholder", "url-bare-variable", "java-property-default", "template", "windows-variable"])
    def test_a_placeholder_where_a_password_goes_is_no_secret(self, template: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A template's unfilled placeholder for a password (a compose file's `${DB_PASSWORD}`, `<your-api-key>`) is neither
        withheld nor redacted: the project's files that hold it read as they are. A password that begins with `$` is found."""
        monkeypatch.setenv("TEMPLATED", template)
        assert withheld({"TEMPLATED": template}) == [] and ("://" not in template or url_secrets(template) == [])
        assert Redactor.for_night()(f"environment: [{template}]") == f"environment: [{template}]"
        assert url_secrets("postgresql://app:$ecretPa55w0rd@db/app") == ["$ecretPa55w0rd"]

    def test_a_webhooks_url_is_withheld_and_redacted(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """SLACK_WEBHOOK_URL, whose URL's path is its token, is withheld and its value redacted."""
        hook = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"
        monkeypatch.setenv("SLACK_WEBHOOK_URL", hook)
        assert withheld({"SLACK_WEBHOOK_URL": hook}) == ["SLACK_WEBHOOK_URL"]
        assert Redactor.for_night()(f"posted to {hook}") == "posted to ***"

    def test_ordinary_settings_hold_no_secret(self) -> None:
        """Options, colours and settings whose names say no secret (make's jobserver fifo, a folder's PWD, ssh's key file, a
        policy's name, a signed URL's signed headers) are neither withheld nor redacted."""
        env = {
            "MAKEFLAGS": " -j4 --jobserver-auth=fifo:/tmp/GMfifo12345", "SUDO_COMMAND": "/usr/bin/env PWD=/home/me/app make",
            "GIT_SSH_COMMAND": "ssh -o IdentityFile=/home/me/.ssh/id_ed25519 -o StrictHostKeyChecking=no",
            "POLICY": "SharedAccessKeyName=RootManageSharedAccessKey;EntityPath=orders-queue",
            "LS_COLORS": "rs=0:di=01;34:ln=01;36:mh=00:pi=40;33",
            "JAVA_TOOL_OPTIONS": "-Dfile.encoding=UTF-8 -Duser.timezone=Europe/Berlin",
            "SIGNED": "https://b.example/k?X-Amz-SignedHeaders=content-type%3Bhost&X-Amz-Date=20240101T000000Z",
            "DOC": "see the Authorization header docs", "NOTE": "authorization: required",
            "TOKENIZERS_PARALLELISM": "false", "MAX_NEW_TOKENS": "4096",
            "PAGED": "https://api.example/v1/items?maxTokens=4096abc&page=2",
        }
        assert withheld(env) == [] and all(url_secrets(value) == [] for value in env.values())

    def test_toolchain_variables_named_like_secrets_are_kept(self) -> None:
        """Variables a build or a test needs whose names only a setting's name would make secret (tiktoken's cache, a webhook
        server's port, a signature check's flag) are not withheld; a webhook's URL still is."""
        env = {
            "TIKTOKEN_CACHE_DIR": "/home/runner/.cache/tiktoken", "WEBHOOK_PORT": "8080", "WEBHOOK_PATH": "/hooks/github",
            "ENABLE_WEBHOOK": "false", "VERIFY_SIGNATURE": "true", "GPG_SIG": "auto",
        }
        assert withheld(env) == []
        assert withheld({"SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/XXXXXXXXXXXX"}) == ["SLACK_WEBHOOK_URL"]

    def test_options_that_say_where_a_secret_is_kept_are_kept(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Java and tool options whose secret-named settings hold a path or a variable's name (a JMX password file, a keyring,
        a JAAS config, a key's location, `gpg.passphrase.env`) are neither withheld nor their paths redacted; a keystore's
        password beside them still is."""
        env = {
            "CATALINA_OPTS": "-Dcom.sun.management.jmxremote.password.file=/etc/jmxremote.password -Dcom.sun.management.jmx=1",
            "GRADLE_OPTS": "-Dorg.gradle.caching=true -Dsigning.secretKeyRingFile=/home/u/.gnupg/secring.gpg",
            "KAFKA_OPTS": "-Djava.security.auth.login.config=/etc/kafka/jaas.conf",
            "SPARK_SUBMIT_OPTS": "-Dssl.key.location=/etc/ssl/private/server.key -Dspark.ssl.keyStorePassword.env=KS_PASSWORD",
            "MAVEN_OPTS": "-Xmx2g -Dgpg.passphrase.env=GPG_PASSPHRASE", "LAUNCH": "env TOKEN_FILE=/run/secrets/api-token app",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert withheld(env) == []
        assert all(Redactor.for_night()(value) == value for value in env.values())
        with_password = "-Djavax.net.ssl.keyStore=/etc/ks.p12 -Djavax.net.ssl.keyStorePassword=Str0ng-Passw0rd"
        assert withheld({"JAVA_TOOL_OPTIONS": with_password}) == ["JAVA_TOOL_OPTIONS"]


class TestSecretsWrittenAsOptionsHeadersAndNetrc:
    """Secrets a variable's value holds as a command line, an HTTP header, a .netrc or an inner setting writes them
    (orchestrator/inline_secrets.py), found; the options, headers and words that only look so, and the text a morning reader
    needs (a diff, git's and pytest's output), left as they are."""

    PASSWORD = "Str0ng-Passw0rd"

    @pytest.mark.parametrize("written", [
        "deploy --password={} --verbose", "deploy --password {} --verbose", "gh api --token={} /user",
        "client --api-key {} --region eu", "client --client-secret '{}'", "mysql -h db -u app -p{} app_db", "mysqldump -u root -p'{}' shop",
        "Cookie: session={}; theme=dark", "Set-Cookie: sid={}; Path=/; HttpOnly", '{{"Cookie": "csrftoken=x1; sessionid={}"}}',
        "curl --cookie 'sessionid={}' https://app.example", "machine example.com login bob password {}",
        'docker run --env="SECRET_KEY_BASE={}" app', "X=1 SECRET_KEY_BASE={}", "https://u: {}@db.example/app",
        'machine example.com login "bob smith" password "{}"', "deploy --password:{}",
        "SqlPackage /Action:Publish /TargetPassword:{}", "dotnet publish -p:Password={}", "client --secretKey {}",
        "mysql -u app shop; deploy --password {}",
        "curl -u deploy:{} https://api.example", "curl -s --user 'deploy:{}' https://api.example", "sshpass -p {} ssh deploy@host",
        "redis-cli -h cache -a {} ping", "keytool -list -keystore ks.p12 -storepass {}", "keytool -genkey -keypass '{}' -v",
        "jarsigner -storepass {} app.jar key", "sqlcmd -S db -U sa -P {} -Q 'select 1'", "mongosh -u admin -p {} mongodb://db",
        "mongodump -u admin -p '{}' --db app", "htpasswd -b /etc/nginx/.htpasswd bob {}", "htpasswd -nbB bob {}",
        'Cookie: sid="{}"; theme=dark', "curl -b 'sid={}' https://app.example", "/usr/bin/curl -b sid={} https://app.example",
        "mongosh -u admin -p{} mongodb://db", "mongo -p'{}' admin", "redis-cli -h cache -a{} ping",
        "sshpass -P assword -p {} ssh deploy@host", "bcp shop.dbo.orders out orders.dat -S db -U sa -P {} -c",
        "osql -S db -U sa -P{} -Q 'select 1'",
    ], ids=["option-equals", "option-word", "token", "api-key", "client-secret", "mysql", "mysqldump-quoted", "cookie", "set-cookie",
            "cookie-in-json", "curl-cookie", "netrc", "quoted-inner-setting", "variable-setting", "url-password-after-space",
            "netrc-quoted", "option-colon", "windows-slash-option", "msbuild-property", "camel-case-option",
            "password-after-a-mysql-command", "curl-user", "curl-long-user-quoted", "sshpass", "redis-cli", "keytool-storepass",
            "keytool-keypass", "jarsigner", "sqlcmd", "mongosh", "mongodump-quoted", "htpasswd-batch", "htpasswd-print",
            "cookie-quoted-value", "curl-b-cookie", "curl-path-b-cookie", "mongosh-attached", "mongo-attached-quoted",
            "redis-cli-attached", "sshpass-after-prompt", "bcp", "osql-attached"])
    def test_an_inline_secret_is_withheld_and_redacted(self, written: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A variable whose name says nothing, holding a command line, a header or a .netrc entry with a secret, is withheld,
        and the secret alone reads ***: the options, names and cookies beside it as they are."""
        value = written.format(self.PASSWORD)
        monkeypatch.setenv("DEPLOY_ARGS", value)
        assert withheld({"DEPLOY_ARGS": value}) == ["DEPLOY_ARGS"]
        assert Redactor.for_night()(value) == written.format(REDACTED)

    @pytest.mark.parametrize("value", [
        "--password-file /run/secrets/db_password", "--token-count 5 --max-tokens 4096", "psql --no-password analytics_prod",
        "mysql --password --default-character-set=utf8mb4 shop", 'login --password "$DB_PASSWORD" --api-key <your-api-key>',
        "gh auth login --with-token < token_file.txt", "docker build --secret id=npmrc,src=/home/me/.npmrc .",
        "curl --key client-key.pem --cert client.pem https://api.example",
        "mkdir -p build/output_dir && ssh -p 2222 deploy@host.example", "mysql -u root -p analytics_prod",
        "pytest -p no:cacheprovider tests/test_mysql.py", "gcc -Wall -pedantic-errors -o app main.c", "Cookie: <redacted>",
        "Set-Cookie: session=<redacted>; Path=/", "cookie: dict[str, str] = {}", "curl --cookie cookies.txt https://app.example",
        "the machine learning password requirements", "SECRET_KEY_FILE=/run/secrets/rails_key_base", "token_count=5",
        "def set_password(self, pw):", "gcc -I/usr/include/mysql -pedantic-errors -c db.c",
        "docker run -d --name mysql -p3306:3306 mysql:8", "tox -e mysql -- -pno:randomly", "mysql -u app --password shop_production",
        "psql -h db -U app --password analytics_production",
        "adduser --disabled-password app-user", 'login --password="$(pass show db/prod)" --token `cat ~/.deploy-token`',
        "sort -u names.txt && tar -u -f backup.tar deploy:Str0ng-Passw0rd", "curl -u deploy https://api.example/v1/items",
        "curl -u deploy:$DEPLOY_TOKEN https://api.example", "sshpass -f /run/pass.txt ssh -p 2222 deploy@host.example",
        "ssh -p 2222 deploy@host.example; sshpass -p $SSHPASS ssh deploy@host", "ls -a Str0ng-Passw0rd-dir; redis-cli -h cache ping",
        "redis-cli --askpass -a ${REDIS_PASSWORD} ping", "keytool -list -storepass:env KEYSTORE_PASSWORD -keystore ks.p12",
        "keytool -list -storepass:file /run/ks-pass -v", "git -P log -P Str0ng-Passw0rd; sqlcmd -S db -U sa",
        "sqlcmd -S db -U sa -P $SQLCMDPASSWORD", "docker run --name mongo -p 27017:27017 -d mongo:7",
        "mongosh -u admin -p --authenticationDatabase admin", "htpasswd -c /etc/nginx/.htpasswd bob-the-builder",
        "htpasswd -D /etc/nginx/.htpasswd bob-the-builder", "curl -b cookies.txt https://app.example",
        "ls -b Str0ng=Passw0rd-file", 'Cookie: sid="<redacted>"', "keytool -list -storepass '<keystore-password>'",
        'sshpass -p "$(cat ~/.ssh/deploy-pass)" ssh deploy@host', "curl -u deploy:*** https://api.example",
    ], ids=["password-file", "token-count", "no-password-flag", "password-prompt", "placeholders", "token-from-stdin", "docker-secret",
            "key-file", "mkdir-ssh-p", "mysql-p-prompt", "pytest-p", "gcc-pedantic", "cookie-redacted", "set-cookie-placeholder",
            "cookie-annotation", "cookie-jar", "prose", "secret-file-variable", "token-count-setting", "def-set-password",
            "mysql-include-folder", "docker-port", "pytest-plugin-off-after-mysql", "mysql-password-prompt-then-database",
            "psql-password-prompt-then-database", "disabled-password-flag", "command-substitution", "sort-tar-u", "curl-user-alone",
            "curl-user-placeholder", "sshpass-file-then-ssh-port", "ssh-port-sshpass-placeholder", "ls-a", "redis-cli-placeholder",
            "keytool-storepass-env", "keytool-storepass-file", "git-P", "sqlcmd-placeholder", "docker-mongo-port",
            "mongosh-p-prompt", "htpasswd-create-prompt", "htpasswd-delete", "curl-b-cookie-jar", "ls-b", "cookie-quoted-redacted",
            "keytool-placeholder", "sshpass-command-substitution", "curl-user-redacted"])
    def test_what_only_looks_like_an_inline_secret_is_kept(self, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """An option that names where a secret is kept or none, a flag before a positional argument, a placeholder, `-p`
        of another tool than mysql, a cookie already hidden or a cookie jar's file, prose: neither withheld nor redacted."""
        monkeypatch.setenv("TOOL_ARGS", value)
        assert withheld({"TOOL_ARGS": value}) == []
        assert Redactor.for_night()(value) == value

    @pytest.mark.parametrize("value", [
        "sort -u hosts-2024.txt", "ls -a ~/backup-2024", "git -P log --oneline v1.2.3..v1.3.0", "ssh -p 22 deploy@host.example",
        "docker run -p 27017:27017 mongo", "mongosh --port 27017 --username app-user -p", "redis-cli -h host -p 6379 ping",
        "sqlcmd -S srv -E -i migrate-2024.sql", "bcp shop.dbo.orders out orders-2024.dat -S db -T -c",
        "osql -S srv -E -i setup-2024.sql",
        "redis-cli -h cache ping; sort -u hosts-2024.txt && ls -al /var/lib/redis-2024 && git -P log origin/main",
        "sshpass -P assword -f /run/pass.txt ssh -p 2222 deploy@host.example", "pytest -k mongo -p no:cacheprovider tests/",
        "tox -e mongo -- -p no:randomly", 'docker run --name mongo -p "27017:27017" mongo:7', "ssh mongo -p 2222",
        "docker run --name mongo -p 27017-27019:27017-27019 mongo:7", "docker run --name mongo -p 27017 mongo:7",
        "docker run --name mysql -p 127.0.0.1:3306:3306/tcp mysql:8", '["docker run -d --name mysql -p3306:3306", "sleep 10"]',
        '{"start": "docker run -d --name mongo -p 27017:27017"}', "ID=`docker run -d --name mysql -p127.0.0.1:3306:3306/tcp`",
        "gcc $(mysql_config --cflags) -pedantic-errors -o x x.c", "pytest -k mongo -p pytest_randomly",
    ], ids=["sort-u", "ls-a", "git-P", "ssh-p", "docker-port-before-mongo", "mongosh-port", "redis-cli-port", "sqlcmd-trusted",
            "bcp-trusted", "osql-trusted", "commands-after-redis-cli", "sshpass-prompt-then-file",
            "pytest-plugin-off-after-mongo", "tox-pytest-plugin-off", "docker-mongo-port-quoted", "ssh-host-named-mongo",
            "docker-mongo-port-range", "docker-mongo-container-port", "docker-mysql-port-on-address", "mysql-port-in-json-list",
            "mongo-port-in-json", "mysql-port-in-backticks", "mysql-config-then-gcc-option",
            "pytest-plugin-after-k-mongo"])
    def test_an_ordinary_command_holds_no_tool_password(self, value: str) -> None:
        """An ordinary command whose option only looks like a tool's password option (another tool's `-u`, `-a`, `-P` or
        `-p`, a port or a pytest plugin after mysql or mongo, a port where a quote or backtick closes the string that holds
        the command, a trusted connection) holds no secret at all, however short."""
        assert inline_secrets(value) == []
        assert withheld({"TOOL_ARGS": value}) == []

    @pytest.mark.parametrize(("value", "secrets"), [
        ("gcc $(mysql_config --cflags) -pedantic-errors -o x x.c", []), ("pytest -k mongo -p pytest_randomly", []),
        ("cc `mariadb_config --libs` -pedantic-errors x.c", []), ("$(mysql --version) -pedantic-errors", []),
        ("time pytest -k mongo -p pytest_randomly", []), ("grep -r mysql src -ptest_things", []),
        ("ls; which redis-cli -a Str0ng-Passw0rd", []), ("git log --grep mysql -pStr0ng-Passw0rd", []),
        ('mysql -e "select now()" -pSECRET0', ["SECRET0"]), ("echo x; mysql -pSECRET1 db", ["SECRET1"]),
        ("(mysql -u r -pSECRET2)", ["SECRET2"]), ('$(mysql -pSECRET3 -e "select now()")', ["SECRET3"]),
        ("sudo -u me mysql -pSECRET4", ["SECRET4"]), ("FOO=1 redis-cli -a SECRET5", ["SECRET5"]),
        ("docker exec -i db mysql -uroot -pSECRET6 shop", ["SECRET6"]),
        ("sudo timeout 30 env A=1 mongosh -p SECRET7", ["SECRET7"]),
        ("mysql --host=$(hostname) -pSECRET8", ["SECRET8"]), ("cat dump.sql | mysqldump -pSECRET9 shop", ["SECRET9"]),
        ("sudo -u mysql mysql -pSECRET10", ["SECRET10"]),
    ], ids=["mysql-config-then-gcc-option", "pytest-k-mongo-p", "mariadb-config-in-backticks", "option-after-the-paren",
            "runner-then-pytest", "grep-mysql", "which-redis-cli", "git-grep-mysql", "paren-in-quotes", "after-semicolon",
            "subshell", "command-substitution", "sudo-user", "variable-before", "docker-exec", "runners-nested",
            "substitution-in-a-word", "after-a-pipe", "user-named-as-the-tool"])
    def test_a_tools_option_counts_only_on_the_command_its_name_begins(self, value: str, secrets: list[str]) -> None:
        """A tool's password option is read only on the command its name begins, up to where that command ends: a name that
        is a text command's argument (`pytest -k`, grep, git, which), a word that only begins with one (`mysql_config`) or an
        option after the `)` that ends its command holds none, while `;`, `(`, `$(`, `|`, a variable set for it and `sudo`,
        `timeout`, `env` or `docker exec` before it still begin it."""
        assert inline_secrets(value) == secrets

    def test_a_password_of_digits_longer_than_a_port_is_read(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A mongo or mysql password of digits only is read once it has more than a port's 5 digits (withheld and redacted from
        8 on, as any secret), while 5 digits or fewer after `-p` read as a port."""
        for written in ("mongosh -u app -p {} shop", "mysql -u root -p{} shop"):
            value = written.format("73920184")
            monkeypatch.setenv("DB_CMD", value)
            assert withheld({"DB_CMD": value}) == ["DB_CMD"]
            assert Redactor.for_night()(value) == written.format(REDACTED)
        assert inline_secrets("mongosh -u app -p 123456 db") == ["123456"]
        assert inline_secrets("mongosh -u app -p 27017 db") == []

    def test_what_a_morning_reader_needs_stays_readable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With secrets in options, a cookie header and a mysql login among the environment, a diff, git's and pytest's output
        keep every word but the secrets' own values."""
        monkeypatch.setenv("DEPLOY_ARGS", f"--password={self.PASSWORD} --api-key ak_0123456789abcdef")
        monkeypatch.setenv("HEADERS", "Cookie: sessionid=s3ss10n-0123456789")
        monkeypatch.setenv("MYSQL_CMD", "mysql -u app -pMy5ql-Passw0rd app_db")
        text = (
            "diff --git a/app/auth.py b/app/auth.py\n"
            '-    password = request.form["password"]\n+    password = request.form.get("password", "")\n'
            " def set_password(self, pw):\n"
            "abc1234 (HEAD -> main) auth: --password-file for the token_count=5 tests\n"
            "tests/test_auth.py::test_password_reset_sends_mail PASSED\n"
            "FAILED tests/test_auth.py::test_token_expires - AssertionError: Cookie: <redacted>\n"
            f"deploy --password={self.PASSWORD} --api-key ak_0123456789abcdef\n< Set-Cookie: sessionid=s3ss10n-0123456789; Path=/\n"
            "mysql -u app -pMy5ql-Passw0rd app_db\n"
        )
        redacted = Redactor.for_night()(text)
        secrets_lines = "deploy --password=*** --api-key ***\n< Set-Cookie: sessionid=***; Path=/\nmysql -u app -p*** app_db\n"
        assert redacted == text.split("deploy --password=")[0] + secrets_lines

    def test_a_netrc_files_passwords_are_redacted(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The passwords of the .netrc that `$NETRC` names (else ~/.netrc), which the agent's commands can print, read ***;
        its machines and logins as they are; none (no such file, or a folder) redacts nothing."""
        netrc = tmp_path / "netrc"
        netrc.write_text("machine git.example.com\n  login bob\n  password Netrc-Passw0rd-1\ndefault login anon password Anon-Passw0rd-2\n")
        monkeypatch.setenv("NETRC", str(netrc))
        shown = "machine git.example.com\n  login bob\n  password ***\ndefault login anon password ***\n"
        assert Redactor.for_night()(netrc.read_text()) == shown
        monkeypatch.delenv("NETRC")
        monkeypatch.setenv("HOME", str(tmp_path))
        (tmp_path / ".netrc").write_text("machine h login u password Home-Netrc-Passw0rd\n")
        assert Redactor.for_night()("Home-Netrc-Passw0rd") == REDACTED
        for nothing_there in (tmp_path / "missing", tmp_path):
            monkeypatch.setenv("NETRC", str(nothing_there))
            assert Redactor.for_night()("Home-Netrc-Passw0rd") == "Home-Netrc-Passw0rd"

    def test_a_netrc_quoted_password_is_redacted_as_read(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A .netrc password in quotes, with spaces and an escaped quote, reads *** both as the file writes it and as curl
        reads it (escapes undone), not only up to its first space."""
        netrc = tmp_path / "netrc"
        netrc.write_text('machine h login "bob smith" password "correct horse \\"staple\\" 94"\n')
        monkeypatch.setenv("NETRC", str(netrc))
        redact = Redactor.for_night()
        assert redact(netrc.read_text()) == 'machine h login "bob smith" password "***"\n'
        assert redact('curl: using password correct horse "staple" 94') == "curl: using password ***"

    def test_a_netrc_that_is_no_regular_file_is_not_waited_on(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A .netrc that is a pipe no one writes into (whose open() waits for a writer) or a device is skipped at once: the
        night's Redactor is built, with the other secrets, instead of waiting for ever."""
        fifo = tmp_path / "netrc"
        os.mkfifo(fifo)
        monkeypatch.setenv("DEPLOY_TOKEN", "tok-0123456789abcdef")
        for netrc in (fifo, Path("/dev/zero")):
            monkeypatch.setenv("NETRC", str(netrc))
            built: list[Redactor] = []
            reading = threading.Thread(target=lambda: built.append(Redactor.for_night()), daemon=True)
            reading.start()
            reading.join(timeout=5)
            waited = reading.is_alive()
            if waited:  # let the open() that waits for a writer return, so the thread ends
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                reading.join(timeout=5)
            assert not waited, netrc
            assert built[0]("tok-0123456789abcdef") == REDACTED

    def test_long_runs_of_near_misses_are_read_in_linear_time(self) -> None:
        """200 kB runs of what starts an option (after dashes or a `/`), a mysql login, a database client's `--password`, a
        cookie, a .netrc entry (quoted values too) and a quoted setting, none holding a secret, are read in well under a second;
        1 MB runs of a tool's option that takes a password (attached, after sshpass's prompt, a port after it), of a tool's name
        after `=`, of `=` (each a command's start), of commands and substitutions, of a tool's name that a text command takes
        or whose command ends before its option, and a 1 MB path after 32 names or runners, each; and 1 MB of one text command,
        of quoted arguments and quoted command lines, of ssh destinations, wrappers, parentheses and quotes, of comments,
        `$'...'`, escaped quotes and substitutions in quotes, each."""
        env = {
            "OPTIONS": "--password --token " * 10000, "MYSQL": "mysql " + "/mysql -u " * 20000 + "-p", "COOKIES": "Cookie: a " * 20000,
            "NETRC": "machine x " + "login machine " * 14000 + "password", "QUOTED": 'env="' * 40000, "URLS": "https://u: " * 20000,
            "NETRC_QUOTES": 'machine "' * 20000 + "password", "SLASH_OPTIONS": "/a:" * 60000,
            "PROMPTS": "psql --password db;" * 10000, "INCLUDES": "-I/usr/include/mysql " * 10000 + "-p",
            "CURL": "curl -u " * 25000 + "-b", "CURL_QUOTES": "curl -u '" * 20000, "SSHPASS": "sshpass -f " * 20000,
            "KEYTOOLS": "keytool -storepass:env " * 10000, "MONGO": "/mongo -p " * 20000, "SQLCMD": "sqlcmd -P -" * 20000,
            "APACHE_LOGINS": "htpasswd -b -C 10 " * 12000, "COOKIE_QUOTES": ('Cookie: a="' + 'b' * 300 + ' ') * 600,
        }
        started = time.process_time()  # this process's CPU: a shared machine's other load does not count
        assert withheld(env) == []
        assert time.process_time() - started < 3.0  # ~0.6 s; a quadratic read of any of them takes minutes
        tools = {
            "MONGO_ATTACHED": "mongosh -p" * 100000, "MONGO": "mongosh -p " * 100000, "MONGO_PORTS": 'mongo -p "1:2" ' * 70000,
            "MONGO_DIGITS": "mongo -p 123456 " * 60000, "REDIS_ATTACHED": "redis-cli -a;" * 80000,
            "REDIS": "redis-cli -a -x " * 60000, "SSHPASS_PROMPTS": "sshpass -P x " * 80000,
            "SSHPASS_PROMPT_WORDS": "sshpass -P " * 100000, "SQL_TOOLS": "bcp -P - osql -P - " * 50000,
            "MYSQL_PORTS": "mysql -p3306:3306 " * 60000, "MYSQL_PLUGINS": "mysql -pno:" * 100000,
            "NAMES_AFTER_EQUALS": "=curl " * 160000 + "-u", "PATH_AFTER_NAMES": "x=curl " * 32 + "/a" * 500000 + " -u",
            "PATH_AFTER_RUNNERS": "x=sudo " * 32 + "/a" * 500000 + " mysql -p", "VARIABLES": "=a" * 500000 + " mysql -p",
            "SUBSTITUTIONS": "$(mysql -e " * 90000, "COMMANDS": "; sudo -u me mysql -u a" * 45000,
            "TEXT_COMMANDS": "; pytest -k mongo -p plugin" * 40000, "ENDED_COMMANDS": "$(mysql -e x) -pedantic " * 42000,
            "ONE_TEXT_COMMAND": "pytest -k mongo -p plugin " * 40000, "QUOTED_ARGUMENTS": 'pytest -k "mongo or x" -p plugin ' * 30000,
            "QUOTED_COMMANDS": "sh -c 'sh -c \"pytest -k mongo -p plugin\"' " * 23000, "DESTINATIONS": "ssh mongo -p 2222 " * 55000,
            "WRAPPERS": "sudo -u me " * 90000 + "pytest -k mongo -p plugin", "PARENTHESES": "(" * 1000000 + "pytest -k mongo -p plugin",
            "QUOTES": "\"'" * 500000 + " pytest -k mongo -p plugin", "UNCLOSED_QUOTES": 'pytest -k mongo -p plugin "' * 38000,
            "COMMENTS": "pytest -k mongo -p plugin # it's\n" * 30000, "HASHES": "pytest -k mongo -p plugin #x " * 34000,
            "ANSI_C_QUOTES": "pytest -k $'mongo\\' -p plugin ' " * 30000, "DOLLAR_QUOTES": "$'" * 500000 + " mongo -p plugin",
            "ESCAPED_QUOTES": 'sh -c "pytest -k \\"mongo or x\\" -p plugin" ' * 23000,
            "SUBSTITUTIONS_IN_QUOTES": 'pytest -k "$(echo "mongo or x")" -p plugin ' * 23000,
        }
        took = {}
        for name, value in tools.items():  # 1 MB each
            started = time.process_time()
            assert withheld({name: value}) == [], name
            took[name] = time.process_time() - started
        # 0.1 to 0.75 s each and a median of 0.25 s on a quiet hour (0.35 s and up to 1.05 s on a slower one); 1.4 to
        # 1.7 s if 32 names read the path, minutes if quadratic. Against the median, a slower machine does not count.
        bound = max(1.0, 4 * statistics.median(took.values()))
        assert {name: seconds for name, seconds in took.items() if seconds >= bound} == {}, (bound, took)


class TestFileToolsRedactBeforeTheyCut:
    SECRET = "sk-LEAKY-0123456789abcdefghij"

    def _leaves_a_part(self, output: str) -> bool:
        return self.SECRET[:12] in output or self.SECRET[-12:] in output

    def test_search_redacts_a_long_line_before_cutting_it(self, tmp_path: Path) -> None:
        """A secret across the 200th character of a long matching line (minified JSON): search shows no part of it."""
        toolbox = Toolbox(tmp_path, ("search",), check_command="true", redact=Redactor([self.SECRET]))
        leaky = []
        for pad in range(140, 176, 2):  # the key begins 24 characters after the pad
            (tmp_path / "settings.json").write_text('{"name": "' + "a" * pad + f'", "apiKey": "{self.SECRET}"}}\n')
            found = toolbox.execute(ToolCall("search", {"pattern": "apiKey", "path": "."}))
            assert found.ok and "settings.json:1:" in found.output
            leaky += [pad] if self._leaves_a_part(found.output) else []
        assert leaky == []

    def test_read_file_redacts_a_line_longer_than_the_cap_before_cutting_it(self, tmp_path: Path) -> None:
        """One line past the output cap, with a secret where the cap cuts it: read_file, whole or by lines, shows no part of it."""
        toolbox = Toolbox(tmp_path, ("read_file",), check_command="true", redact=Redactor([self.SECRET]), max_output_chars=2000)
        leaky = []
        for pad in range(1700, 1820, 2):
            (tmp_path / "data.txt").write_text("a" * pad + self.SECRET + "b" * 3000 + "\nend\n")
            for arguments in ({"path": "data.txt"}, {"path": "data.txt", "start_line": 1, "end_line": 2}):
                read = toolbox.execute(ToolCall("read_file", arguments))
                assert read.ok
                leaky += [(pad, len(arguments))] if self._leaves_a_part(read.output) else []
        assert leaky == []


def json_events(err: str, event: str) -> list[dict]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{") and f'"{event}"' in line]


class TestPassedSecretsStayOffTheBranch:
    """A check given `pass_env` that writes a passed value into the worktree (a .env, a log, a cache) gets no such
    file committed on the task's branch, which a person pushes in the morning."""

    PASSWORD = "Db-Pass-0123456789xyz"
    # The check writes the password into a new text file and a new binary one, then checks greet().
    LEAKY_CHECK = (
        'printf "DB_PASSWORD=%s\\n" "$DB_PASSWORD" > .env.test && printf "\\000\\001%s\\000" "$DB_PASSWORD" > cache.bin '
        "&& python check_greet.py"
    )
    TOOLS = ["run_command", "run_check", "edit_file", "write_file", "submit"]
    FIX = call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"})

    @pytest.fixture(autouse=True)
    def password_in_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DB_PASSWORD", self.PASSWORD)

    def night(self, config_file, server, capsys, *answers, check: str = LEAKY_CHECK, pass_env: tuple[str, ...] = ("DB_PASSWORD",)):
        task = {"name": "fix-greet", "prompt": "fix greet", "check": check, "tools": self.TOOLS}
        if pass_env:
            task["pass_env"] = list(pass_env)
        config = config_file(tasks=[task], night={"max_iterations": 1, "max_turns": 8})
        server.enqueue(*answers)
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        return config, capsys.readouterr().err

    def test_the_files_holding_the_value_are_left_out_and_the_agents_change_is_committed(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The branch has the agent's fix but neither file the check wrote the password into, nor the value anywhere."""
        config, err = self.night(config_file, server, capsys, self.FIX, call("submit", {"summary": "fixed"}))
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        files = git(repo, "ls-tree", "-r", "--name-only", "overnight/fix-greet").split()
        assert ".env.test" not in files and "cache.bin" not in files
        assert self.PASSWORD not in git(repo, "log", "-p", "--all")
        tree = config.parent / "state" / "worktrees" / "fix-greet"
        assert not (tree / ".env.test").exists() and not (tree / "cache.bin").exists()  # no later keep commits them
        [kept] = json_events(err, "secret_kept_out_of_commit")
        assert (kept["task"], kept["paths"], kept["names"]) == ("fix-greet", [".env.test", "cache.bin"], ["DB_PASSWORD"])
        assert self.PASSWORD not in err

    def test_a_changed_file_gets_its_checkpoint_content_back(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A tracked log the check appends the password to is committed as the checkpoint had it."""
        (repo / "check.log").write_text("earlier runs\n")
        git(repo, "add", "check.log")
        git(repo, "commit", "-q", "-m", "a log")
        check = 'echo "connected with $DB_PASSWORD" >> check.log && python check_greet.py'
        self.night(config_file, server, capsys, self.FIX, call("submit", {"summary": "fixed"}), check=check)
        assert git(repo, "show", "overnight/fix-greet:check.log") == "earlier runs"
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_a_project_file_that_held_the_value_already_is_committed_with_the_agents_edit(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A settings file with the project's own default password, edited by the agent, is no leak: it is committed."""
        (repo / "settings.py").write_text(f'PASSWORD = "{self.PASSWORD}"\n')
        git(repo, "add", "settings.py")
        git(repo, "commit", "-q", "-m", "settings")
        edit = call("edit_file", {"path": "settings.py", "old": "PASSWORD =", "new": "TIMEOUT = 5\nPASSWORD ="})
        _, err = self.night(config_file, server, capsys, self.FIX, edit, call("submit", {"summary": "fixed"}), check="python check_greet.py")
        assert git(repo, "show", "overnight/fix-greet:settings.py") == f'TIMEOUT = 5\nPASSWORD = "{self.PASSWORD}"'
        assert json_events(err, "secret_kept_out_of_commit") == []

    def test_a_task_without_pass_env_commits_as_before(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Without pass_env nothing is looked for: a file holding a value equal to a secret variable's is committed."""
        write = call("write_file", {"path": "fixture.txt", "content": f"{self.PASSWORD}\n"})
        _, err = self.night(config_file, server, capsys, self.FIX, write, call("submit", {"summary": "fixed"}), check="python check_greet.py", pass_env=())
        assert git(repo, "show", "overnight/fix-greet:fixture.txt") == self.PASSWORD
        assert json_events(err, "secret_kept_out_of_commit") == []

    def test_nothing_left_to_commit_is_a_pass_with_no_commit(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The check passes on the checkpoint and its file is put back: the iteration commits nothing, as an unchanged worktree does."""
        config, _ = self.night(config_file, server, capsys, call("submit", {"summary": "nothing to do"}), check='echo "$DB_PASSWORD" > out.txt')
        assert git(repo, "rev-parse", "overnight/fix-greet") == git(repo, "rev-parse", "main")
        [iteration] = report_json(config, capsys)["tasks"][0]["iterations"]
        assert iteration["outcome"] == "committed" and iteration["commit"] in ("", None)

    def test_the_agents_own_commit_of_the_file_is_folded_away(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The agent commits what its own run_check wrote: the branch's history holds the value nowhere, the fix it does."""
        commit = call("run_command", {"command": "git add -A && git commit -q -m wip"})
        self.night(config_file, server, capsys, self.FIX, call("run_check", {}), commit, call("submit", {"summary": "fixed"}))
        assert self.PASSWORD not in git(repo, "log", "-p", "--all")
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_the_folded_commits_subjects_stay_in_the_commits_message(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The agent's commits folded away for the value they held are listed by subject in the iteration's commit, the
        value as ***: the morning's `git log` still says what they did."""
        commits = call("run_command", {"command": "git add -A && git commit -q -m 'wip: fix greet' && echo x > notes.txt && git add notes.txt && git commit -q -m \"$(cat .env.test)\""})
        self.night(config_file, server, capsys, self.FIX, call("run_check", {}), commits, call("submit", {"summary": "fixed"}))
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        assert message.splitlines()[0] == "overnight: fix-greet iteration 1"
        assert message.splitlines()[-2:] == ["- wip: fix greet", "- DB_PASSWORD=***"]
        assert self.PASSWORD not in git(repo, "log", "-p", "--all")

    def test_a_file_moved_into_a_folder_named_after_the_value_stays_where_it_was(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`git mv config.py $VALUE/config.py`: the new path is left out and the old one put back, so the branch keeps config.py."""
        (repo / "config.py").write_text("DEBUG = False\n")
        git(repo, "add", "config.py")
        git(repo, "commit", "-q", "-m", "config")
        move = call("run_command", {"command": 'd=$(sed s/DB_PASSWORD=// .env.test) && mkdir "$d" && git mv config.py "$d/config.py"'})
        _, err = self.night(config_file, server, capsys, self.FIX, call("run_check", {}), move, call("submit", {"summary": "fixed"}))
        assert git(repo, "show", "overnight/fix-greet:config.py") == "DEBUG = False"
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert self.PASSWORD not in git(repo, "log", "-p", "--name-only", "--all")
        [kept] = json_events(err, "secret_kept_out_of_commit")
        assert kept["paths"] == [".env.test", "***/config.py", "cache.bin"]

    def test_a_file_put_back_keeps_what_the_agents_own_commit_changed_in_it(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The check appends the password to a log the agent edited and committed: the branch has the agent's version."""
        (repo / "check.log").write_text("earlier runs\n")
        git(repo, "add", "check.log")
        git(repo, "commit", "-q", "-m", "a log")
        check = 'echo "connected with $DB_PASSWORD" >> check.log && python check_greet.py'
        commit = call("run_command", {"command": "echo 'cleared by the agent' > check.log && git commit -q -am 'clear the log'"})
        self.night(config_file, server, capsys, self.FIX, commit, call("submit", {"summary": "fixed"}), check=check)
        assert git(repo, "show", "overnight/fix-greet:check.log") == "cleared by the agent"
        assert self.PASSWORD not in git(repo, "log", "-p", "--all")

    def test_a_new_file_named_after_the_value_is_left_out(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file whose name holds the value (a cache keyed by the password) stays off the branch even when it is empty."""
        check = 'mkdir -p cache && touch "cache/$DB_PASSWORD.stamp" && python check_greet.py'
        _, err = self.night(config_file, server, capsys, self.FIX, call("submit", {"summary": "fixed"}), check=check)
        assert self.PASSWORD not in git(repo, "log", "-p", "--name-only", "--all")
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        [kept] = json_events(err, "secret_kept_out_of_commit")
        assert (kept["paths"], kept["names"]) == (["cache/***.stamp"], ["DB_PASSWORD"])

    def test_the_event_shows_a_path_holding_the_value_as_stars(self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file named after the password and holding it is logged with *** for the value: the log never carries it."""
        check = 'echo "$DB_PASSWORD" > "token-$DB_PASSWORD.txt" && python check_greet.py'
        _, err = self.night(config_file, server, capsys, self.FIX, call("submit", {"summary": "fixed"}), check=check)
        [kept] = json_events(err, "secret_kept_out_of_commit")
        assert kept["paths"] == ["token-***.txt"]
        assert self.PASSWORD not in err

    def test_a_value_split_by_a_chunk_edge_is_found_and_short_ones_are_not_looked_for(self) -> None:
        """The redaction's rules decide what is looked for; a value across two reads of a large file is still found."""
        from orchestrator.passed_secrets import passed_secrets

        secrets = passed_secrets(["DB_PASSWORD", "PIN_PASSWORD", "HOME"], {"DB_PASSWORD": self.PASSWORD, "PIN_PASSWORD": "1234", "HOME": "/home/someone"})
        assert set(secrets.names_by_value) == {self.PASSWORD.encode()}
        assert secrets.found_in([b"x" * 10 + self.PASSWORD[:5].encode(), self.PASSWORD[5:].encode()]) == {self.PASSWORD.encode()}
        assert not passed_secrets([], {"DB_PASSWORD": self.PASSWORD})

    def test_a_value_as_a_json_encoder_escapes_it_is_found_and_named(self) -> None:
        """A passed value written into a file as PHP's json_encode or .NET's encoder escapes it is found, and reported by its
        variable's name."""
        from orchestrator.passed_secrets import passed_secrets

        secrets = passed_secrets(["DB_PASSWORD"], {"DB_PASSWORD": "Zm9v/YmFy+cXV4PQ=="})
        for written in (rb'{"password": "Zm9v\/YmFy+cXV4PQ=="}', rb'{"password": "Zm9v/YmFy\u002BcXV4PQ=="}'):
            found = secrets.found_in([written])
            assert found and secrets.names(found) == ("DB_PASSWORD",), written

    def test_a_value_percent_encoded_or_as_bytes_repr_is_found_and_named(self) -> None:
        """A passed value written into a file percent-encoded (a URL), as repr() of its bytes or as ascii() writes it is found,
        and reported by its variable's name."""
        from orchestrator.passed_secrets import passed_secrets

        value = "Zm9v/YmFy+cXV4PQ==-\u00e9"
        secrets = passed_secrets(["DB_PASSWORD"], {"DB_PASSWORD": value})
        for written in (quote(value, safe=""), quote(value), quote_plus(value), repr(value.encode()), ascii(value)):
            found = secrets.found_in([f"DATABASE_URL=postgres://app:{written}@db/app\n".encode()])
            assert found and secrets.names(found) == ("DB_PASSWORD",), written

    def test_a_file_holding_the_value_percent_encoded_in_a_url_is_left_out(
        self, config_file, server, repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The check writes a URL with a base64 password percent-encoded (`/`, `+`, `=` as %2F...) into a file: it stays off the branch."""
        monkeypatch.setenv("DB_PASSWORD", "Zm9v/YmFy+cXV4PQ==")
        url = "print('postgresql://app:' + urllib.parse.quote(os.environ['DB_PASSWORD'], safe='') + '@db/app')"
        check = f'python -c "import os, urllib.parse; {url}" > .env.url && python check_greet.py'
        _, err = self.night(config_file, server, capsys, self.FIX, call("submit", {"summary": "fixed"}), check=check)
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert "Zm9v%2FYmFy" not in git(repo, "log", "-p", "--all")
        [kept] = json_events(err, "secret_kept_out_of_commit")
        assert (kept["paths"], kept["names"]) == ([".env.url"], ["DB_PASSWORD"])


def overnight_process(config: Path, *args: str, env: dict[str, str] | None = None, python_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`overnight run` as cron starts it, a process of its own, with `env` added to this one's and `python_path` first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(python_path) if python_path else "", os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), *args],
        env={**os.environ, **(env or {}), "PYTHONPATH": path}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )


class TestTheModelsOwnWordsKeepSecretsOut:
    """A secret value the model writes itself (the task's prompt quoted it, or it guessed one) is kept out of the records, not
    out of the tools."""

    TOKEN = "s3cr3t-value-123"
    ENV = {"OVERNIGHT_TEST_TOKEN": TOKEN}

    def test_its_calls_text_and_summary_show_stars_in_transcripts_store_notes_logs_and_the_commit(
        self, config_file, server, repo: Path, tmp_path: Path
    ) -> None:
        """A tool named after the value (iteration 1), then an answer quoting it in its text, its reasoning, a call's arguments,
        a broken call and the summary (iteration 2): every record shows ***, while write_file got the real value."""
        from orchestrator.scripted import Reply

        config = config_file(
            tasks=[{"name": "fix-greet", "prompt": f"greet() should return 'hello'. The deploy token is {self.TOKEN}.",
                    "check": "python check_greet.py", "tools": ["write_file", "edit_file", "read_file", "submit"]}],
            night={"max_iterations": 2, "max_turns": 8},
        )
        server.enqueue(
            call(self.TOKEN, {"path": "."}), call(self.TOKEN, {"path": "."}),  # unknown_tool: the note's correction names it
            Reply(text=f"I keep {self.TOKEN} in a file", reasoning=f"the token is {self.TOKEN}"),
            call("write_file", {"path": "token.txt", "content": self.TOKEN}),
            call("read_file", '{"path": "' + self.TOKEN + '"'),  # cut short: the broken call's note quotes its text
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": f"fixed greet; the token {self.TOKEN} is in token.txt"}),
        )
        done = overnight_process(config, "--log-format", "json", "--verbose", env=self.ENV)
        assert done.returncode == 0, done.stderr
        assert git(repo, "show", "overnight/fix-greet:token.txt") == self.TOKEN  # the tool got the real arguments
        transcripts = [path.read_text() for path in sorted((tmp_path / "state" / "transcripts").iterdir())]
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        written = written_down(config, done.stdout + done.stderr) + transcripts + [message]
        assert [text for text in written if self.TOKEN in text] == []
        assert "the token *** is in token.txt" in message and "no tool named '***'" in notes_text(config)
        assert '"content": "***"' in transcripts[-1] and "the token is ***" in transcripts[-1]


    def test_a_value_that_json_escapes_shows_stars_in_the_calls_json_text(self, config_file, server, repo: Path, tmp_path: Path) -> None:
        """A secret value holding `"`, `\\` and a non-ASCII letter, which a call's arguments hold escaped (the server's JSON text
        with ensure_ascii, the assistant message's without), is kept out of the transcript and the store too."""
        token = 's3cr3t"qu0te\\back-\u00e9-123'
        config = config_file(
            tasks=[{"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py",
                    "tools": ["write_file", "edit_file", "submit"]}],
            night={"max_iterations": 1, "max_turns": 6},
        )
        server.enqueue(
            call("write_file", {"path": "token.txt", "content": token}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": f"fixed greet; the token {token} is in token.txt"}),
        )
        done = overnight_process(config, "--log-format", "json", "--verbose", env={"OVERNIGHT_TEST_TOKEN": token})
        assert done.returncode == 0, done.stderr
        assert git(repo, "show", "overnight/fix-greet:token.txt") == token  # the tool got the real arguments
        transcripts = [path.read_text() for path in sorted((tmp_path / "state" / "transcripts").iterdir())]
        written = written_down(config, done.stdout + done.stderr) + transcripts + [git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")]
        assert [text for text in written if "s3cr3t" in text] == []  # any form of the value, escaped once or twice, starts so
        assert '\\"content\\": \\"***\\"' in transcripts[-1] and '"content": "***"' in transcripts[-1]


class TestTracebacksKeepSecretsOut:
    """Python's own tracebacks, which overnight does not write itself, go through the redaction too."""

    TOKEN = "s3cr3t-value-123"
    ENV = {"OVERNIGHT_TEST_TOKEN": TOKEN}

    def test_a_bug_before_the_config_is_read_shows_the_environments_secrets_as_stars(self, config_file, tmp_path: Path) -> None:
        """A module that fails as it is imported (a broken install of structlog, imported before the config is read) quoting a
        secret: its traceback, exit 1, shows the environment's secret values as ***."""
        shadow = tmp_path / "shadow"
        shadow.mkdir()
        (shadow / "structlog.py").write_text("import os\nraise RuntimeError('broken install for ' + os.environ['OVERNIGHT_TEST_TOKEN'])\n")
        done = overnight_process(config_file(), env=self.ENV, python_path=shadow)
        assert done.returncode == 1, done.stderr
        traceback = done.stderr[done.stderr.find("Traceback (most recent call last):"):]
        assert traceback.startswith("Traceback") and "in run" in traceback, done.stderr
        assert traceback.rstrip().endswith("RuntimeError: broken install for ***"), done.stderr
        assert self.TOKEN not in done.stderr + done.stdout

    def test_a_bug_in_a_thread_that_is_no_task_shows_stars(self, config_file, server, repo: Path, tmp_path: Path) -> None:
        """An exception that ends a thread of the night's other than a task's (here one a user's guard starts) prints
        Python's `Exception in thread` traceback, the night's secret values as ***, and the night goes on."""
        (tmp_path / "threading_guard.py").write_text(
            "import os, threading\n"
            "def push():\n"
            "    raise RuntimeError('push to https://ci:' + os.environ['OVERNIGHT_TEST_TOKEN'] + '@git.example.com failed')\n"
            "class Pusher:\n"
            "    def after_tool_call(self, ctx, call, result):\n"
            "        thread = threading.Thread(target=push, name='pusher')\n"
            "        thread.start()\n"
            "        thread.join()\n"
        )
        config = config_file(guards={"custom": ["threading_guard:Pusher"]}, night={"max_iterations": 1})
        server.enqueue(call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"}))
        done = overnight_process(config, env=self.ENV, python_path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Exception in thread pusher:\nTraceback (most recent call last):" in done.stderr, done.stderr
        assert "RuntimeError: push to https://ci:***@git.example.com failed" in done.stderr, done.stderr
        assert self.TOKEN not in done.stderr + done.stdout

    def test_two_runs_in_one_process_ending_out_of_order_keep_the_hook_before(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Two runs' redactions of thread tracebacks that end in the order they began (two runs in one process, one
        outliving the other): while the second is in, a dying thread's traceback has its secret as ***; after both, the
        hook that was there before gets the thread's exception again."""
        from orchestrator.tracebacks import thread_tracebacks_redacted

        handed_on: list[BaseException] = []
        monkeypatch.setattr(threading, "excepthook", lambda hooked: handed_on.append(hooked.exc_value))
        first = thread_tracebacks_redacted(Redactor(["first-run-secret-111"]))
        second = thread_tracebacks_redacted(Redactor(["second-run-secret-222"]))
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        die_in_a_thread("second run's thread: second-run-secret-222")
        assert "RuntimeError: second run's thread: ***" in capsys.readouterr().err and handed_on == []
        second.__exit__(None, None, None)
        die_in_a_thread("a thread after both runs")
        assert [str(exception) for exception in handed_on] == ["a thread after both runs"]
        assert "Exception in thread" not in capsys.readouterr().err

    def test_a_hook_set_for_a_while_over_ours_gets_no_exception_once_its_setter_puts_ours_back(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With no run in, a dying thread's exception goes to the hook that was there before ours, not to one another
        set over ours for a while (a test's monkeypatch, with a run inside it) and took away again by putting ours back;
        nor does a hook set over ours that hands on to ours (as hooks do) loop back and forth with it."""
        from orchestrator.tracebacks import thread_tracebacks_redacted

        lasting: list[str] = []
        monkeypatch.setattr(threading, "excepthook", lambda hooked: lasting.append(str(hooked.exc_value)))
        with thread_tracebacks_redacted(Redactor(["first-run-secret-111"])):
            pass
        ours = threading.excepthook
        for_a_while: list[str] = []
        threading.excepthook = lambda hooked: for_a_while.append(str(hooked.exc_value))
        with thread_tracebacks_redacted(Redactor(["second-run-secret-222"])):
            pass
        threading.excepthook = ours  # its setter takes it away
        die_in_a_thread("once the one set for a while is gone")
        assert (lasting, for_a_while) == (["once the one set for a while is gone"], [])

        handing_on: list[str] = []

        def hands_on(hooked: Any) -> None:
            handing_on.append(str(hooked.exc_value))
            ours(hooked)

        threading.excepthook = hands_on
        with thread_tracebacks_redacted(Redactor(["third-run-secret-333"])):
            pass
        die_in_a_thread("through a hook that hands on")
        assert handing_on == ["through a hook that hands on"] and lasting[-1] == "through a hook that hands on" and len(lasting) == 2

    def test_the_hook_before_ours_gets_an_ended_runs_secrets_as_stars(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A thread that dies after a run's redaction ended, quoting its secret, reaches the hook that was there before ours
        with an exception of its type whose text, attributes and cause show the secret as ***; one that quotes no secret
        reaches it as it was raised."""
        from orchestrator.tracebacks import thread_tracebacks_redacted

        class PushFailed(Exception):
            def __init__(self, url: str, status: int) -> None:
                super().__init__(f"push to {url} failed with {status}")
                self.url = url

        secret = "ended-run-secret-" + "0123456789"  # joined: no traceback's source line quotes it
        raised: list[BaseException] = []

        def push(message: str) -> None:
            try:
                raise KeyError(message)
            except KeyError as exc:
                raised.append(PushFailed(f"https://ci:{message}@git.example", 403))
                raise raised[-1] from exc

        handed_on: list[Any] = []
        monkeypatch.setattr(threading, "excepthook", handed_on.append)
        with thread_tracebacks_redacted(Redactor([secret])):
            pass
        for message in (secret, "no secret here"):
            thread = threading.Thread(target=push, args=(message,))
            thread.start()
            thread.join()
        late, plain = handed_on
        printed = "".join(format_exception(late.exc_type, late.exc_value, late.exc_traceback))
        assert "PushFailed: push to https://ci:***@git.example failed with 403" in printed and "KeyError: '***'" in printed, printed
        assert secret not in printed + repr(late.exc_value.args) and late.exc_value.url == "https://ci:***@git.example"
        assert isinstance(late.exc_value, PushFailed) and late.exc_type is PushFailed and late.exc_traceback is not None
        assert plain.exc_value is raised[-1] and str(plain.exc_value.__cause__) == "'no secret here'"

    def test_a_secret_in_a_source_line_is_printed_by_ours_not_handed_on(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A late thread whose traceback quotes an ended run's secret in a source line, which the hook before ours would read
        from the file itself, is printed by ours with the secret as *** and not handed on."""
        from orchestrator.tracebacks import thread_tracebacks_redacted

        def die() -> None:
            raise RuntimeError("source-line-secret-0123456789")

        handed_on: list[Any] = []
        monkeypatch.setattr(threading, "excepthook", handed_on.append)
        with thread_tracebacks_redacted(Redactor(["source-line-secret-0123456789"])):
            pass
        thread = threading.Thread(target=die, name="late")
        thread.start()
        thread.join()
        printed = capsys.readouterr().err
        assert handed_on == [] and "Exception in thread late:" in printed and 'raise RuntimeError("***")' in printed, printed
        assert "source-line-secret" not in printed

    def test_a_secret_the_exceptions_text_does_not_print_is_not_handed_on(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A late thread's exception that holds an ended run's secret only in an attribute or argument its text does not quote
        (a JSONDecodeError's document, a TimeoutExpired's output bytes) reaches the hook before ours with it as ***, or, where
        no exception like it can hold it so, is printed by ours: that hook never gets the secret."""
        from orchestrator.tracebacks import thread_tracebacks_redacted

        secret = "unprinted-secret-" + "0123456789"  # joined: no traceback's source line quotes it
        raised = [
            json.JSONDecodeError("Expecting value", f'{{"token": {secret}}}', 10),
            subprocess.TimeoutExpired(["git"], 3, secret.encode()),
        ]
        handed_on: list[Any] = []
        monkeypatch.setattr(threading, "excepthook", handed_on.append)
        with thread_tracebacks_redacted(Redactor([secret])):
            pass

        def die(exception: Exception) -> None:
            raise exception

        for exception in raised:
            thread = threading.Thread(target=die, args=(exception,), name="late")
            thread.start()
            thread.join()
        [decode_error] = handed_on
        assert isinstance(decode_error.exc_value, json.JSONDecodeError) and decode_error.exc_value.doc == '{"token": ***}'
        assert secret not in repr(vars(decode_error.exc_value)) + repr(decode_error.exc_value.args)
        printed = capsys.readouterr().err
        assert "TimeoutExpired: Command '['git']' timed out after 3 seconds" in printed and secret not in printed, printed

    def test_a_thread_that_dies_after_entry_has_returned_shows_stars(self) -> None:
        """A thread that outlives `entry` (joined at the interpreter's exit) and dies then quoting a secret value prints its
        `Exception in thread` traceback with the value as ***."""
        script = (
            "import os, sys, threading\n"
            "from orchestrator.cli import entry\n"
            "entry_returned = threading.Event()\n"
            "def late():\n"
            "    entry_returned.wait()\n"
            "    raise RuntimeError('late thread with ' + os.environ['OVERNIGHT_TEST_TOKEN'])\n"
            "threading.Thread(target=late, name='late').start()\n"
            "sys.argv = ['overnight', '--help']\n"
            "try:\n"
            "    entry()\n"
            "finally:\n"
            "    entry_returned.set()\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], env={**os.environ, **self.ENV}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "Exception in thread late:" in done.stderr and "RuntimeError: late thread with ***" in done.stderr, done.stderr
        assert self.TOKEN not in done.stderr + done.stdout

    def test_a_thread_that_dies_after_entry_has_returned_shows_the_configs_secret_as_stars(
        self, config_file, server, repo: Path, tmp_path: Path
    ) -> None:
        """A thread a user's guard started that dies once `overnight run` has returned (joined as the interpreter exits),
        quoting `[model] api_key`, a secret the environment does not hold: its traceback shows it as ***."""
        api_key = "sk-config-only-0123456789"
        (tmp_path / "late_guard.py").write_text(
            "import threading, time\n"
            "def push_later():\n"
            "    while threading.main_thread().is_alive():  # until the interpreter exits, after entry returned\n"
            "        time.sleep(0.02)\n"
            f"    raise RuntimeError('late push with {api_key}')\n"
            "class Late:\n"
            "    started = False\n"
            "    def after_tool_call(self, ctx, call, result):\n"
            "        if not Late.started:\n"
            "            Late.started = True\n"
            "            threading.Thread(target=push_later, name='late-pusher').start()\n"
        )
        config = config_file(model={"api_key": api_key}, guards={"custom": ["late_guard:Late"]}, night={"max_iterations": 1})
        server.enqueue(call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"}))
        done = overnight_process(config, python_path=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Exception in thread late-pusher:" in done.stderr and "RuntimeError: late push with ***" in done.stderr, done.stderr
        assert api_key not in done.stderr + done.stdout

    def test_a_thread_that_dies_after_a_runs_redaction_ended_under_pythons_own_hook_shows_stars(self) -> None:
        """In a process with no redaction registered for its life (a caller that runs a night without `entry`), a thread that
        dies after a night's redaction ended quoting its secret prints Python's own traceback with the secret as ***."""
        done = _a_late_thread(
            "from orchestrator.tracebacks import thread_tracebacks_redacted\n"
            "with thread_tracebacks_redacted(Redactor(['night-secret-0123456789'])):\n"
            "    pass\n",
            message="'late thread with night-secret-0123456789'",
        )
        assert done.returncode == 0, done.stderr
        assert "Exception in thread late:" in done.stderr and "RuntimeError: late thread with ***" in done.stderr, done.stderr
        assert "night-secret" not in done.stderr

    def test_the_values_kept_after_their_runs_are_bounded_the_oldest_forgotten_first(self) -> None:
        """Past 1 MiB of values kept from runs that ended (three runs' 400 kB secrets), the oldest run's is no longer
        redacted in a later thread's traceback, the latest ones still are."""
        done = _a_late_thread(
            "from orchestrator.tracebacks import thread_tracebacks_redacted\n"
            "secrets = [f'night{number}-' + 'x' * 400_000 for number in range(3)]\n"
            "for secret in secrets:\n"
            "    with thread_tracebacks_redacted(Redactor([secret])):\n"
            "        pass\n",
            message="' '.join(secrets)",
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "RuntimeError: night0-xxx" in done.stderr and done.stderr.rstrip().endswith("xxx *** ***"), done.stderr[-2000:]

    def test_a_kept_secret_holding_a_registered_one_is_replaced_whole(self) -> None:
        """A secret kept from a run that ended, holding a value of a redaction still registered (the environment's, kept by
        `entry`), is replaced whole in a later thread's traceback, no part of it left around a ***."""
        done = _a_late_thread(
            "from orchestrator.tracebacks import keep_thread_tracebacks_redacted, thread_tracebacks_redacted\n"
            "keep_thread_tracebacks_redacted(Redactor(['inner-secret-0123']))\n"
            "with thread_tracebacks_redacted(Redactor(['outer-inner-secret-0123-tail'])):\n"
            "    pass\n",
            message="'late thread with outer-inner-secret-0123-tail'",
        )
        assert done.returncode == 0, done.stderr
        assert "RuntimeError: late thread with ***\n" in done.stderr and "outer" not in done.stderr, done.stderr


def die_in_a_thread(message: str) -> None:
    """A thread that ends with RuntimeError(`message`), started and joined."""

    def die() -> None:
        raise RuntimeError(message)

    thread = threading.Thread(target=die)
    thread.start()
    thread.join()


def _a_late_thread(*setup: str, message: str) -> subprocess.CompletedProcess[str]:
    """A Python process that runs `setup` (lines, with Redactor and threading imported), then a thread named `late`
    that dies raising RuntimeError(`message`, an expression), joined."""
    script = "\n".join(
        [
            "import threading",
            "from orchestrator.redactor import Redactor",
            *(line.rstrip("\n") for line in setup),
            "def late():",
            f"    raise RuntimeError({message})",
            "thread = threading.Thread(target=late, name='late')",
            "thread.start()",
            "thread.join()",
            "",
        ]
    )
    return subprocess.run([sys.executable, "-c", script], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
