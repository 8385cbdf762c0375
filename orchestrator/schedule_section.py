"""`[schedule]`: when `overnight serve` starts a night, and how late it may still start one."""

from __future__ import annotations

from pydantic import Field

from orchestrator.config_section import Section

_WEEK_S = 7 * 86400


class ScheduleConfig(Section):
    """When `overnight serve` starts a night."""

    cron: str = Field("30 1 * * *", description="crontab expression: minute hour day month weekday, or @daily and such")
    timezone: str = Field("local", description='IANA name such as "Europe/Berlin", or "local"')
    # At most a week: a night missed by longer is not that night's any more (and a huge grace overflows the date arithmetic).
    misfire_grace_s: int = Field(3600, ge=1, le=_WEEK_S, description="a night missed by less than this (host down) still starts")
