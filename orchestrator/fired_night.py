"""The night of the schedule's latest fire: which fire it is, and whether it was done or died unfinished.

APScheduler stores the next fire time as it starts a night, so the job store alone cannot tell a
night done from one lost: the run store (and serve's marker) can. A fire seen twice (a job store
that failed, a night run by hand) finds its night done and is skipped; a night that died with serve
is found by the restarted serve and run again within the grace.
"""

from __future__ import annotations

import dataclasses
import socket
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator.config import Config
from orchestrator.crontab import latest_fire_time, night_trigger, schedule_timezone
from orchestrator.lock import state_identity
from orchestrator.night_marker import marked_start


def fire_within_grace(config: Config, now: datetime | None = None) -> datetime | None:
    """The schedule's latest fire time within the misfire grace before `now`: the night started now is that fire's."""
    # In UTC: on the night the clocks change, the zone's own times are an hour off the seconds that passed.
    now = now or datetime.now(timezone.utc)
    return latest_fire_time(night_trigger(config, schedule_timezone(config)), now - timedelta(seconds=config.schedule.misfire_grace_s), now)


def fire_of_tonight(config: Config | None) -> datetime | None:
    """The fire the night started now is for (see fire_within_grace); None when the config cannot tell."""
    if config is None:
        return None
    try:
        return fire_within_grace(config)
    except Exception:  # a [schedule] edited since serve started: the night itself will say what is wrong
        return None


def finished_tonight(config: Config | None, fired: datetime | None = None) -> int | None:
    """The id of a run of this state dir that began at or after the fire `fired` (by default the schedule's
    latest fire time within the misfire grace) and finished: that fire's night was done. None otherwise.
    A retry after a long wait for the state lock names its fire: worked out from the time then, past the
    grace, it found none, and a night a person ran by hand meanwhile was run a second time."""
    if config is None:
        return None
    try:
        latest = _latest_run_since_fire(config, fired=fired)
    except Exception:  # the night itself will say what is wrong with the config or the store
        return None
    return latest[0].id if latest is not None and latest[0].status == "finished" else None


def interrupted_night(config: Config, now: datetime | None = None) -> datetime | None:
    """The fire time of a night that began within the grace and died without ending (power lost,
    serve and night killed together): its fire time, for serve to run it again now. None otherwise."""
    from orchestrator.process_liveness import pid_alive

    try:
        found = _latest_run_since_fire(config, now)
        if found is None:
            return _started_before_its_run(config, now)
    except Exception:
        return None
    run, fired = found
    # `crashed` with an exit code: the night recorded its own end (a full disk, exit 4), as any ended night
    # does; without one, a later recovery found it dead.
    dead = (run.status == "crashed" and run.exit_code is None) or (
        run.status == "running" and run.host == socket.gethostname() and not pid_alive(run.pid, run.started_at)
    )
    return fired if dead else None


def _latest_run_since_fire(config: Config, now: datetime | None = None, *, fired: datetime | None = None) -> tuple[Any, datetime] | None:
    """This state dir's latest run and the fire time it began after: `fired`, by default the schedule's last
    fire time within the misfire grace, if this state dir's latest run began at or after it. None otherwise."""
    from orchestrator.build import open_store

    fired = fired or fire_within_grace(config, now)
    if fired is None or not config.state_dir.is_dir():
        return None
    state_id = state_identity(config.state_dir, create=False)
    if state_id is None:
        return None
    store = open_store(config)
    try:
        latest = store.latest_run(state_id=state_id)
        # The store's clock is the database's on PostgreSQL: its start, on this host's clock.
        began = store.on_this_hosts_clock(latest.started_at) if latest is not None else None
    finally:
        store.close()
    # Only this state dir's own: a run recorded without a state dir's name may be another machine's.
    if latest is None or began is None or latest.state_id != state_id or began < fired:
        return None
    return dataclasses.replace(latest, started_at=began), fired


def _started_before_its_run(config: Config, now: datetime | None) -> datetime | None:
    """The fire time of a night serve started (its marker left behind) that recorded no run and whose
    child is gone: it died with serve as it started up. None otherwise."""
    from orchestrator.process_liveness import pid_alive

    marked = marked_start(config.state_dir)
    if marked is None:
        return None
    started, pid = marked
    fired = fire_within_grace(config, now)
    if fired is None or started < fired or (pid and pid_alive(pid, started)):
        return None  # an earlier fire's, or its child still starts up (serve alone died): it will record its run
    return fired
