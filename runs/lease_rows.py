"""One worker per task, across processes and hosts: a task's lease taken, renewed, given back and listed.

A lease is a row of its own, taken in one statement where the database has an upsert (runs/upserts.py), else
by an INSERT, then a conditional UPDATE. Its times are the database's clock in a PostgreSQL store that
machines share, this host's in a SQLite file (see StoreTransactions._database_clock).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from runs.models import Lease, utc_now
from runs.store_transactions import StoreTransactions
from runs.upserts import upsert_of
from runs.views import LeaseView


class LeaseRows(StoreTransactions):
    """RunStore's leases: one worker per task."""

    def _lease_times(self, ttl_s: float) -> tuple[Any, Any]:
        """Now and the expiry of a lease taken now: SQL expressions on the database's clock, or this host's times."""
        now = func.now() if self._database_clock else utc_now()
        return now, now + timedelta(seconds=ttl_s)

    def acquire_lease(self, task: str, owner: str, ttl_s: float) -> bool:
        """Take the task's lease if it is free, expired or already ours; False if someone else holds it."""
        now, expires = self._lease_times(ttl_s)
        values = dict(task=task, owner=owner, acquired_at=now, expires_at=expires)
        takeable = or_(Lease.owner == owner, Lease.expires_at <= now)
        upsert = upsert_of(self._engine.dialect)
        if upsert is not None:
            # One statement, atomic on the database: an INSERT, then an UPDATE, told an expired lease
            # deleted between the two (another machine's recovery releasing it) that it was held.
            statement = upsert(Lease).values(**values)
            statement = statement.on_conflict_do_update(
                index_elements=[Lease.task],
                set_={name: statement.excluded[name] for name in ("owner", "acquired_at", "expires_at")},
                where=takeable,
            )
            with self._statements("acquire_lease", after_events=False) as connection:
                if self._engine.dialect.name == "postgresql":  # psycopg gives no rowcount for it
                    return len(connection.execute(statement.returning(Lease.task)).all()) == 1
                return connection.execute(statement).rowcount == 1
        for _ in range(3):  # another database: an INSERT for a free lease, a conditional UPDATE for one taken
            try:
                with self._statements("acquire_lease", expected=(IntegrityError,), after_events=False) as connection:
                    connection.execute(insert(Lease).values(**values))
                return True
            except IntegrityError:
                pass  # a row exists: ours, expired, or someone else's
            with self._statements("acquire_lease", after_events=False) as connection:
                if connection.execute(update(Lease).where(Lease.task == task, takeable).values(**values)).rowcount:
                    return True
                if connection.execute(select(Lease.task).where(Lease.task == task)).first() is not None:
                    return False  # held by someone else
        return False

    def renew_lease(self, task: str, owner: str, ttl_s: float) -> bool:
        """Push the expiry forward; False if the lease is no longer ours (taken over after expiry)."""
        _, expires = self._lease_times(ttl_s)
        with self._statements("renew_lease", after_events=False) as connection:
            statement = update(Lease).where(Lease.task == task, Lease.owner == owner).values(expires_at=expires)
            return connection.execute(statement).rowcount == 1

    def release_lease(self, task: str, owner: str) -> None:
        """Give the lease back; nothing happens if it is not ours any more."""
        with self._statements("release_lease", after_events=False) as connection:
            connection.execute(delete(Lease).where(Lease.task == task, Lease.owner == owner))

    def lease_holder(self, task: str) -> str | None:
        """The owner of the task's lease while it has not expired, asked without taking it; None when it is free."""
        now, _ = self._lease_times(0)
        with self._reading() as session:
            return session.scalars(select(Lease.owner).where(Lease.task == task, Lease.expires_at > now)).first()

    def leases(self) -> list[LeaseView]:
        with self._reading() as session:
            rows = session.scalars(select(Lease).order_by(Lease.task)).all()
            return [LeaseView(task=r.task, owner=r.owner, acquired_at=r.acquired_at, expires_at=r.expires_at) for r in rows]
