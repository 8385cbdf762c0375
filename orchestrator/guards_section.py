"""`[guards]`: the built-in guards' thresholds, and the user's guards to add (docs/guards.md)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from orchestrator.config_section import Section
from orchestrator.tool_names import check_tool_names


class GuardsConfig(Section):
    """Thresholds of the built-in guards, and user guards to add."""

    repeat_remind_at: int = Field(3, ge=2)
    repeat_stop_at: int = Field(4, ge=2)
    empty_stop_at: int = Field(2, ge=1)
    no_tool_call_stop_at: int = Field(3, ge=1, description="answers in a row with text but no tool call")
    many_calls_warn_at: int = Field(4, ge=2, description="tool calls in one answer that draw a warning")
    unknown_tool_stop_at: int = Field(2, ge=1)
    broken_stop_at: int = Field(3, ge=1)
    failing_streak_at: int = Field(3, ge=2)
    failing_streak_stop_at: int = Field(0, ge=0, description="failures with nothing new between them that stop the iteration; 0: never")
    dead_loop_window: int = Field(6, ge=2, le=1000)
    dead_loop_recent: int = Field(4, ge=2, le=1000)
    dead_loop_distinct: int = Field(2, ge=1)
    progress_tools: tuple[str, ...] = ("write_file", "edit_file")
    context_warn_ratio: float = Field(0.8, gt=0, le=1)
    max_output_chars: int = Field(20000, gt=0, description="a response longer than this is cut as runaway")
    park_after: int = Field(3, ge=1, description="same severe reason on this many iterations in a row parks the task")
    custom: tuple[str, ...] = Field((), description='user guards as "module:Class"')

    @field_validator("progress_tools")
    @classmethod
    def _known_progress_tools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_tool_names(value)

    @model_validator(mode="after")
    def _remind_before_stop(self) -> "GuardsConfig":
        if self.repeat_remind_at > self.repeat_stop_at:
            raise ValueError("repeat_remind_at must not be above repeat_stop_at")
        if self.failing_streak_stop_at and self.failing_streak_stop_at < self.failing_streak_at:
            raise ValueError("failing_streak_stop_at must be 0 (never) or not below failing_streak_at")
        if self.dead_loop_distinct >= self.dead_loop_recent:
            # Any `recent` rounds have at most `recent` fingerprints: every run would be a dead loop.
            raise ValueError("dead_loop_distinct must be below dead_loop_recent")
        return self
