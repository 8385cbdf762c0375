"""Before a night, with their `[state]` keys set: old transcripts and this state dir's old runs deleted. What cannot be
deleted is logged, never fatal: the night goes on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import StateError

if TYPE_CHECKING:
    from datetime import datetime


def trim_transcripts(settings: object, log: object) -> None:
    """`[state] keep_transcripts_days`: older transcripts deleted before the night; a file that cannot be is logged, not fatal."""
    from orchestrator.transcript import remove_older_than

    days = settings.state.keep_transcripts_days  # type: ignore[attr-defined]
    if not days:
        return
    removed, failures = remove_older_than(settings.transcripts_dir, days)  # type: ignore[attr-defined]
    if removed:
        log.info("transcripts_removed", count=removed, older_than_days=days)  # type: ignore[attr-defined]
    for failure in failures:
        log.warning("transcript_not_removed", error=failure)  # type: ignore[attr-defined]


def trim_runs(settings: object, store: object, log: object, *, since: datetime | None) -> None:
    """`[state] keep_runs_days`: this state dir's runs that ended longer ago deleted before the night, those begun since
    `since` (a scheduled night's fire time: its earlier runs, which the night reads) kept, and in a store other state
    dirs may use the newest run that finished each work with success (runs/old_runs.py); a failure is logged, not fatal."""
    from datetime import timedelta

    from orchestrator.lock import state_identity
    from orchestrator.night import store_is_shared
    from orchestrator.secrecy import Redactor

    days = settings.state.keep_runs_days  # type: ignore[attr-defined]
    if not days:
        return
    removed, error = 0, ""
    try:
        state_id = state_identity(settings.state_dir)  # type: ignore[attr-defined]
        older_than, shared = timedelta(days=days), store_is_shared(settings)  # type: ignore[arg-type]
        for batch in store.remove_old_runs(state_id, older_than, keep_begun_since=since, shared=shared):  # type: ignore[attr-defined]
            removed += batch
    except StateError as failed:  # a locked or read-only store: the night goes on, and its own writes say if it cannot
        error = Redactor.for_config(settings)(str(failed))
    if removed:
        log.info("runs_removed", count=removed, older_than_days=days)  # type: ignore[attr-defined]
    if error:
        log.warning("runs_not_removed", error=error)  # type: ignore[attr-defined]
