"""`[night]`: how long and how much a night may spend on a task, and by when it ends."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from orchestrator.config_section import DAY_S, Section


class NightConfig(Section):
    max_iterations: int = Field(3, ge=1)
    max_turns: int = Field(30, ge=1)
    check_timeout_s: float = Field(600.0, gt=0, le=DAY_S)
    command_timeout_s: float = Field(120.0, gt=0, le=DAY_S)
    notes_budget_chars: int = Field(4000, ge=0, description="how much of a task's notes goes into its prompt")
    deadline: str | None = Field(None, description='local time "HH:MM" by which the night must end')
    max_tokens_per_task: int | None = Field(None, gt=0)
    max_tokens_per_night: int | None = Field(None, gt=0)
    concurrency: int = Field(1, ge=1, le=64, description="tasks worked on in parallel")

    @field_validator("deadline")
    @classmethod
    def _clock_time(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", value):
            raise ValueError('must be a time of day "HH:MM", e.g. "06:30"')
        return value
