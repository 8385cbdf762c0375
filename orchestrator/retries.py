"""Retries in one place: an endpoint down or overloaded is tried again with backoff, then `ModelUnreachable`.

Neither transport retries on its own (litellm's `num_retries` and the openai SDK's retries are
off), so retries never nest: a night with `retries = 5` makes at most six attempts a request.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.endpoint_failures import Retryable, endpoint_shown
from orchestrator.errors import ModelUnreachable
from orchestrator.records import ModelResponse

if TYPE_CHECKING:  # pydantic is not needed to import this module
    from orchestrator.config import ModelConfig

# The longest wait between two attempts (unless retry_backoff_s itself is longer).
MAX_BACKOFF_S = 300.0


class Retries:
    """Attempts at one request, retried while they fail as `Retryable`, up to `config.retries` times."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        sleep: Callable[[float], None] | None = None,
        on_retry: Callable[[int, str], None] | None = None,
        cancel: Any = None,
    ) -> None:
        self.config = config
        # How the wait between attempts passes (tests record it); by default on the cancel token.
        self._sleep = sleep
        self._on_retry = on_retry
        self._cancel = cancel

    def run(self, attempt: Callable[[], ModelResponse]) -> ModelResponse:
        failures = 0
        while True:
            try:
                return attempt()
            except Retryable as failure:
                failures += 1
                if failures > self.config.retries:
                    raise ModelUnreachable(
                        f"model endpoint {endpoint_shown(self.config)} failed {failures} times; last error: {failure.reason}"
                    ) from None
                if self._on_retry is not None:
                    self._on_retry(failures, failure.reason)
                self._wait_before_retry(self._backoff(failures, failure.retry_after))

    def _wait_before_retry(self, seconds: float) -> None:
        """Wait out a backoff. A cancel (SIGTERM, the deadline) ends the wait at once: a night
        told to stop must not sit out up to MAX_BACKOFF_S first."""
        if self._sleep is not None:
            self._sleep(seconds)
        elif self._cancel is not None:
            self._cancel.wait(seconds)
        else:
            time.sleep(seconds)
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()

    def _backoff(self, failures: int, retry_after: float | None = None) -> float:
        # Doubling, but never past MAX_BACKOFF_S a wait: 20 retries would otherwise sleep for weeks.
        ceiling = max(MAX_BACKOFF_S, self.config.retry_backoff_s)
        wait = min(self.config.retry_backoff_s * 2 ** min(failures - 1, 32) * random.uniform(0.75, 1.25), ceiling)
        # A server's Retry-After is the least it will take, within the same ceiling.
        return max(wait, min(retry_after or 0.0, ceiling))
