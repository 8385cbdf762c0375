"""`overnight serve`: start each night from `[schedule] cron`, surviving restarts of the host.

The schedule lives in the run store's database (its own table), so a host that
was down at 01:30 still starts the missed night when it comes back within
`misfire_grace_s`, and never starts it twice: `coalesce` folds several missed
fire times into one, `max_instances = 1` refuses a second concurrent night, and
`serve.lock` refuses a second `serve` on the same state dir (exit 75).

Each night runs as a child `overnight run` process: a crash or a leak in one
night never takes the scheduler down, and the state lock in `run` makes a night
started while another holds the state dir exit 75 at once. A SIGTERM, Ctrl-C or
SIGHUP to `serve` is passed on to that night, which rolls back its iteration; `serve`
waits for it, and keeps that night due, so that a restarted `serve` runs it again.

`cron` means what it means to crontab(5): weekday numbers count from Sunday = 0,
a day matching either the day of month or the weekday runs when both are
restricted, and the hour repeated when the clocks go back runs once.

This module is the order of things; each part is a module of its own: `crontab` (when nights
fire), `schedule_store` (the job's table), `scheduler_loops` (a stop that loses no due night),
`serve_signals` (a stop passed on), `night_child` (the night's process), `night_marker` and
`fired_night` (a night done, or dead with serve), `schedule_events` (the log events).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_SCHEDULER_STARTED
from apscheduler.schedulers.base import BaseScheduler

from orchestrator.cancel import StopNoted
from orchestrator.config import Config, load_config
from orchestrator.crontab import night_trigger, schedule_timezone
from orchestrator.fired_night import finished_tonight, fire_of_tonight, interrupted_night
from orchestrator.lock import EXIT_LOCKED, SERVE_LOCK_NAME, StateLock
from orchestrator.logs import json_mode
from orchestrator.night_child import night_in_flight, run_child_once
from orchestrator.night_marker import mark_started, started_marker, unmark_started
from orchestrator.schedule_events import UNUSUAL_FIRES, library_logs_as_events, log_unusual_fire, logger
from orchestrator.schedule_store import NIGHT_JOB_ID, job_store, keep_due, stored_next_run_time
from orchestrator.scheduler_loops import BackgroundSchedulerForTests, ForegroundScheduler
from orchestrator.serve_signals import stop_on_signals
from runs.engine import store_shown

# Referenced by import path: a persistent job store pickles the reference, not the function.
NIGHT_JOB = "orchestrator.schedule:run_scheduled_night"
# How long `serve` waits before trying a night again whose state dir another process held.
LOCKED_RETRY_S = 60.0


def serve(config_path: Path, stop: StopNoted | None = None) -> int:
    """Run the scheduler in the foreground until SIGTERM, SIGINT or SIGHUP; 0 on a clean stop.

    The signal is passed on to the night in flight, and `serve` waits for its rollback and exit.
    `stop`: where a signal that came while serve starts up is noted; the scheduler then starts no night.
    LockHeld (exit 75) when another `serve` holds the state dir's `serve.lock`.
    """
    from orchestrator.build import check_inputs, open_store
    from orchestrator.state_dir_exclude import make_state_dir

    config = load_config(config_path)
    night_trigger(config, schedule_timezone(config))  # a bad [schedule]: exit 2 before the state dir is made
    # What every night would refuse (no repository, a state dir in its checkout or .git, a check's
    # program not on PATH): exit 2 now, before serve's lock and job store are made, not each night.
    checked = check_inputs(config)
    make_state_dir(checked.repo, config.state_dir)  # kept out of `git status`, in the checkout, before the first night
    # Before the job store is read: a second serve must neither replace the job nor run it.
    with StateLock(config.state_dir, name=SERVE_LOCK_NAME, holder_kind="overnight serve"):
        # Opened as `run` opens it, before the job store touches the database: a database that is
        # not overnight's (another program's `runs` table) is StateError (exit 4), nothing added to it.
        open_store(config).close()
        return _serve_locked(config, config_path, stop or StopNoted())


def _serve_locked(config: Config, config_path: Path, stop: StopNoted) -> int:
    """`serve` once it holds the state dir's serve lock: start the scheduler, then stop it on a signal."""
    scheduler = cast(ForegroundScheduler, build_scheduler(config, config_path, log_format="json" if json_mode() else "human"))
    deferred: list[datetime] = []

    def started(event: object) -> None:
        # The stored job's time, not one computed from now: after a missed night it is due at once.
        job = scheduler.get_job(NIGHT_JOB_ID)
        pending = job.next_run_time if job is not None else None
        logger().info(
            "scheduler_started",
            cron=config.schedule.cron,
            timezone=str(schedule_timezone(config)),
            next_fire_time=pending.isoformat() if pending else None,
            store=store_shown(config.store_url),
        )

    def executed(event: Any) -> None:
        if event.retval is None:  # serve's stop ended the night: before its run began, or by cancelling it
            deferred.append(event.scheduled_run_time)

    scheduler.add_listener(started, EVENT_SCHEDULER_STARTED)
    scheduler.add_listener(executed, EVENT_JOB_EXECUTED)
    with stop_on_signals(scheduler, stop), library_logs_as_events():
        scheduler.start()  # returns once a signal asked to stop
        logger().info("scheduler_stopping", signal=scheduler.stop_requested)
        scheduler.shutdown(wait=True)  # the night in flight got the signal too: wait for its rollback
        # Still under serve's own handlers: a Ctrl-C held down reaches here too, and must not stop
        # the night that serve's stop ended from being kept due.
        if deferred:
            keep_due(config, deferred[0])
        logger().info("scheduler_stopped")
    return 0


