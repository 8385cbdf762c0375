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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, cast

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_SCHEDULER_STARTED,
    JobEvent,
)
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.base import BaseTrigger

from orchestrator.cancel import StopNoted, stopping_signals
from orchestrator.config import SERVE_NIGHT_MARKER, Config, load_config
from orchestrator.crontab import latest_fire_time, night_trigger, schedule_timezone
from orchestrator.errors import StateError
from orchestrator.lock import EXIT_LOCKED, SERVE_LOCK_NAME, StateLock, make_dir, state_identity
from orchestrator.logs import get_logger, json_mode
from runs.engine import safe_url, store_shown

NIGHT_JOB_ID = "overnight-night"
SCHEDULE_TABLE = "overnight_schedule"
# Referenced by import path: a persistent job store pickles the reference, not the function.
NIGHT_JOB = "orchestrator.schedule:run_scheduled_night"
# How soon the foreground loop notices a stop request (a signal handler may not wake it: see below).
_STOP_POLL_S = 0.25
# How long the loop waits before it asks a job store that failed again.
_STORE_RETRY_S = 5.0


def _logger() -> Any:
    # Fetched per event: a logger bound at import would keep the logging setup of import time.
    return get_logger(component="schedule")


class _ForegroundScheduler(BlockingScheduler):
    """Stops between two rounds of due jobs, never inside one.

    APScheduler's `shutdown()` called from a signal handler runs in the middle of
    `_process_jobs` when the signal comes just as a night falls due: the submission
    then fails, while the job's next run time has already moved on, and the night is lost.
    So a signal only sets `stop_requested`, and `serve` shuts down once the loop has returned.
    """

    stop_requested: str | None = None

    def _main_loop(self) -> None:
        due_at = 0.0  # wall clock, so that a host waking from sleep processes at once
        while not self.stop_requested:
            # Polled, because the handler must not set the event: the main thread may hold its lock.
            woken = self._event.wait(min(max(due_at - time.time(), 0.0), _STOP_POLL_S))
            if self.stop_requested:
                break
            if woken or time.time() >= due_at:
                self._event.clear()
                try:
                    wait_s = self._process_jobs()
                except Exception as exc:  # the job store failed (a locked or unreachable database)
                    # A night may have started before its next fire time could be stored: the
                    # next round finds it due again, and run_scheduled_night skips a night done.
                    _logger().error("scheduler_store_failed", error=_first_line(exc), retry_in_s=_STORE_RETRY_S)
                    wait_s = _STORE_RETRY_S
                due_at = math.inf if wait_s is None else time.time() + wait_s


class _BackgroundScheduler(BackgroundScheduler):
    """For tests. APScheduler 3 wakes its loop once more after `shutdown()` and processes due jobs.

    Their executor is already shut down, so the submission fails, yet the job's next
    run time is advanced and stored: the due night would be lost, not run at the next start.
    """

    def _process_jobs(self) -> float | None:
        if self.state == STATE_STOPPED:
            return None
        return super()._process_jobs()


class _NightInFlight:
    """The child night now running, so that a SIGTERM, Ctrl-C or SIGHUP to `serve` reaches it too.

    Module-level, because the job runs by import path and cannot be handed an object.
    """

    def __init__(self) -> None:
        # Reentrant: `stop` runs in a signal handler, which may interrupt another `stop` on the main thread.
        self._lock = threading.RLock()
        self._child: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._stopped = threading.Event()

    def start(self, command: list[str]) -> subprocess.Popen[bytes] | None:
        """The child, started; None once `serve` is stopping (the night then stays due)."""
        with self._lock:
            if self._stopping:
                return None
            # stdin closed: nothing in a night may wait for a person. Its own process group:
            # a Ctrl-C on the terminal reaches it once, passed on by `stop`, not twice (twice stops at once).
            self._child = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
            return self._child

    def finished(self) -> None:
        with self._lock:
            self._child = None

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, signum: int) -> None:
        """Pass the signal on to the night in flight, which rolls back its iteration; start no other."""
        with self._lock:
            # Set once: a signal landing while the first handler is inside set() runs this again in it,
            # and would wait for ever for the event's lock (plain, not reentrant), which that handler holds.
            if not self._stopping:
                self._stopping = True
                self._stopped.set()
            if self._child is not None:
                self._child.send_signal(signum)

    def wait(self, seconds: float) -> bool:
        """Wait `seconds`, or less if `serve` is told to stop meanwhile: whether it was."""
        return self._stopped.wait(seconds)


