"""The notes.md entries dead nights still owe, written from the run store.

An iteration that ends with a note is recorded with its note owed, then notes.md gets the entry, then
the store marks it written: a night killed in between (or one that could not write notes.md) leaves
the entry owed, and the next night's recovery writes it, once.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta, timezone
from typing import Any

from orchestrator.config import Config
from orchestrator.note_format import header_reason, stamp
from orchestrator.notes import NotesBook

OWED_NOTE_EVIDENCE = (
    "Written by the next night's recovery from the run store: the night that ran this iteration was killed, "
    "or could not write notes.md, before this entry was written. The iteration's transcript has what happened."
)


def write_owed_notes(store: Any, config: Config, state_id: str, log: Any) -> None:
    """The notes.md entries this state dir's ended nights still owe (see iteration_endings.Finisher._noted),
    from what the store kept, each marked written after it is; one notes.md holds already (the night
    died, or its store failed, between the entry and the mark) is only marked."""
    notes = NotesBook(config.notes_path)
    owed = store.owed_notes(state_id)
    # Headers show the minute: an earlier night's entry for the same task, iteration number and reason
    # in that minute (a restart loop) reads the same. Entries so headed, past those the store knows
    # were written, are the owed ones that notes.md already holds.
    headed = Counter((entry.task, entry.iteration, entry.reason, entry.when) for entry in notes.entries()) if owed else Counter()
    for iteration in owed:
        ended = iteration.finished_at or iteration.started_at
        minute = ended.astimezone(timezone.utc).replace(second=0, microsecond=0)
        key = (iteration.task_name, iteration.number, header_reason(iteration.reason), stamp(ended))
        alike = (iteration.task_name, iteration.number, iteration.reason)
        known = store.notes_written_alike(state_id, *alike, minute, minute + timedelta(minutes=1)) if headed[key] else 0
        if headed[key] <= known:
            notes.append(
                task=iteration.task_name,
                iteration=iteration.number,
                reason=iteration.reason,
                correction=iteration.correction,
                evidence=OWED_NOTE_EVIDENCE,
                when=ended,
            )
            log.info(
                "note_recovered",
                run_id=store.run_of_task_run(iteration.task_run_id).id,
                task=iteration.task_name,
                task_run_id=iteration.task_run_id,
                iteration=iteration.number,
                iteration_id=iteration.id,
                reason=iteration.reason,
            )
        store.note_written(iteration.id)
