"""The store's upkeep: old runs removed batch by batch, and SQLite's own integrity check."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Iterator

from runs.old_runs import RUNS_PER_BATCH, remove_a_batch
from runs.store_transactions import StoreTransactions


class StoreUpkeep(StoreTransactions):
    """RunStore's upkeep of its database."""

    def remove_old_runs(
        self, state_id: str, older_than: timedelta, *, keep_begun_since: datetime | None = None, shared: bool = True
    ) -> Iterator[int]:
        """Remove state dir `state_id`'s runs that ended more than `older_than` ago (the store's clock) with all their
        rows, batch by batch (runs/old_runs.py says which may go), each batch in a transaction of its own: a kill
        midway leaves whole runs. Yields how many runs each batch removed, once it is committed; StateError if one
        fails. `keep_begun_since` (this host's clock: a scheduled night's fire time): runs begun since then stay.
        `shared` (a store other state dirs may use): the newest run that finished each work with success stays, so a
        dead night's recovery still finds the work it waited for done elsewhere; not `shared` (the state dir's own
        SQLite file), the runs an older version recorded with no state dir's name are this state dir's too."""
        ended_before = self.now() - older_than
        begun_before = None if keep_begun_since is None else keep_begun_since + self._clock_offset
        removed = RUNS_PER_BATCH
        while removed == RUNS_PER_BATCH:  # fewer: none left to remove
            with self._statements("remove_old_runs") as connection:
                removed = remove_a_batch(connection, state_id, ended_before=ended_before, begun_before=begun_before, shared=shared)
            if removed:
                yield removed

    def integrity_problems(self) -> list[str]:
        """SQLite's own integrity check ([] when sound); always [] on other backends."""
        self._events.flush()
        if self._engine.dialect.name != "sqlite":
            return []
        with self._engine.connect() as connection:
            rows = [row[0] for row in connection.exec_driver_sql("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else rows