_night = _NightInFlight()


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
    marker = _started_marker(config)
    marked = _mark_started(marker, pid=0)
    # The fire this night is for, named once: tries after a long wait for the lock may come after the
    # grace (counted from the first try, which may itself be late), and a night started without its
    # fire time reads its deadline from its start: past 06:30, tomorrow's.
    fired = _fire_of_tonight(config)
    try:
        while True:
            if _seen_done(config_path, config, fired):
                return 0
            fired = fired or _fire_of_tonight(config)  # a config mended while the lock was waited for
            exit_code = _run_child_once(config_path, log_format, fired, marker, marked)
            if exit_code is None:
                return None
            retry_in = min(LOCKED_RETRY_S, give_up_at - time.monotonic())
            if exit_code != EXIT_LOCKED or retry_in <= 0:
                return exit_code
            _logger().info("scheduled_night_waits_for_lock", config=config_path, retry_in_s=round(retry_in, 1))
            if _night.wait(retry_in):
                return None  # serve stopped while waiting: the night stays due
            config = _readable_config(config_path)  # perhaps mended while the lock was waited for
    finally:
        _unmark_started(marker)  # seen to end: what it did (or that it stopped at once) is the night's


def _seen_done(config_path: str, config: Config | None, fired: datetime | None) -> bool:
    """Whether a run of this state dir already finished the fire's night (see _finished_tonight); logged when it did."""
    done = _finished_tonight(config, fired)
    if done is None:
        return False
    # A fire seen twice: the job store failed to store the next fire time after the night
    # began (serve retried, or was restarted), or a person ran the night by hand.
    _logger().info("scheduled_night_skipped_done", config=config_path, run_id=done)
    return True


def _run_child_once(config_path: str, log_format: str, fired: datetime | None, marker: Path | None, marked: bool) -> int | None:
    """The night run once as a child `overnight run` for the fire `fired`, the child's pid written into
    `marker` when it was `marked`: its exit code; None when serve's stop ended it (see run_scheduled_night)."""
    # -P: `-m` would put serve's current folder (the repository's checkout, in the documented
    # units) first on the night's import path, and a module of the project's named like one
    # overnight imports (a secrets.py, a guards/ package) was imported in its place: every
    # scheduled night failed while `overnight run` by hand worked. The console script never does.
    command = [sys.executable, "-P", "-m", "orchestrator.cli", "run", "--config", config_path, "--log-format", log_format]
    if fired is not None:
        # Begun again (serve restarted, or died with it): what the fire's earlier runs finished is not worked twice.
        command += ["--scheduled-for", fired.isoformat()]
    child = _night.start(command)
    if child is None:
        return None
    if marked:  # not written: the warning was said once, not again with the child's pid
        _mark_started(marker, pid=child.pid)
    _logger().info("scheduled_night_started", config=config_path, pid=child.pid)
    try:
        exit_code = child.wait()
    finally:
        _night.finished()
    run_id = _run_id_of(config_path, child.pid)
    _logger().info(
        "scheduled_night_finished", config=config_path, exit_code=exit_code, **({"run_id": run_id} if run_id else {})
    )
    if _night.stopping and (run_id is None or _cancelled_by_signal(exit_code)):
        return None  # stopped while starting up (a second or so of imports), or cancelled with serve
    return exit_code


# How long `serve` waits before trying a night again whose state dir another process held.
LOCKED_RETRY_S = 60.0


def _readable_config(config_path: str) -> Config | None:
    """The night's config, or None when it cannot be read: the night itself will say what is wrong."""
    try:
        return load_config(Path(config_path), require_tasks=False)
    except Exception:
        return None


def _grace_of(config: Config | None) -> float:
    return float(config.schedule.misfire_grace_s) if config is not None else 0.0


def _fire_of_tonight(config: Config | None) -> datetime | None:
    """The fire the night started now is for (see _fire_within_grace); None when the config cannot tell."""
    if config is None:
        return None
    try:
        return _fire_within_grace(config)
    except Exception:  # a [schedule] edited since serve started: the night itself will say what is wrong
        return None


def _finished_tonight(config: Config | None, fired: datetime | None = None) -> int | None:
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


