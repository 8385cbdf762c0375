"""Before a night, with their `[state]` keys set: old transcripts, this state dir's old runs and notes.md's old entries
deleted. What cannot be deleted is logged, never fatal: the night goes on."""

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
    from orchestrator.work_keys import store_is_shared
    from orchestrator.redactor import Redactor

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


def trim_notes(settings: object, log: object, *, since: datetime | None) -> None:
    """`[state] keep_notes_days`: notes.md's entries whose header time is older removed before the night, those since
    `since` (a scheduled night's fire time: its earlier runs' entries, which the night's prompts read) kept; a notes.md
    that cannot be rewritten, or that a person's editor saved during every try, is logged, not fatal.

    Of notes.md's readers only the prompt and `overnight notes` see fewer entries, and each reads the newer ones as
    before: the prompt picks newest first (an old entry with a person's hint no longer takes part of its budget).
    Recovery's owed entries are written before this, and those of one header are all older than the cutoff or none;
    `park_after` and a night begun again count from the run store, not from notes.md."""
    from datetime import datetime, timedelta, timezone

    from orchestrator.notes import NotesBook
    from orchestrator.redactor import Redactor

    days = settings.state.keep_notes_days  # type: ignore[attr-defined]
    if not days:
        return
    cutoff = datetime.now(timezone.utc) - timedelta(days=days)
    if since is not None:
        cutoff = min(cutoff, since.astimezone(timezone.utc))
    # Headers show the minute, rounded down: an entry headed in the cutoff's own minute may have been written after it.
    cutoff = cutoff.replace(second=0, microsecond=0)
    try:
        removed = NotesBook(settings.notes_path).remove_entries_before(cutoff)  # type: ignore[attr-defined]
    except StateError as failed:
        log.warning("note_entries_not_removed", error=Redactor.for_config(settings)(str(failed)))  # type: ignore[attr-defined]
        return
    if removed is None:
        saved = f"{settings.notes_path} was saved by another hand during every try"  # type: ignore[attr-defined]
        log.warning("note_entries_not_removed", error=saved)  # type: ignore[attr-defined]
    elif removed:
        log.info("note_entries_removed", count=removed, older_than_days=days)  # type: ignore[attr-defined]
