"""The night's log as a person and a log pipeline read it."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from orchestrator import logs


@pytest.fixture(autouse=True)
def _logging_restored():
    saved, modes = structlog.get_config(), (logs._json_mode, logs._json_asked)
    yield
    structlog.configure(**saved)
    logs._json_mode, logs._json_asked = modes


def _log_an_error(log_format: str) -> str:
    out = io.StringIO()
    logs.configure_logging(log_format, stream=out)

    def call_model(api_key: str) -> None:
        raise ValueError("Port out of range 0-65535")

    key = "-".join(("sk", "SECRET123"))  # not spelled whole in a source line the traceback shows
    try:
        call_model(api_key=key)
    except ValueError:
        logs.get_logger(run_id=7).exception("iteration_error")
    return out.getvalue()


@pytest.mark.parametrize("log_format", ["human", "json"])
def test_an_error_is_logged_with_its_traceback_but_not_the_variables_around_it(log_format):
    """A traceback's local variables hold the api_key; a log someone pastes into an issue must not."""
    text = _log_an_error(log_format)
    assert "iteration_error" in text and "ValueError: Port out of range" in text and "call_model" in text
    assert "sk-SECRET123" not in text


def test_json_lines_carry_the_event_name_and_the_ids_bound():
    event = json.loads(_log_an_error("json").splitlines()[0])
    assert event["event"] == "iteration_error" and event["run_id"] == 7 and event["level"] == "error"