def _latest_run_since_fire(config: Config, now: datetime | None = None, *, fired: datetime | None = None) -> tuple[Any, datetime] | None:
    """This state dir's latest run and the fire time it began after: `fired`, by default the schedule's last
    fire time within the misfire grace, if this state dir's latest run began at or after it. None otherwise."""
    from orchestrator.build import open_store

    fired = fired or _fire_within_grace(config, now)
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


def _fire_within_grace(config: Config, now: datetime | None = None) -> datetime | None:
    """The schedule's latest fire time within the misfire grace before `now`: the night started now is that fire's."""
    # In UTC: on the night the clocks change, the zone's own times are an hour off the seconds that passed.
    now = now or datetime.now(timezone.utc)
    return latest_fire_time(night_trigger(config, schedule_timezone(config)), now - timedelta(seconds=config.schedule.misfire_grace_s), now)


# Written by serve just before it starts a night's child, removed once it has seen the child end: a
# night that died with serve before the child recorded its run (power lost in its first seconds,
# while it imports, loads the model or waits for the state lock) is known by it, as no run shows it.
STARTED_MARKER_NAME = SERVE_NIGHT_MARKER


def _started_marker(config: Config | None) -> Path | None:
    """Where the marker goes; None without a state dir (serve has made it, for its lock: a night started
    otherwise makes its own) or a config that cannot be read."""
    if config is None or not config.state_dir.is_dir():
        return None
    return config.state_dir / STARTED_MARKER_NAME


def _mark_started(marker: Path | None, *, pid: int) -> bool:
    """Whether the marker is written."""
    from orchestrator.files import replace_file

    if marker is None:
        return False
    record = {"at": datetime.now(timezone.utc).isoformat(), "pid": pid}
    try:
        replace_file(marker, (json.dumps(record) + "\n").encode())
    except OSError as exc:  # the night runs all the same; only a crash in its first seconds would go unseen
        _logger().warning("scheduled_night_not_marked", path=str(marker), error=_first_line(exc))
        return False
    return True


def _unmark_started(marker: Path | None) -> None:
    if marker is not None:
        with contextlib.suppress(OSError):
            marker.unlink(missing_ok=True)


