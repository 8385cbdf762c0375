"""`[model]`: which model answers, where, and how long to wait for it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.config_section import DAY_S, Section
from orchestrator.url_secrets import shown_url, url_password

LOCAL_MODEL = "local"
# A billion tokens is far past any model's window; a number of 309 digits or more overflowed the
# float arithmetic that shares the window out, a traceback in the middle of the night. The config's
# `[model] context_window` and the window a model server reports (server_probes.served_context_window) alike.
MAX_CONTEXT_WINDOW = 1_000_000_000


class ModelConfig(Section):
    """Which model answers, and how long to wait for it."""

    name: str = Field(LOCAL_MODEL, min_length=1, description='litellm model name, or "local" for the embedded model')
    api_base: str | None = None
    api_key: str | None = None
    request_timeout_s: float = Field(120.0, gt=0, le=DAY_S, description="silence longer than this stops the iteration")
    temperature: float = Field(0.2, ge=0, le=2)
    max_tokens: int = Field(2048, gt=0, description="cap on one response")
    context_window: int | None = Field(None, gt=0, le=MAX_CONTEXT_WINDOW, description="used when litellm does not know the model")
    retries: int = Field(3, ge=0, le=100, description="attempts after the first when the endpoint is down or answers 5xx, 429, 408, 409 or 425")
    retry_backoff_s: float = Field(2.0, ge=0, le=3600, description="first backoff; doubles each retry, with jitter")
    transport: Literal["auto", "litellm", "direct"] = Field(
        "auto", description='"direct": OpenAI-compatible HTTP; "auto": direct for "openai/..." with api_base, else litellm'
    )

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from urllib.parse import urlsplit

        if any(mark in (url_password(value) or "") for mark in "/?#"):
            # urllib ends the user info at the first of them, and its error ("Port could not be cast to
            # integer value as '...'") quoted the password's start.
            raise ValueError(f"{shown_url(value)!r}: its password holds / ? or #, which a URL must percent-encode (%2F %3F %23)")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError as exc:
            raise ValueError(f"{shown_url(value)!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{shown_url(value)!r} is not an http:// or https:// URL with a host")
        if not all("!" <= character <= "~" for character in value):
            # Let through, every request failed as the model's iteration_error (http.client refuses it).
            raise ValueError(f"{shown_url(value)!r} holds a space, a control character or a character outside ASCII (percent-encode it: %20)")
        return value

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, value: str | None) -> str | None:
        # Never echoed: it is a secret. A newline copied with it made every request fail, and the
        # error (the key in it) went into notes.md and the next prompt.
        if value is not None and (value != value.strip() or not all(" " <= character <= "~" for character in value)):
            raise ValueError("holds a line break, a control character, a character outside ASCII or a space at an end (the key is not shown)")
        return value

    @model_validator(mode="after")
    def _direct_needs_api_base(self) -> "ModelConfig":
        if self.transport == "direct" and not self.api_base and self.name != LOCAL_MODEL:
            raise ValueError('transport = "direct" needs api_base (the server\'s OpenAI-compatible /v1 URL)')
        return self