def build_scheduler(
    config: Config, config_path: Path, *, blocking: bool = True, job: str = NIGHT_JOB, log_format: str = "auto"
) -> BaseScheduler:
    """A scheduler holding the night job in the run store's database; not started.

    `job` is the import path of what a fire calls; tests point it at a marker.
    """
    zone = schedule_timezone(config)
    trigger = night_trigger(config, zone)
    store = job_store(config)
    scheduler_class = ForegroundScheduler if blocking else BackgroundSchedulerForTests
    scheduler = scheduler_class(
        jobstores={"default": store},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": config.schedule.misfire_grace_s},
        timezone=zone,
    )
    extra: dict[str, Any] = {}
    pending = stored_next_run_time(store, trigger)
    interrupted = interrupted_night(config)
    if interrupted is not None and (pending is None or pending > interrupted):
        # The night began and died with serve (APScheduler had stored tomorrow's time when it
        # started it): within the grace it is run again, its recovery settling the dead one.
        pending = interrupted
    if pending is not None:
        # Replacing the job would otherwise recompute its next run from now and lose a missed night.
        extra["next_run_time"] = pending
    scheduler.add_job(
        job,
        trigger,
        # Absolute, not resolved: a config that is a link (re-pointed by `ln -sfn`, a home-manager switch, a
        # ConfigMap) is read where it points at each fire, as `overnight run` reads it, not in a file since removed.
        args=[str(Path(config_path).absolute()), log_format],
        id=NIGHT_JOB_ID,
        name="overnight night",
        replace_existing=True,
        **extra,
    )
    scheduler.add_listener(log_unusual_fire, UNUSUAL_FIRES)
    return scheduler


def run_scheduled_night(config_path: str, log_format: str = "auto") -> int | None:
    """One night as a child `overnight run`; its exit code (75 when another process held the lock all through the grace).

    None when `serve`'s stop ended the night: before it began a run (not started, or stopped
    while starting up), or by cancelling it (exit 129/130/143, its iteration rolled back).
    `serve` then keeps it due, so that a restarted `serve` runs that night (within the grace)
    instead of waiting for tomorrow's. `log_format` is serve's own (json or human), so that
    the child's stderr matches serve's.
    """
    # The state dir's lock held at the fire (an `overnight gc`, a night run by hand): tried again until
    # the misfire grace is spent, else the night is lost until tomorrow's fire.
    config = _readable_config(config_path)
    give_up_at = time.monotonic() + _grace_of(config)
    # Marked from the fire until the night is seen to end, waits for the state lock included: APScheduler
    # has stored tomorrow's fire time by now, and a serve that died (power lost, kill -9) before a child
    # recorded its run, or while it waited out another's lock, lost the night without the marker.
    marker = started_marker(config)
    marked = mark_started(marker, pid=0)
    # The fire this night is for, named once: tries after a long wait for the lock may come after the
    # grace (counted from the first try, which may itself be late), and a night started without its
    # fire time reads its deadline from its start: past 06:30, tomorrow's.
    fired = fire_of_tonight(config)
    try:
        while True:
            if _seen_done(config_path, config, fired):
                return 0
            fired = fired or fire_of_tonight(config)  # a config mended while the lock was waited for
            exit_code = run_child_once(config_path, log_format, fired, marker, marked)
            if exit_code is None:
                return None
            retry_in = min(LOCKED_RETRY_S, give_up_at - time.monotonic())
            if exit_code != EXIT_LOCKED or retry_in <= 0:
                return exit_code
            logger().info("scheduled_night_waits_for_lock", config=config_path, retry_in_s=round(retry_in, 1))
            if night_in_flight().wait(retry_in):
                return None  # serve stopped while waiting: the night stays due
            config = _readable_config(config_path)  # perhaps mended while the lock was waited for
    finally:
        unmark_started(marker)  # seen to end: what it did (or that it stopped at once) is the night's


def _seen_done(config_path: str, config: Config | None, fired: datetime | None) -> bool:
    """Whether a run of this state dir already finished the fire's night (see finished_tonight); logged when it did."""
    done = finished_tonight(config, fired)
    if done is None:
        return False
    # A fire seen twice: the job store failed to store the next fire time after the night
    # began (serve retried, or was restarted), or a person ran the night by hand.
    logger().info("scheduled_night_skipped_done", config=config_path, run_id=done)
    return True


def _readable_config(config_path: str) -> Config | None:
    """The night's config, or None when it cannot be read: the night itself will say what is wrong."""
    try:
        return load_config(Path(config_path), require_tasks=False)
    except Exception:
        return None


def _grace_of(config: Config | None) -> float:
    return float(config.schedule.misfire_grace_s) if config is not None else 0.0


__all__ = [
    "NIGHT_JOB_ID",
    "SERVE_LOCK_NAME",
    "build_scheduler",
    "run_scheduled_night",
    "serve",
]