def _started_before_its_run(config: Config, now: datetime | None) -> datetime | None:
    """The fire time of a night serve started (its marker left behind) that recorded no run and whose
    child is gone: it died with serve as it started up. None otherwise."""
    from orchestrator.commands import pid_alive
    from orchestrator.files import read_regular_file

    try:
        record = json.loads(read_regular_file(config.state_dir / STARTED_MARKER_NAME).decode("utf-8"))
        started, pid = datetime.fromisoformat(record["at"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    fired = _fire_within_grace(config, now)
    if fired is None or started < fired or (pid and pid_alive(pid, started)):
        return None  # an earlier fire's, or its child still starts up (serve alone died): it will record its run
    return fired


def _interrupted_night(config: Config, now: datetime | None = None) -> datetime | None:
    """The fire time of a night that began within the grace and died without ending (power lost,
    serve and night killed together): its fire time, for serve to run it again now. None otherwise."""
    from orchestrator.commands import pid_alive

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


def _cancelled_by_signal(exit_code: int) -> bool:
    """Whether `overnight run` exited as a SIGHUP, SIGINT or SIGTERM cancelled it (129, 130, 143)."""
    from orchestrator.night import SIGNAL_EXIT_CODES

    return exit_code in SIGNAL_EXIT_CODES.values()


def _run_id_of(config_path: str, pid: int) -> int | None:
    """The run the child recorded: its state dir's latest run, if that process began it (not when it exited early)."""
    from orchestrator.build import open_store

    try:
        config = load_config(Path(config_path), require_tasks=False)
        store = open_store(config)
        try:
            # In a store several state dirs share, the latest run may be another machine's night.
            latest = store.latest_run(state_id=state_identity(config.state_dir, create=False))
        finally:
            store.close()
    except Exception:  # the run id is a detail of a log line; the night has ended either way
        return None
    return latest.id if latest is not None and latest.pid == pid else None


def build_scheduler(
    config: Config, config_path: Path, *, blocking: bool = True, job: str = NIGHT_JOB, log_format: str = "auto"
) -> BaseScheduler:
    """A scheduler holding the night job in the run store's database; not started.

    `job` is the import path of what a fire calls; tests point it at a marker.
    """
    zone = schedule_timezone(config)
    trigger = night_trigger(config, zone)
    store = _job_store(config)
    scheduler_class = _ForegroundScheduler if blocking else _BackgroundScheduler
    scheduler = scheduler_class(
        jobstores={"default": store},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": config.schedule.misfire_grace_s},
        timezone=zone,
    )
    extra: dict[str, Any] = {}
    pending = _stored_next_run_time(store, trigger)
    interrupted = _interrupted_night(config)
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
    scheduler.add_listener(_log_unusual_fire, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
    return scheduler


def serve(config_path: Path, stop: StopNoted | None = None) -> int:
    """Run the scheduler in the foreground until SIGTERM, SIGINT or SIGHUP; 0 on a clean stop.

    The signal is passed on to the night in flight, and `serve` waits for its rollback and exit.
    `stop`: where a signal that came while serve starts up is noted; the scheduler then starts no night.
    LockHeld (exit 75) when another `serve` holds the state dir's `serve.lock`.
    """
    from orchestrator.build import check_inputs, open_store

    config = load_config(config_path)
    night_trigger(config, schedule_timezone(config))  # a bad [schedule]: exit 2 before the state dir is made
    # What every night would refuse (no repository, a state dir in its checkout or .git, a check's
    # program not on PATH): exit 2 now, before serve's lock and job store are made, not each night.
    check_inputs(config)
    # Before the job store is read: a second serve must neither replace the job nor run it.
    with StateLock(config.state_dir, name=SERVE_LOCK_NAME, holder_kind="overnight serve"):
        # Opened as `run` opens it, before the job store touches the database: a database that is
        # not overnight's (another program's `runs` table) is StateError (exit 4), nothing added to it.
        open_store(config).close()
        return _serve_locked(config, config_path, stop or StopNoted())


def _serve_locked(config: Config, config_path: Path, stop: StopNoted) -> int:
    """`serve` once it holds the state dir's serve lock: start the scheduler, then stop it on a signal."""
    scheduler = cast(_ForegroundScheduler, build_scheduler(config, config_path, log_format="json" if json_mode() else "human"))
    deferred: list[datetime] = []

    def started(event: object) -> None:
        # The stored job's time, not one computed from now: after a missed night it is due at once.
        job = scheduler.get_job(NIGHT_JOB_ID)
        pending = job.next_run_time if job is not None else None
        _logger().info(
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
    with _stop_on_signals(scheduler, stop), _library_logs_as_events():
        scheduler.start()  # returns once a signal asked to stop
        _logger().info("scheduler_stopping", signal=scheduler.stop_requested)
        scheduler.shutdown(wait=True)  # the night in flight got the signal too: wait for its rollback
        # Still under serve's own handlers: a Ctrl-C held down reaches here too, and must not stop
        # the night that serve's stop ended from being kept due.
        if deferred:
            _keep_due(config, deferred[0])
        _logger().info("scheduler_stopped")
    return 0


@contextlib.contextmanager
def _stop_on_signals(scheduler: _ForegroundScheduler, early: StopNoted) -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP stop the scheduler's loop and reach the night in flight; after, they change nothing.

    `serve` is then leaving with its code (0) decided. The default handlers put back would make a
    late Ctrl-C a KeyboardInterrupt (exit 130) and a late SIGTERM a death by signal. A handler that
    does nothing, not SIG_IGN: an ignored signal stays ignored in every process started after it.
    """
    global _night
    _night = _NightInFlight()

    def stop(signum: int, frame: object) -> None:
        # Runs between two bytecodes of the main thread: no logging here (it may hold the stream's lock).
        _night.stop(signum)
        scheduler.stop_requested = signal.Signals(signum).name

    numbers = stopping_signals()
    for number in numbers:
        signal.signal(number, stop)
    # Asked while serve started up: its loop returns before it processes anything, a night due now included.
    scheduler.stop_requested = scheduler.stop_requested or early.signal
    try:
        yield
    finally:
        for number in numbers:
            signal.signal(number, _changes_nothing)
        _night = _NightInFlight()


def _changes_nothing(signum: int, frame: object) -> None:
    """A stopping signal once serve has stopped: see `_stop_on_signals`."""


def _keep_due(config: Config, run_time: datetime) -> None:
    """Put back the fire time of a night serve's stop ended, so that the next `serve` starts it (within the grace)."""
    store = _job_store(config)
    try:
        job = store.lookup_job(NIGHT_JOB_ID)
        if job is not None:
            job.next_run_time = run_time
            store.update_job(job)
    finally:
        store.shutdown()
    _logger().info("scheduled_night_kept_due", scheduled_for=run_time.isoformat())


class _LibraryWarnings(logging.Handler):
    """APScheduler's own warnings and errors as our events: stderr stays JSON lines in JSON mode."""

    # Already logged under stable names by `_log_unusual_fire`: missed, refused (overlap), failed.
    _COVERED = ("Run time of job ", "Execution of job ", 'Job "')

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(self._COVERED):
            return
        details: dict[str, Any] = {"logger": record.name, "message": (record.getMessage().splitlines() or [""])[0]}
        if record.exc_info and record.exc_info[1] is not None:
            details["error"] = _first_line(record.exc_info[1])
        log = _logger()
        (log.error if record.levelno >= logging.ERROR else log.warning)("scheduler_library_warning", **details)


@contextlib.contextmanager
def _library_logs_as_events() -> Iterator[None]:
    library = logging.getLogger("apscheduler")
    handler = _LibraryWarnings(logging.WARNING)
    propagate = library.propagate
    library.addHandler(handler)
    library.propagate = False  # not also as plain lines through the root logger
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.propagate = propagate


def _stored_next_run_time(store: SQLAlchemyJobStore, trigger: BaseTrigger) -> datetime | None:
    """When the stored night job is next due, if it keeps the same schedule."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        store.jobs_t.create(store.engine, checkfirst=True)
        stored = store.lookup_job(NIGHT_JOB_ID)
    except SQLAlchemyError as exc:
        raise StateError(f"schedule store {safe_url(str(store.engine.url))}: {_first_line(exc)}") from exc
    except (LookupError, ImportError, AttributeError, ValueError, pickle.UnpicklingError):
        # The stored reference no longer imports: the job is rebuilt from the config.
        return None
    if stored is None or repr(stored.trigger) != repr(trigger):
        return None
    return stored.next_run_time


def schedule_table(config: Config) -> str:
    """The job store's table: its own per state dir in a `[store] url` several may share.

    Every APScheduler runs every job in its table: one table shared by two machines' `serve`
    would start each machine's night on both, with the other's config path.
    """
    if config.store.url is None:  # the state dir's own SQLite file
        return SCHEDULE_TABLE
    make_dir(config.state_dir)
    return f"{SCHEDULE_TABLE}_{state_identity(config.state_dir)}"


def _job_store(config: Config) -> SQLAlchemyJobStore:
    """A job store on the run store's database; SQLite waits for the night's writes instead of failing."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from runs.engine import BUSY_TIMEOUT_MS, postgres_bounds

    url = config.store_url
    parsed = make_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        # As the run store's: a partition would otherwise hang the scheduler's thread, and no night would fire again.
        options["connect_args"] = postgres_bounds(parsed)
    elif parsed.get_backend_name() == "sqlite":
        # The URL's `?timeout=S`, as the run store has it: connect_args would overwrite it.
        options = {} if "timeout" in parsed.query else {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            make_dir(Path(database).expanduser().parent)  # a file in the way: StateError, one line
    try:
        return SQLAlchemyJobStore(url=url, tablename=schedule_table(config), engine_options=options)
    # A driver not installed, a dialect SQLAlchemy does not know, a query argument the driver cannot take.
    except (ImportError, ArgumentError, ValueError, TypeError) as exc:
        raise StateError(f"schedule store {safe_url(url)}: {exc}") from exc


def _log_unusual_fire(event: JobEvent) -> None:
    """Missed, refused and failed fires, as named events instead of APScheduler's stdlib warnings."""
    names = {
        EVENT_JOB_MISSED: "scheduled_night_missed",
        EVENT_JOB_MAX_INSTANCES: "scheduled_night_skipped_overlap",
        EVENT_JOB_ERROR: "scheduled_night_failed",
    }
    details: dict[str, Any] = {"job": event.job_id}
    # A refused (overlapping) fire carries its times as a list (JobSubmissionEvent), the others one.
    run_times = getattr(event, "scheduled_run_times", None) or [getattr(event, "scheduled_run_time", None)]
    if run_times[-1] is not None:
        details["scheduled_for"] = run_times[-1].isoformat()
    exception = getattr(event, "exception", None)
    if exception is not None:
        details["error"] = _first_line(exception)
    _logger().warning(names.get(event.code, "scheduled_night_event"), **details)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


__all__ = [
    "NIGHT_JOB_ID",
    "SCHEDULE_TABLE",
    "SERVE_LOCK_NAME",
    "build_scheduler",
    "run_scheduled_night",
    "serve",
]
