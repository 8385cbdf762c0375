"""Structured logs: human lines on a terminal, JSON lines for cron and CI.

Event names are stable (`night_started`, `iteration_rolled_back`, ...): tests
and log pipelines match on them. Every event carries the run, task and
iteration ids bound where they become known.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

LOG_FORMATS = ("auto", "human", "json")


def configure_logging(log_format: str = "auto", *, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    stream = stream or sys.stderr
    as_json = log_format == "json" or (log_format == "auto" and not (hasattr(stream, "isatty") and stream.isatty()))
    renderer: Any = structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info if as_json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("overnight").bind(**bound)
