"""`[state]`: the state dir, and how long it keeps transcripts, runs and notes."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from orchestrator.config_section import Section

# What a `keep_*_days` under a day could remove that tonight still needs, and what 0 keeps.
_NEEDED_TONIGHT = {
    "keep_runs_days": ("tonight's own account, and the runs a scheduled night begun again reads", "every run"),
    "keep_notes_days": ("the lessons of tonight's earlier runs, which the next iteration's prompt reads", "every entry"),
}


class StateConfig(Section):
    dir: Path = Path(".overnight")
    # Transcripts are the largest files a night leaves, one per iteration: nightly for months, gigabytes.
    keep_transcripts_days: float = Field(
        0, ge=0, le=36500, description="each run deletes transcripts last written more than this many days ago; 0 keeps all"
    )
    # The run store's per-call events grow with every night, as long as cron runs them.
    keep_runs_days: float = Field(
        0, ge=0, le=36500, description="each run deletes this state dir's runs that ended more than this many days ago; 0 keeps all"
    )
    # notes.md gains an entry per iteration rolled back, and each append rewrites the whole file.
    keep_notes_days: float = Field(
        0, ge=0, le=36500, description="each run removes notes.md's entries headed more than this many days ago; 0 keeps all"
    )

    @field_validator("keep_runs_days", "keep_notes_days")
    @classmethod
    def _a_day_at_least(cls, value: float, info: ValidationInfo) -> float:
        if 0 < value < 1:
            needed, everything = _NEEDED_TONIGHT[str(info.field_name)]
            raise ValueError(f"{value:g} is under a day: it could remove {needed}; give 1 or more days, or 0 to keep {everything}")
        return value

    @field_validator("dir", mode="before")
    @classmethod
    def _not_blank(cls, value: object) -> object:
        # "" reads as "." (the config file's folder): worktrees, notes and the run store would land there.
        if isinstance(value, str) and not value.strip():
            raise ValueError('is blank; name a folder of its own (the default is ".overnight")')
        return value
