"""`overnight serve`: the night job in the run store's database, its zone, misfires and restarts."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import pty
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import zoneinfo
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, EVENT_SCHEDULER_STARTED
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.combining import OrTrigger
from sqlalchemy import event
from sqlalchemy.engine import Engine
from structlog.testing import capture_logs

from orchestrator.build import open_store
from orchestrator.config import Config, load_config
from orchestrator.errors import ConfigError
from orchestrator.lock import state_identity
from orchestrator.crontab import crontab_trigger, crontab_weekdays, fire_times, next_fire_times
from orchestrator.night_child import _run_id_of
from orchestrator.schedule import NIGHT_JOB_ID, build_scheduler, run_scheduled_night, serve
from orchestrator.schedule_events import library_logs_as_events
from orchestrator.schedule_store import SCHEDULE_TABLE
from orchestrator.scripted import Reply, call
from tests.conftest import git, make_repo, sighup_at_its_default, write_config
from tests.test_night import FIX

ROOT = Path(__file__).resolve().parents[1]

MARKER_JOB = "tests.test_schedule:marker_job"
FIRED_LOG = "fired.log"


def marker_job(config_path: str, log_format: str = "auto") -> int:
    """Stands in for a night: one line per fire, next to the config."""
    with open(Path(config_path).parent / FIRED_LOG, "a", encoding="utf-8") as fired:
        fired.write("fired\n")
    return 0


SLOW_MARKER_JOB = "tests.test_schedule:slow_marker_job"


def slow_marker_job(config_path: str, log_format: str = "auto") -> int:
    """A night that lasts: the next fire finds it still running."""
    marker_job(config_path, log_format)
    time.sleep(3)
    return 0


def write_schedule_config(folder: Path, *, cron: str = "30 1 * * *", zone: str = "UTC", grace_s: int = 3600) -> Path:
    """A config whose [repo] path is its own folder, a repository with one commit (serve checks it as run does)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / ".git").exists():
        make_repo(folder, {"README": "scheduled\n"})
    path = folder / "overnight.toml"
    path.write_text(
        "[state]\n"
        'dir = "state"\n\n'
        "[schedule]\n"
        f'cron = "{cron}"\n'
        f'timezone = "{zone}"\n'
        f"misfire_grace_s = {grace_s}\n\n"
        "[[task]]\n"
        'name = "noop"\n'
        'prompt = "nothing"\n'
        'check = "true"\n',
        encoding="utf-8",
    )
    return path


def load(path: Path) -> Config:
    return load_config(path)


def stored_jobs(config: Config) -> list[tuple[str, float | None]]:
    database = config.store_url.removeprefix("sqlite:///")
    with sqlite3.connect(database) as connection:
        return connection.execute(f"SELECT id, next_run_time FROM {SCHEDULE_TABLE}").fetchall()


def stored_trigger(config: Config) -> Any:
    """The night job's trigger as the job store pickled it (read without a scheduler, which would replace it)."""
    database = config.store_url.removeprefix("sqlite:///")
    with sqlite3.connect(database) as connection:
        [(state,)] = connection.execute(f"SELECT job_state FROM {SCHEDULE_TABLE}").fetchall()
    return pickle.loads(state)["trigger"]


def store_job_due_at(path: Path, due: datetime) -> None:
    """A scheduler that ran before the host went down, leaving the night due at `due`."""
    before = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
    before.start(paused=True)
    before.modify_job(NIGHT_JOB_ID, next_run_time=due)
    before.shutdown()


def start_and_wait_for(scheduler: BaseScheduler, mask: int, timeout_s: float = 10.0) -> bool:
    """Start `scheduler`, wait for the first event in `mask`, then stop it with its jobs finished."""
    seen = threading.Event()
    scheduler.add_listener(lambda event: seen.set(), mask)
    scheduler.start()
    try:
        return seen.wait(timeout_s)
    finally:
        scheduler.shutdown(wait=True)


def fires(folder: Path) -> int:
    log = folder / FIRED_LOG
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


def serve_signalled_while_picking_up(path: Path, *, store_fails: bool = False) -> list[dict[str, Any]]:
    """`serve` in this process, sent SIGTERM while it reads the due jobs: past its stop check, before it submits.

    With `store_fails`, that read also fails, as a locked or unreachable database would.
    """
    sent: list[bool] = []

    def signal_once(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not sent and SCHEDULE_TABLE in statement and "next_run_time <=" in statement:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            if store_fails:
                raise RuntimeError("database is locked")

    event.listen(Engine, "before_cursor_execute", signal_once)
    fallback = threading.Timer(20, os.kill, (os.getpid(), signal.SIGTERM))  # never hang if the read is not seen
    fallback.start()
    try:
        with capture_logs() as logs:
            assert serve(path) == 0
    finally:
        fallback.cancel()
        event.remove(Engine, "before_cursor_execute", signal_once)
    assert sent
    return logs


def night_config(tmp_path: Path, repo: Path, server: Any, **model: Any) -> Path:
    """A real night's config (scripted model server, real repository) with a [schedule] section."""
    return write_config(
        tmp_path / "overnight.toml", api_base=server.url, repo=repo, model=model or None,
        extra='[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\nmisfire_grace_s = 3600\n',
    )


def serve_process(path: Path, stderr: Any, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`overnight serve --log-format json`, as a service manager starts it (with `env` added to ours, SIGHUP at its default)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(path), "--log-format", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", **(env or {})},
        preexec_fn=sighup_at_its_default,
    )


def wait_until(condition: Any, process: subprocess.Popen[bytes], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"serve exited before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s}s"
        time.sleep(0.05)


def stop_leftovers(process: subprocess.Popen[bytes], path: Path) -> None:
    """Kill serve and its night if a test left them running (the night is in its own process group)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
        if not connection.execute("SELECT name FROM sqlite_master WHERE name = 'runs'").fetchall():
            return
        pids = [pid for (pid,) in connection.execute("SELECT pid FROM runs WHERE status = 'running'")]
    for pid in pids:
        try:
            if b"orchestrator.cli" in Path(f"/proc/{pid}/cmdline").read_bytes():  # still our night, not a reused pid
                os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def serve_then_signal(
    path: Path, ready: Any, what: str, signum: int = signal.SIGTERM, env: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """`serve` until `ready(its log so far)`, then `signum` to serve's pid alone: its exit code and log lines."""
    log_path = path.parent / "serve.log"
    with open(log_path, "wb") as log:
        process = serve_process(path, log, env)
    try:
        wait_until(lambda: ready(log_path.read_text(encoding="utf-8")), process, what)
        process.send_signal(signum)
        code = process.wait(timeout=20)
    finally:
        stop_leftovers(process, path)
    return code, json_lines(log_path.read_text(encoding="utf-8"))


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text` parsed; the test fails naming any line that is not JSON."""
    lines = [line for line in text.replace("\r\n", "\n").splitlines() if line.strip()]
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not not_json, not_json
    return [json.loads(line) for line in lines]


def zone_file(name: str) -> Path:
    """The host's zone database file for `name`; the test is skipped where there is none."""
    from zoneinfo import TZPATH

    for folder in TZPATH:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.skip(f"no zone database file for {name}")


def serve_cli(path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`overnight serve` run to its end (or 60 s), its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(path), *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def documented_blocks(document: str, fence: str) -> list[list[str]]:
    """The lines of each ```<fence> block of `document` (a path from the project root)."""
    text = (ROOT / document).read_text(encoding="utf-8")
    return [block.split("\n```", 1)[0].splitlines() for block in text.split(f"```{fence}\n")[1:]]


def read_all(fd: int, into: bytearray) -> None:
    """Read a pty until every writer has closed it (Linux then answers EIO)."""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            return
        if not chunk:
            return
        into.extend(chunk)


class TestJobStore:
    def test_night_job_is_stored_in_the_run_store_database(self, tmp_path: Path) -> None:
        """The night job lands in its own table of state/runs.db, under the stable id."""
        path = write_schedule_config(tmp_path)
        scheduler = build_scheduler(load(path), path, blocking=False)
        scheduler.start(paused=True)
        scheduler.shutdown()

        config = load(path)
        assert config.store_url == f"sqlite:///{tmp_path / 'state' / 'runs.db'}"
        assert [job_id for job_id, _ in stored_jobs(config)] == [NIGHT_JOB_ID]

    def test_state_dirs_sharing_a_store_url_each_schedule_only_their_own_night(self, tmp_path: Path) -> None:
        """Two machines' serve on one `[store] url`, both running: each sees one job, for its own config."""
        shared = f"sqlite:///{tmp_path / 'shared.db'}"
        paths, schedulers = [], []
        try:
            for name in ("a", "b"):
                path = write_schedule_config(tmp_path / name)
                path.write_text(path.read_text(encoding="utf-8") + f'\n[store]\nurl = "{shared}"\n', encoding="utf-8")
                scheduler = build_scheduler(load(path), path, blocking=False)
                scheduler.start(paused=True)
                paths.append(path)
                schedulers.append(scheduler)
            for path, scheduler in zip(paths, schedulers):
                [job] = scheduler.get_jobs()
                assert job.id == NIGHT_JOB_ID and job.args[0] == str(path.resolve())
        finally:
            for scheduler in schedulers:
                scheduler.shutdown()

    def test_restarting_the_scheduler_keeps_one_job(self, tmp_path: Path) -> None:
        """A second scheduler on the same database replaces the job instead of adding another."""
        path = write_schedule_config(tmp_path)
        for _ in range(2):
            scheduler = build_scheduler(load(path), path, blocking=False)
            scheduler.start(paused=True)
            scheduler.shutdown()

        assert len(stored_jobs(load(path))) == 1

    def test_a_pending_time_the_old_zone_rules_put_off_is_kept_through_a_zone_database_update(self, tmp_path: Path) -> None:
        """A night stored at 03:30 because the zone skipped 02:30 that night still starts at 03:30 by the clock after an
        update of the zone database that dropped the clock change: worked out again from the restart, a restart between
        02:30 and 03:30 would skip the night, and an hour late once is the lesser harm (docs/scheduling.md)."""
        before, after = tmp_path / "zones-before" / "Overnight", tmp_path / "zones-after" / "Overnight"
        before.mkdir(parents=True)
        after.mkdir(parents=True)
        (before / "Zone").write_bytes(zone_file("America/Chicago").read_bytes())  # clocks forward on March's 2nd Sunday
        (after / "Zone").write_bytes(zone_file("America/Regina").read_bytes())  # the same standard time, no changes
        today = datetime.now(timezone.utc)
        year = today.year if today < datetime(today.year, 3, 1, tzinfo=timezone.utc) else today.year + 1
        day = 8 + (6 - datetime(year, 3, 8).weekday()) % 7  # March's second Sunday
        path = write_schedule_config(tmp_path, cron=f"30 2 {day} 3 *", zone="Overnight/Zone")
        zones_of_this_process = zoneinfo.TZPATH
        def next_run_time_with_zones_from(zones: Path) -> str:
            zoneinfo.reset_tzpath(to=[str(zones)])
            ZoneInfo.clear_cache(only_keys=["Overnight/Zone"])
            scheduler = build_scheduler(load(path), path, blocking=False)
            scheduler.start(paused=True)
            try:
                return scheduler.get_job(NIGHT_JOB_ID).next_run_time.isoformat()
            finally:
                scheduler.shutdown()

        try:
            stored = next_run_time_with_zones_from(before.parent)
            restarted = next_run_time_with_zones_from(after.parent)
        finally:
            zoneinfo.reset_tzpath(to=zones_of_this_process)
            ZoneInfo.clear_cache(only_keys=["Overnight/Zone"])

        assert (stored, restarted) == (f"{year}-03-{day:02d}T03:30:00-05:00", f"{year}-03-{day:02d}T03:30:00-06:00")

    def test_a_pending_time_in_the_repeated_hour_written_in_another_zone_is_kept(self, tmp_path: Path) -> None:
        """A pending fire time still to come in the hour the clocks repeat is kept when it was written in UTC: it is the same
        instant as the trigger's, though Python never finds a time there equal to one of another tzinfo."""
        path = write_schedule_config(tmp_path, cron="30 2 * * *", zone="Europe/Berlin")
        today = datetime.now(timezone.utc)
        year = today.year if today < datetime(today.year, 10, 1, tzinfo=timezone.utc) else today.year + 1
        day = 31 - (datetime(year, 10, 31).weekday() + 1) % 7  # October's last Sunday: 03:00 goes back to 02:00
        due = datetime(year, 10, day, 2, 30, tzinfo=ZoneInfo("Europe/Berlin")).astimezone(timezone.utc)  # the first 02:30
        store_job_due_at(path, due)

        scheduler = build_scheduler(load(path), path, blocking=False)
        scheduler.start(paused=True)
        job = scheduler.get_job(NIGHT_JOB_ID)
        scheduler.shutdown()

        assert job.next_run_time == due

    def test_a_changed_cron_reschedules_the_stored_job(self, tmp_path: Path) -> None:
        """Editing [schedule] cron moves the stored job to the new time at the next start."""
        path = write_schedule_config(tmp_path, cron="30 1 * * *")
        first = build_scheduler(load(path), path, blocking=False)
        first.start(paused=True)
        first.shutdown()

        path = write_schedule_config(tmp_path, cron="15 4 * * *")
        second = build_scheduler(load(path), path, blocking=False)
        second.start(paused=True)
        job = second.get_job(NIGHT_JOB_ID)
        second.shutdown()

        assert (job.next_run_time.hour, job.next_run_time.minute) == (4, 15)
        assert len(stored_jobs(load(path))) == 1


class TestTimezone:
    def test_trigger_carries_the_configured_zone(self, tmp_path: Path) -> None:
        """The stored job's trigger uses [schedule] timezone, not the host's zone."""
        path = write_schedule_config(tmp_path, zone="Asia/Tokyo")
        scheduler = build_scheduler(load(path), path, blocking=False)
        scheduler.start(paused=True)
        job = scheduler.get_job(NIGHT_JOB_ID)
        scheduler.shutdown()

        assert job.trigger.timezone == ZoneInfo("Asia/Tokyo")
        assert job.next_run_time == next_fire_times(load(path), 1)[0]

    def test_the_same_cron_fires_at_different_utc_times_per_zone(self, tmp_path: Path) -> None:
        """01:30 in New York and 01:30 in Tokyo are different instants."""
        now = datetime(2026, 1, 15, 12, 0, tzinfo=timezone.utc)
        new_york = load(write_schedule_config(tmp_path / "ny", zone="America/New_York"))
        tokyo = load(write_schedule_config(tmp_path / "tokyo", zone="Asia/Tokyo"))

        assert next_fire_times(new_york, 1, now=now)[0].astimezone(timezone.utc) == datetime(
            2026, 1, 16, 6, 30, tzinfo=timezone.utc
        )
        assert next_fire_times(tokyo, 1, now=now)[0].astimezone(timezone.utc) == datetime(
            2026, 1, 15, 16, 30, tzinfo=timezone.utc
        )

    def test_next_fire_times_lists_consecutive_nights(self, tmp_path: Path) -> None:
        """Three fire times, one a day apart, all in the configured zone."""
        config = load(write_schedule_config(tmp_path, zone="Europe/Berlin"))
        now = datetime(2026, 3, 10, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))

        times = next_fire_times(config, 3, now=now)

        assert [moment.day for moment in times] == [11, 12, 13]
        assert all((moment.hour, moment.minute) == (1, 30) for moment in times)

    def test_crontab_weekday_numbers_keep_their_crontab_meaning(self, tmp_path: Path) -> None:
        """"1-5" fires Monday to Friday (APScheduler 3 alone would read Tuesday to Saturday)."""
        config = load(write_schedule_config(tmp_path, cron="30 1 * * 1-5"))
        monday = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)

        weekdays = [moment.strftime("%a") for moment in next_fire_times(config, 6, now=monday)]

        assert weekdays == ["Tue", "Wed", "Thu", "Fri", "Mon", "Tue"]
        assert crontab_weekdays("0,7") == "sun"
        assert crontab_weekdays("*/3") == "sun,wed,sat"
        assert crontab_weekdays("1/2") == "mon,wed,fri"  # from 1 to the week's end, stepping 2
        assert crontab_weekdays("mon-fri") == "mon,tue,wed,thu,fri"

    def test_a_range_of_names_from_sunday_means_what_crontab_means(self, tmp_path: Path) -> None:
        """`sun-thu` was refused (exit 2, from `run` too): APScheduler 3 counts Sunday last."""
        config = load(write_schedule_config(tmp_path, cron="30 1 * * sun-thu"))
        friday = datetime(2026, 1, 9, 12, 0, tzinfo=timezone.utc)
        weekdays = [moment.strftime("%a") for moment in next_fire_times(config, 6, now=friday)]
        assert weekdays == ["Sun", "Mon", "Tue", "Wed", "Thu", "Sun"]
        assert crontab_weekdays("sat-sun") == "sat,sun"  # as APScheduler read it before: kept
        with pytest.raises(ValueError, match="ends before it starts"):
            crontab_weekdays("fri-mon")

    def test_the_repeated_hour_of_a_fall_back_fires_once(self, tmp_path: Path) -> None:
        """When New York's clocks go back, 01:30 happens twice; the night starts at the first only, as cron's would."""
        config = load(write_schedule_config(tmp_path, zone="America/New_York"))
        before = datetime(2027, 11, 6, 12, 0, tzinfo=ZoneInfo("America/New_York"))

        times = next_fire_times(config, 3, now=before)

        assert [moment.isoformat() for moment in times] == [
            "2027-11-07T01:30:00-04:00",
            "2027-11-08T01:30:00-05:00",
            "2027-11-09T01:30:00-05:00",
        ]
        between = datetime(2027, 11, 7, 5, 45, tzinfo=timezone.utc)  # 01:45 EDT, before the second 01:30
        assert next_fire_times(config, 1, now=between)[0].isoformat() == "2027-11-08T01:30:00-05:00"

    @pytest.mark.parametrize(
        ("zone", "cron", "before", "expected"),
        [
            # The clocks go forward at 02:00 on Sunday 8 March: Monday's 00:30 is a night like any other.
            ("America/New_York", "30 0 * * *", datetime(2027, 3, 13, 12, 0, tzinfo=timezone.utc),
             ["2027-03-14T00:30:00-05:00", "2027-03-15T00:30:00-04:00", "2027-03-16T00:30:00-04:00"]),
            ("Europe/Berlin", "30 0 * * *", datetime(2027, 3, 27, 12, 0, tzinfo=timezone.utc),
             ["2027-03-28T00:30:00+01:00", "2027-03-29T00:30:00+02:00", "2027-03-30T00:30:00+02:00"]),
            # Santiago's clocks go from 00:00 to 01:00: 00:30 does not exist that night, and starts an hour later by the clock.
            ("America/Santiago", "30 0 * * *", datetime(2027, 9, 3, 12, 0, tzinfo=timezone.utc),
             ["2027-09-04T00:30:00-04:00", "2027-09-05T01:30:00-03:00", "2027-09-06T00:30:00-03:00"]),
            ("America/New_York", "30 2 * * *", datetime(2027, 3, 13, 12, 0, tzinfo=timezone.utc),
             ["2027-03-14T03:30:00-04:00", "2027-03-15T02:30:00-04:00", "2027-03-16T02:30:00-04:00"]),
        ],
    )
    def test_no_night_is_skipped_when_the_clocks_go_forward(
        self, tmp_path: Path, zone: str, cron: str, before: datetime, expected: list[str]
    ) -> None:
        """Each day of the week the clocks go forward has its night, in serve's stored job as in `--next`
        (APScheduler 3 alone adds 24 hours to step a day, lands an hour late, and skips the next day's 00:30)."""
        path = write_schedule_config(tmp_path, cron=cron, zone=zone)

        assert [moment.isoformat() for moment in next_fire_times(load(path), 3, now=before)] == expected
        scheduler = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
        scheduler.start(paused=True)
        try:
            trigger = scheduler.get_job(NIGHT_JOB_ID).trigger  # unpickled from the job store
            first = datetime.fromisoformat(expected[0])
            assert trigger.get_next_fire_time(first, first).isoformat() == expected[1]
        finally:
            scheduler.shutdown()

    @pytest.mark.parametrize(
        ("zone", "cron", "before", "expected"),
        [
            # Lord Howe's clocks go forward half an hour at 02:00: 02:00 and 02:20 run at 02:30 and 02:50, 02:40 between them.
            ("Australia/Lord_Howe", "*/20 * * * *", datetime(2027, 10, 2, 15, 10, tzinfo=timezone.utc),
             ["2027-10-03T01:40:00+10:30", "2027-10-03T02:30:00+11:00", "2027-10-03T02:40:00+11:00",
              "2027-10-03T02:50:00+11:00", "2027-10-03T03:00:00+11:00"]),
            # Chatham's go from 02:45 to 03:45: 03:00 and 03:15 run at 04:00 and 04:15, after the 03:45 that exists.
            ("Pacific/Chatham", "*/15 3 * * *", datetime(2027, 9, 25, 12, 0, tzinfo=timezone.utc),
             ["2027-09-26T03:45:00+13:45", "2027-09-26T04:00:00+13:45", "2027-09-26T04:15:00+13:45",
              "2027-09-26T04:30:00+13:45", "2027-09-27T03:00:00+13:45"]),
        ],
    )
    def test_a_time_after_the_skipped_ones_runs_before_them(
        self, tmp_path: Path, zone: str, cron: str, before: datetime, expected: list[str]
    ) -> None:
        """A time that exists and runs before the skipped times the clocks moved past it is not lost (it was: the
        trigger returned the first match by the clock, a skipped one, and the next call began after it)."""
        path = write_schedule_config(tmp_path, cron=cron, zone=zone)

        assert [moment.isoformat() for moment in next_fire_times(load(path), 5, now=before)] == expected

    @pytest.mark.parametrize(
        ("zone", "year"),
        [(zone, 2027) for zone in ("America/New_York", "Europe/Berlin", "America/Santiago", "Australia/Lord_Howe",
                                   "America/Nuuk", "Africa/Cairo", "Pacific/Chatham", "UTC")]
        # A leap year and the 2030s; half-hour and 45-minute offsets; the southern hemisphere; tzdata's negative DST (Dublin)
        # and Casablanca's hour back for Ramadan; zones in the year they last changed or abolished their rules (Apia's
        # whole skipped day in 2011).
        + [("Australia/Lord_Howe", 2028), ("Pacific/Chatham", 2032), ("Asia/Kathmandu", 2028), ("America/Santiago", 2030),
           ("Pacific/Auckland", 2028), ("Europe/Dublin", 2028), ("Africa/Casablanca", 2028), ("Africa/Casablanca", 2035),
           ("America/St_Johns", 2036), ("America/Mexico_City", 2022), ("Asia/Amman", 2022), ("Pacific/Apia", 2011),
           ("Antarctica/Troll", 2039)],
    )
    def test_fire_times_are_crontabs_minute_by_minute(self, zone: str, year: int) -> None:
        """Within a day of each of the year's clock changes, each cron fires at the minutes a minute-by-minute walk of the
        zone's clock matches (first pass of a repeated time; a skipped one on the offset before the change), whether
        the scheduler wakes at the fire or later."""
        tz = ZoneInfo(zone)
        hours = [datetime(year, 1, 1, tzinfo=timezone.utc) + timedelta(hours=hour) for hour in range(365 * 24)]
        offsets = [(hour, hour.astimezone(tz).utcoffset()) for hour in hours]
        changes = [later for (_, offset), (later, offset_later) in zip(offsets, offsets[1:]) if offset != offset_later]
        for change in changes or [datetime(year, 3, 28, tzinfo=timezone.utc)]:
            start, end = change - timedelta(days=1), change + timedelta(days=1)
            for cron in ("30 0 * * *", "30 2 * * *", "0 * * * *", "*/15 1-3 * * *", "0 0 1 * *", "0 3 * * 0", "0 0 13 * 5",
                         "*/20 * * * *", "*/15 3 * * *", "0,45 3 * * *", "0 0 * * 7", "30 1 * * *"):
                expected = crontab_by_the_minute(cron, tz, start, end)
                trigger = crontab_trigger(*cron.split(), zone=tz)
                for late in (timedelta(0), timedelta(seconds=30)):
                    fired, previous = [], None
                    while (upcoming := trigger.get_next_fire_time(previous, previous + late if previous else start)) < end:
                        fired.append(upcoming.astimezone(timezone.utc))
                        previous = upcoming
                    assert fired == expected, (zone, cron, late)
                listed = itertools.takewhile(lambda moment: moment < end, fire_times(trigger, start))  # as `--next` lists them
                assert [moment.astimezone(timezone.utc) for moment in listed] == expected

    def test_february_29th_fires_in_each_leap_year(self, tmp_path: Path) -> None:
        """"0 2 29 2 *" is not refused as a day that never comes: it starts on 29 February 2028, 2032 and 2036."""
        config = load(write_schedule_config(tmp_path, cron="0 2 29 2 *", zone="Europe/Berlin"))

        times = next_fire_times(config, 3, now=datetime(2027, 6, 1, tzinfo=timezone.utc))

        assert [moment.isoformat() for moment in times] == [
            "2028-02-29T02:00:00+01:00", "2032-02-29T02:00:00+01:00", "2036-02-29T02:00:00+01:00"]

    def test_a_range_of_month_names_takes_a_step_as_in_crontab(self, tmp_path: Path) -> None:
        """"0 1 1 jan-dec/3 *" starts on the 1st of January, April, July and October, as crontab's does (it was refused
        as names mixed with numbers: APScheduler 3 reads no step after names)."""
        config = load(write_schedule_config(tmp_path, cron="0 1 1 jan-dec/3 *"))

        times = next_fire_times(config, 4, now=datetime(2028, 1, 1, tzinfo=timezone.utc))

        assert [moment.strftime("%d %b") for moment in times] == ["01 Jan", "01 Apr", "01 Jul", "01 Oct"]

    @pytest.mark.parametrize(
        ("weekday", "why"),
        [("7/2", "steps from 7, past the week's last day (6)"), ("6-0", "ends before it starts"), ("8", "is not within 0-7"),
         ("*/0", "steps by 0"), ("sun-sat/0", "steps by 0")],
    )
    def test_a_weekday_refused_says_why(self, tmp_path: Path, weekday: str, why: str) -> None:
        """A weekday field crontab refuses too is refused with its own reason, quoted as written: `7/2`, `6-0` and a step of 0
        were "not within 0-7", `sun-sat/0` quoted as '0-6/0'."""
        config = load(write_schedule_config(tmp_path, cron=f"30 1 * * {weekday}"))

        with pytest.raises(ConfigError, match=re.escape(f"weekday {weekday!r} {why}")):
            next_fire_times(config)

    @pytest.mark.parametrize(
        ("month", "why"),
        [("dec-jan/2", " ends before it starts"), ("Dec-Jan", " ends before it starts"), ("jan-mar/0", ": Increment must be"),
         ("jan-dec/13", ": the step value (13) is higher")],
    )
    def test_a_range_of_month_names_refused_names_the_field_as_written(self, tmp_path: Path, month: str, why: str) -> None:
        """A range of month names refused names the month field and quotes the range as written: APScheduler's reason alone
        named neither, or quoted the numbers it became ('1-12/13')."""
        config = load(write_schedule_config(tmp_path, cron=f"0 1 1 {month} *"))

        with pytest.raises(ConfigError, match=re.escape(f"month {month!r}{why}")):
            next_fire_times(config)

    def test_day_of_month_and_weekday_fire_on_either(self, tmp_path: Path) -> None:
        """"0 1 1 * 1" starts on the 1st of each month and on every Monday (crontab's OR), in the stored job too."""
        path = write_schedule_config(tmp_path, cron="0 1 1 * 1", zone="Europe/Berlin")
        thursday_new_year = datetime(2026, 1, 1, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))

        days = [moment.strftime("%a %d %b") for moment in next_fire_times(load(path), 6, now=thursday_new_year)]

        assert days == ["Mon 05 Jan", "Mon 12 Jan", "Mon 19 Jan", "Mon 26 Jan", "Sun 01 Feb", "Mon 02 Feb"]
        first = build_scheduler(load(path), path, blocking=False)
        first.start(paused=True)
        first.shutdown()
        second = build_scheduler(load(path), path, blocking=False)
        second.start(paused=True)
        stored = second.get_job(NIGHT_JOB_ID)  # unpickled from the job store
        second.shutdown()
        assert isinstance(stored.trigger, OrTrigger)
        assert [part.timezone for part in stored.trigger.triggers] == [ZoneInfo("Europe/Berlin")] * 2


    def test_a_day_field_stepped_from_star_is_not_a_restriction(self, tmp_path: Path) -> None:
        """"30 1 */2 * 1" is Mondays on odd days, as crontab reads a field that starts with `*`: not every
        odd day or Monday, which is what a restricted day of month would make it."""
        config = load(write_schedule_config(tmp_path, cron="30 1 */2 * 1"))
        new_year = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)

        days = [moment.strftime("%a %d") for moment in next_fire_times(config, 3, now=new_year)]

        assert days == ["Mon 05", "Mon 19", "Mon 09"]


class TestServeEvents:
    def test_a_stop_is_logged_as_it_begins_and_as_it_ends(self, tmp_path: Path) -> None:
        """`scheduler_stopping` (`signal`: what asked) as serve begins to wait for a night in flight, then
        `scheduler_stopped`: a pipeline tells a slow stop from a hung one by the first."""
        path = write_schedule_config(tmp_path)
        code, logs = serve_then_signal(path, lambda log: "scheduler_started" in log, "the scheduler's start", signum=signal.SIGINT)
        assert code == 0
        names = [line["event"] for line in logs]
        assert names[names.index("scheduler_started") :] == ["scheduler_started", "scheduler_stopping", "scheduler_stopped"]
        [stopping] = [line for line in logs if line["event"] == "scheduler_stopping"]
        assert stopping["signal"] == "SIGINT"


    def test_the_store_is_named_as_every_other_place_names_it(self, tmp_path: Path) -> None:
        """`scheduler_started`'s `store` is the SQLite file as `report` names it (`café 100%25`), not its URL escaped
        (`caf%C3%A9 100%2525`)."""
        from runs.engine import store_shown

        path = write_schedule_config(tmp_path / "café 100%25")
        code, logs = serve_then_signal(path, lambda log: "scheduler_started" in log, "the scheduler's start", signum=signal.SIGINT)
        assert code == 0
        [started] = [line for line in logs if line["event"] == "scheduler_started"]
        assert started["store"] == store_shown(load(path).store_url) == str(path.parent / "state" / "runs.db")


class TestLocalZone:
    @pytest.mark.parametrize("setting", ["path", ":path"])
    def test_a_local_zone_read_from_a_file_is_stored_by_its_name(self, tmp_path: Path, setting: str) -> None:
        """TZ naming a zone file (TZ=/usr/share/zoneinfo/Europe/Berlin, or with glibc's ':'): serve starts in that zone and stops with 0, no traceback."""
        berlin = zone_file("Europe/Berlin")
        path = write_schedule_config(tmp_path, zone="local")

        code, logs = serve_then_signal(
            path, lambda log: "scheduler_started" in log, "the scheduler's start", env={"TZ": setting.replace("path", str(berlin))}
        )

        assert code == 0
        [started] = [line for line in logs if line["event"] == "scheduler_started"]
        assert started["timezone"] == "Europe/Berlin" and started["next_fire_time"].endswith(("+01:00", "+02:00"))
        assert stored_trigger(load(path)).timezone == ZoneInfo("Europe/Berlin")

    @pytest.mark.parametrize("args", [("--next",), ("--log-format", "json")])
    def test_a_local_zone_file_without_a_name_is_one_line_naming_the_key(self, tmp_path: Path, args: tuple[str, ...]) -> None:
        """TZ naming a zone file outside the zone database: serve and serve --next exit 2, one line asking for an IANA name."""
        copy = tmp_path / "my-zone"
        copy.write_bytes(zone_file("Europe/Berlin").read_bytes())
        path = write_schedule_config(tmp_path, zone="local")

        result = serve_cli(path, *args, env={"TZ": str(copy)})

        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        [line] = result.stderr.strip().splitlines()
        assert "[schedule] timezone" in line and "IANA name" in line and "Traceback" not in line


class TestMisfire:
    def test_several_missed_runs_within_grace_run_once(self, tmp_path: Path) -> None:
        """A restart after missing several fires within the grace time runs the job exactly once."""
        path = write_schedule_config(tmp_path, cron="* * * * *", grace_s=3600)
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(minutes=3))

        after = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
        assert start_and_wait_for(after, EVENT_JOB_EXECUTED)

        assert fires(tmp_path) == 1

    @pytest.mark.parametrize(("grace_s", "expected_fires"), [(3600, 0), (3 * 3600, 1)])
    def test_a_missed_night_runs_only_within_grace(self, tmp_path: Path, grace_s: int, expected_fires: int) -> None:
        """A night missed by two hours is skipped with a one-hour grace and run with a three-hour one."""
        missed = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(second=0, microsecond=0)
        path = write_schedule_config(tmp_path, cron=f"{missed.minute} {missed.hour} * * *", grace_s=grace_s)
        store_job_due_at(path, missed)

        after = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
        with capture_logs() as logs, library_logs_as_events():  # as serve runs it
            assert start_and_wait_for(after, EVENT_JOB_EXECUTED | EVENT_JOB_MISSED)

        assert fires(tmp_path) == expected_fires
        assert any(log["event"] == "scheduled_night_missed" for log in logs) == (expected_fires == 0)
        # Said once, by its own name: not again as APScheduler's line ('Run time of job ... was missed').
        assert "scheduler_library_warning" not in [log["event"] for log in logs]
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run > (datetime.now(timezone.utc) + timedelta(hours=20)).timestamp()


class TestConfigErrors:
    def test_unknown_time_zone_is_one_line_naming_the_key(self, tmp_path: Path) -> None:
        """An unknown zone name fails before anything is stored, naming [schedule] timezone."""
        path = write_schedule_config(tmp_path, zone="Mars/Olympus_Mons")

        with pytest.raises(ConfigError) as raised:
            build_scheduler(load(path), path, blocking=False)

        message = str(raised.value)
        assert "[schedule] timezone: unknown time zone 'Mars/Olympus_Mons'" in message
        assert "\n" not in message
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        "cron",
        ["61 1 * * *", "30 1 * *", "30 1 * * 9", "thirty one * * *", "0 0 30 2 *", "30 1 * * mon-5", "30 1 * jan-5 *"],
    )
    def test_bad_cron_is_one_line_naming_the_key(self, tmp_path: Path, cron: str) -> None:
        """A cron expression that cannot fire fails with one line naming [schedule] cron."""
        config = load(write_schedule_config(tmp_path, cron=cron))

        with pytest.raises(ConfigError) as raised:
            next_fire_times(config)

        message = str(raised.value)
        assert f"[schedule] cron: {cron!r}" in message
        assert "\n" not in message

    @pytest.mark.parametrize(("cron", "field"), [("9" * 5000 + " 1 * * *", "minute"), ("30 1 * * 1/" + "9" * 5000, "weekday"),
                                                 ("30 1 " + "9" * 4000 + " * *", "day")])
    def test_a_number_of_thousands_of_digits_is_too_large_in_a_short_line(self, tmp_path: Path, cron: str, field: str) -> None:
        """Past Python's 4300 digits the line quoted the whole cron and "Exceeds the limit (4300 digits)"; under it,
        APScheduler's reason quoted the number twice: each line ran to pages. Now short, naming the field."""
        config = load(write_schedule_config(tmp_path, cron=cron))

        with pytest.raises(ConfigError) as raised:
            next_fire_times(config)

        message = str(raised.value).removeprefix(str(config.source))
        assert f"[schedule] cron: '{cron[:100]}" in message and f"{field} '" in message and "holds a number too large" in message
        assert len(message) < 300 and "\n" not in message and "4300" not in message

    @pytest.mark.parametrize("cron", ["0 0 30 2 *", "30 1 * * mon-5"])
    @pytest.mark.parametrize("args", [("--next",), ()])
    def test_serve_refuses_a_cron_that_never_fires_or_mixes_names(self, tmp_path: Path, cron: str, args: tuple[str, ...]) -> None:
        """`overnight serve` (and `--next`) with such a cron: one stderr line naming [schedule] cron, exit 2."""
        path = write_schedule_config(tmp_path, cron=cron)

        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(path), *args],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        [line] = result.stderr.strip().splitlines()  # plain, or a JSON line once serve logs JSON
        assert f"[schedule] cron: {cron!r}" in line and "Traceback" not in line

    def test_serve_refuses_a_check_whose_program_is_not_on_path(self, tmp_path: Path) -> None:
        """What every night would refuse is refused once by serve, exit 2 with one line naming the task, before
        its lock and job store are made: not a serve that runs on and fails each night."""
        path = write_schedule_config(tmp_path)
        path.write_text(path.read_text(encoding="utf-8").replace('check = "true"', 'check = "no-such-program-xyz --quick"'), encoding="utf-8")

        result = serve_cli(path)

        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert "'noop'" in line and "'no-such-program-xyz'" in line and "not on PATH" in line
        assert not (tmp_path / "state").exists()

    def test_a_store_query_the_driver_cannot_take_is_a_state_error(self, tmp_path: Path) -> None:
        """The job store's engine on a URL whose query the driver refuses (past the config's check): StateError, one line."""
        from orchestrator.config import StoreConfig
        from orchestrator.errors import StateError

        config = load(write_schedule_config(tmp_path))
        url = f"sqlite:///{tmp_path / 'jobs.db'}?timeout=abc"
        config = config.model_copy(update={"store": StoreConfig.model_construct(url=url)})
        with pytest.raises(StateError, match="schedule store") as caught:
            build_scheduler(config, tmp_path / "overnight.toml", blocking=False, job=MARKER_JOB)
        assert "\n" not in str(caught.value)

    @pytest.mark.parametrize(("query", "busy_timeout_ms"), [("?timeout=0.2", 200), ("", 30_000)])
    def test_the_job_stores_busy_timeout_is_the_urls_own(self, tmp_path: Path, query: str, busy_timeout_ms: int) -> None:
        """`[store] url`'s `?timeout=S` is how long a write waits for another process's (reference.md), in
        serve's job store as in the run store: its own 30 s overwrote the URL's. 30 s when not given."""
        from orchestrator.config import StoreConfig

        config = load(write_schedule_config(tmp_path))
        url = f"sqlite:///{tmp_path / 'jobs.db'}{query}"
        config = config.model_copy(update={"store": StoreConfig.model_construct(url=url)})
        scheduler = build_scheduler(config, tmp_path / "overnight.toml", blocking=False, job=MARKER_JOB)
        engine = scheduler._jobstores["default"].engine
        try:
            with engine.connect() as connection:
                assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == busy_timeout_ms
        finally:
            engine.dispose()

    def test_serve_with_a_state_dir_that_is_a_file_is_one_line_exit_4(self, tmp_path: Path) -> None:
        path = write_schedule_config(tmp_path)
        (tmp_path / "state").write_text("not a folder")
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(path)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 4, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert "a file is in the way" in line and "Traceback" not in line

    def test_serve_on_a_database_whose_runs_table_is_another_programs_is_one_line_exit_4(self, tmp_path: Path) -> None:
        """`[store] url` naming a database with a `runs` table overnight did not make: serve refuses it as
        `run` does (one line, exit 4) before its job store adds its table and index there."""
        database = tmp_path / "theirs.db"
        with sqlite3.connect(database) as connection:
            connection.execute("CREATE TABLE runs(x text)")
        connection.close()
        path = write_schedule_config(tmp_path)
        path.write_text(path.read_text(encoding="utf-8") + f"\n[store]\nurl = 'sqlite:///{database}'\n", encoding="utf-8")

        def tables() -> list[tuple[str, str, str]]:
            with sqlite3.connect(database) as connection:
                found = connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
            connection.close()
            return found

        before = tables()
        with open(tmp_path / "serve.err", "w+b") as stderr:
            process = serve_process(path, stderr)
            try:
                code = process.wait(timeout=60)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            stderr.seek(0)
            lines = stderr.read().decode().strip().splitlines()

        assert code == 4, lines
        [line] = lines
        assert "'runs'" in line and "not overnight's" in line and "Traceback" not in line
        assert "scheduler_started" not in line
        assert tables() == before == [("table", "runs", "CREATE TABLE runs(x text)")]


# crontab's shorthands and the 5 fields cronie reads each as.
SHORTHANDS = {
    "@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *",
}


def shorthand_fire_times(now: datetime, shorthand: str) -> list[str]:
    """The next three fire times of a shorthand in `now`'s zone, worked out by the calendar, not by a trigger."""
    if shorthand == "@hourly":
        hour = now.replace(minute=0, second=0, microsecond=0)
        return [(hour + timedelta(hours=step)).isoformat() for step in (1, 2, 3)]
    wanted = {
        "@daily": lambda day: True, "@midnight": lambda day: True, "@weekly": lambda day: day.isoweekday() == 7,
        "@monthly": lambda day: day.day == 1, "@yearly": lambda day: (day.month, day.day) == (1, 1),
    }[{"@annually": "@yearly"}.get(shorthand, shorthand)]
    day, found = now.date() + timedelta(days=1), []
    while len(found) < 3:
        if wanted(day):
            found.append(datetime(day.year, day.month, day.day, tzinfo=now.tzinfo).isoformat())
        day += timedelta(days=1)
    return found


class TestShorthands:
    @pytest.mark.parametrize("shorthand", list(SHORTHANDS))
    def test_serve_next_prints_a_shorthands_fire_times(self, tmp_path: Path, shorthand: str) -> None:
        """`overnight serve --next` with `cron = "@weekly"` and the like prints the midnights (or hours) crontab runs it at."""
        path = write_schedule_config(tmp_path, cron=shorthand, zone="Asia/Tokyo")
        before = datetime.now(ZoneInfo("Asia/Tokyo"))
        result = serve_cli(path, "--next")
        after = datetime.now(ZoneInfo("Asia/Tokyo"))

        assert result.returncode == 0, result.stderr
        assert result.stdout.split() in (shorthand_fire_times(before, shorthand), shorthand_fire_times(after, shorthand))

    @pytest.mark.parametrize(("shorthand", "fields"), list(SHORTHANDS.items()))
    def test_a_shorthand_fires_as_its_five_fields_across_a_clock_change(self, tmp_path: Path, shorthand: str, fields: str) -> None:
        """Loaded from the config, a shorthand is kept as written and fires when its 5 fields do, the week the clocks go forward
        in Berlin (29 March 2026) included."""
        config = load(write_schedule_config(tmp_path / "short", cron=shorthand, zone="Europe/Berlin"))
        written = load(write_schedule_config(tmp_path / "fields", cron=fields, zone="Europe/Berlin"))
        now = datetime(2026, 3, 28, 22, 30, tzinfo=ZoneInfo("Europe/Berlin"))

        assert config.schedule.cron == shorthand
        assert next_fire_times(config, 6, now=now) == next_fire_times(written, 6, now=now)

    def test_the_loader_reads_daily_as_each_midnight_in_the_zone(self, tmp_path: Path) -> None:
        """`@daily` loaded from the config fires at 00:00 by the zone's clock, on either side of Berlin's clock change."""
        config = load(write_schedule_config(tmp_path, cron="@daily", zone="Europe/Berlin"))
        now = datetime(2026, 3, 28, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))

        assert [moment.isoformat() for moment in next_fire_times(config, 3, now=now)] == [
            "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", "2026-03-31T00:00:00+02:00",
        ]

    @pytest.mark.parametrize(("stored", "now_written"), [("0 0 * * *", "@daily"), ("@daily", "0 0 * * *")])
    def test_a_missed_night_stored_under_the_other_spelling_is_kept(self, tmp_path: Path, stored: str, now_written: str) -> None:
        """A job stored with `0 0 * * *` (an older version's) and a config now saying `@daily` (or back) is one schedule: the
        missed night still due is kept, in the one job, not worked out again from the restart and lost."""
        path = write_schedule_config(tmp_path, cron=stored)
        due = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=10)  # within the grace
        store_job_due_at(path, due)

        path = write_schedule_config(tmp_path, cron=now_written)
        scheduler = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
        scheduler.start(paused=True)
        job = scheduler.get_job(NIGHT_JOB_ID)
        scheduler.shutdown()

        assert job.next_run_time == due
        assert len(stored_jobs(load(path))) == 1

    def test_serve_keeps_the_stored_night_and_logs_the_cron_as_written(self, tmp_path: Path) -> None:
        """`overnight serve` on a config now saying `@daily` starts with the pending night a `0 0 * * *` job left in the
        store (not the next midnight worked out again), and `scheduler_started`'s `cron` is `@daily`, as written."""
        path = write_schedule_config(tmp_path, cron="0 0 * * *")
        tomorrow = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=2)
        store_job_due_at(path, tomorrow)  # after the night a restart would work out: only a kept time is this one

        path = write_schedule_config(tmp_path, cron="@daily")
        code, logs = serve_then_signal(path, lambda log: "scheduler_started" in log, "the scheduler's start", signum=signal.SIGINT)

        assert code == 0
        [started] = [line for line in logs if line["event"] == "scheduler_started"]
        assert (started["cron"], started["next_fire_time"]) == ("@daily", tomorrow.isoformat())
        assert len(stored_jobs(load(path))) == 1

    @pytest.mark.parametrize(
        ("cron", "why"),
        [
            ("@reboot", "@reboot is when the host starts, not a time serve can schedule: write the night's time"),
            ("@Daily", "cron reads its shorthands in lower case only: write @daily"),
            ("@fortnightly", "no such shorthand; write 5 fields (minute hour day month weekday) or one of @hourly, @daily"),
            ("@daily cd /repo && overnight run", "@daily stands for all 5 fields and takes nothing after it"),
        ],
    )
    @pytest.mark.parametrize("args", [("--next",), ()])
    def test_serve_refuses_a_shorthand_cron_does_not_run_saying_why(
        self, tmp_path: Path, cron: str, why: str, args: tuple[str, ...]
    ) -> None:
        """`overnight serve` (and `--next`): exit 2, one line naming [schedule] cron and what to write instead; no state dir."""
        path = write_schedule_config(tmp_path, cron=cron)

        result = serve_cli(path, *args)

        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert f"[schedule] cron: {cron!r}: {why}" in line and "Traceback" not in line
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        ("cron", "why"),
        [
            ("0 @daily * * *", "'0 @daily * * *': hour '@daily': @ starts a shorthand, which stands for all 5 fields alone"),
            ("@d\u0430ily", "'@d\u0430ily': no such shorthand ('\u0430' is U+0430 CYRILLIC SMALL LETTER A, not ASCII); write 5 fields"),
            ("\uff20daily", "'\uff20daily' needs 5 fields (minute hour day month weekday) or @daily and such, got 1 "
             "('\uff20' is U+FF20 FULLWIDTH COMMERCIAL AT, not ASCII)"),
        ],
    )
    def test_a_line_that_reads_as_a_shorthand_but_is_not_says_what_is_wrong(self, tmp_path: Path, cron: str, why: str) -> None:
        """`serve --next` on a shorthand as one of 5 fields, or one with a look-alike letter (Cyrillic а, fullwidth ＠) that its
        quote shows as the real one: the line names the field, or the character (APScheduler's line named neither)."""
        path = write_schedule_config(tmp_path, cron=cron)

        result = serve_cli(path, "--next")

        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert f"[schedule] cron: {why}" in line, line


class TestNight:
    def test_scheduled_night_returns_the_run_exit_code(self, tmp_path: Path) -> None:
        """A night whose config has no tasks exits 2, and the scheduler logs that code."""
        path = tmp_path / "overnight.toml"
        path.write_text('[state]\ndir = "state"\n', encoding="utf-8")

        with capture_logs() as logs:
            code = run_scheduled_night(str(path))

        assert code == 2
        events = [(log["event"], log.get("exit_code")) for log in logs]
        assert events == [("scheduled_night_started", None), ("scheduled_night_finished", 2)]

    def test_the_checkouts_own_modules_are_not_imported_by_the_night(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A night serve starts in the repository's checkout imports overnight's modules, not the project's of the same name (a secrets.py)."""
        checkout = tmp_path / "checkout"
        checkout.mkdir()
        (checkout / "secrets.py").write_text("raise SystemExit(9)  # the project's own settings module\n", encoding="utf-8")
        path = checkout / "overnight.toml"
        path.write_text('[state]\ndir = "state"\n', encoding="utf-8")
        monkeypatch.chdir(checkout)

        assert run_scheduled_night("overnight.toml") == 2  # no tasks: the night's own answer, not the project's module's 9


    def test_a_config_that_is_a_link_is_read_where_it_points_at_the_fire(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """A config link re-pointed to a new version while serve runs, the old one removed (`ln -sfn`, a home-manager
        switch): the next night reads the new one, as `overnight run` would, instead of exiting 2 on a file not found."""
        versions, link = tmp_path / "versions", tmp_path / "overnight.toml"
        versions.mkdir()
        schedule = '[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\n'
        old = write_config(versions / "old.toml", api_base=server.url, repo=repo, extra=schedule)
        link.symlink_to(old)
        scheduler = build_scheduler(load(link), link, blocking=False)
        scheduler.start(paused=True)
        stored = scheduler.get_job(NIGHT_JOB_ID).args  # what each fire is called with, from the job store
        scheduler.shutdown()
        link.unlink()
        link.symlink_to(write_config(versions / "new.toml", api_base=server.url, repo=repo, extra=schedule))
        old.unlink()
        server.enqueue(*FIX)

        with capture_logs() as logs:
            assert run_scheduled_night(*stored) == 0

        assert [log["exit_code"] for log in logs if log["event"] == "scheduled_night_finished"] == [0]

    def test_the_night_is_named_by_its_own_state_dirs_run_in_a_shared_store(self, tmp_path: Path) -> None:
        """With a store several state dirs share, the run serve names is its own state dir's, not one another machine began since."""
        shared = f"sqlite:///{tmp_path / 'shared.db'}"
        configs = {}
        for name in ("ours", "theirs"):
            path = write_schedule_config(tmp_path / name)
            path.write_text(path.read_text(encoding="utf-8") + f'\n[store]\nurl = "{shared}"\n', encoding="utf-8")
            configs[name] = path
            load(path).state_dir.mkdir()
        store = open_store(load(configs["ours"]))
        try:
            ours = store.begin_run(
                config_path=str(configs["ours"]), pid=4242, host=socket.gethostname(),
                state_id=state_identity(load(configs["ours"]).state_dir),
            )
            store.begin_run(
                config_path=str(configs["theirs"]), pid=777, host="other-machine",
                state_id=state_identity(load(configs["theirs"]).state_dir),
            )
        finally:
            store.close()

        assert _run_id_of(str(configs["ours"]), 4242) == ours


def clear_of_the_hour(margin_s: float = 20.0) -> None:
    """Wait past the next hour when it is under `margin_s` away: a test that records a run "this hour" and
    then asks serve about it would otherwise find the next hour's fire the latest (it failed so in CI)."""
    now = datetime.now(timezone.utc)
    left = (now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1) - now).total_seconds()
    if left < margin_s:
        time.sleep(left + 1)


def a_run_this_hour(path: Path, *, status: str, pid: int | None = None) -> int:
    """A run of the config's state dir begun now (after this hour's fire of "0 * * * *"), left `status`."""
    config = load(path)
    store = open_store(config)
    try:
        run = store.begin_run(
            config_path=str(path), pid=pid or os.getpid(), host=socket.gethostname(), state_id=state_identity(config.state_dir)
        )
        if status == "recovered":  # closed by a later night's recovery: crashed, no exit code
            store.close_interrupted_run(run)
        elif status != "running":
            store.finish_run(run, status=status, exit_code=0 if status == "finished" else 1)
    finally:
        store.close()
    return run


def due_when_serve_restarts(path: Path) -> datetime:
    """When a `serve` started now would run the night: the job's next run time once it is built."""
    scheduler = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
    scheduler.start(paused=True)
    try:
        return scheduler.get_job(NIGHT_JOB_ID).next_run_time
    finally:
        scheduler.shutdown()


def begun_at(path: Path, run_id: int, when: datetime) -> None:
    """Rewrite when the run began (the store writes its own clock's now)."""
    from sqlalchemy import update

    from runs.models import Run

    store = open_store(load(path))
    try:
        with store._engine.begin() as connection:
            connection.execute(update(Run).where(Run.id == run_id).values(started_at=when))
    finally:
        store.close()


class TestAFireSeenTwice:
    """The job store records the next fire time only after the night has started: a fire can be seen
    twice (the store failed then, serve retried or was restarted), and a night can die with serve."""

    def test_a_night_this_state_dir_finished_since_the_fire_is_not_run_again(self, tmp_path: Path) -> None:
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        run = a_run_this_hour(path, status="finished")
        with capture_logs() as logs:
            assert run_scheduled_night(str(path)) == 0
        assert [(log["event"], log.get("run_id")) for log in logs] == [("scheduled_night_skipped_done", run)]

    def test_a_fire_named_at_the_first_try_still_finds_its_night_done_after_the_grace(self, tmp_path: Path) -> None:
        """A retry after a long wait for the state lock comes past the misfire grace: the fire it names
        (not one worked out from the time then: none) finds the night a person ran meanwhile, done."""
        from orchestrator.fired_night import finished_tonight

        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=60)
        run = a_run_this_hour(path, status="finished")
        fired = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
        begun_at(path, run, fired + timedelta(minutes=5))
        config = load(path)
        assert finished_tonight(config) is None  # the fire within the grace: none now
        assert finished_tonight(config, fired) == run
        assert finished_tonight(config, fired + timedelta(minutes=10)) is None  # begun before that fire: not its night

    def test_a_night_that_failed_or_began_before_the_fire_is_run(self, tmp_path: Path) -> None:
        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        a_run_this_hour(path, status="crashed")
        path.write_text(path.read_text(encoding="utf-8").split("[[task]]")[0], encoding="utf-8")  # no tasks: the night exits 2 at once
        with capture_logs() as logs:
            assert run_scheduled_night(str(path)) == 2
        assert [log["event"] for log in logs] == ["scheduled_night_started", "scheduled_night_finished"]
        assert "run_id" not in logs[-1]  # the crashed run is not this night's: it recorded none
        assert not (load_config(path, require_tasks=False).state_dir / "serve-night-started").exists()  # seen to end: nothing left for a restart

    def test_a_marker_that_cannot_be_written_is_logged_and_the_night_runs(self, tmp_path: Path) -> None:
        """`serve-night-started` cannot be written (a folder took its name): `scheduled_night_not_marked`
        (`path`, `error`), and the night runs all the same."""
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        path.write_text(path.read_text(encoding="utf-8").split("[[task]]")[0], encoding="utf-8")  # no tasks: the night exits 2 at once
        marker = load_config(path, require_tasks=False).state_dir / "serve-night-started"
        (marker / "in-the-way").mkdir(parents=True)
        with capture_logs() as logs:
            assert run_scheduled_night(str(path)) == 2
        # Once, as the night is about to start: the write with the child's pid is not tried again.
        names = [log["event"] for log in logs]
        assert names == ["scheduled_night_not_marked", "scheduled_night_started", "scheduled_night_finished"], names
        assert logs[0]["path"] == str(marker) and logs[0]["error"]

    def test_a_night_finished_by_a_run_without_a_state_dirs_name_is_not_taken_for_ours(self, tmp_path: Path) -> None:
        """A run recorded without a state dir's name (an older overnight on another machine sharing the store) is not this state dir's night."""
        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        a_run_this_hour(path, status="crashed")  # makes the state dir's name
        store = open_store(load(path))
        try:
            other = store.begin_run(config_path="elsewhere.toml", pid=1, host="old-machine", state_id=None)
            store.finish_run(other, status="finished", exit_code=0)
        finally:
            store.close()
        path.write_text(path.read_text(encoding="utf-8").split("[[task]]")[0], encoding="utf-8")  # no tasks: the night exits 2 at once
        assert run_scheduled_night(str(path)) == 2

    @pytest.mark.parametrize(("status", "due_now"), [("running", True), ("recovered", True), ("crashed", False), ("finished", False)])
    def test_a_night_that_died_with_serve_is_due_again_when_serve_restarts(self, tmp_path: Path, status: str, due_now: bool) -> None:
        """Power lost mid-night: serve and its night die together, the stored fire time already tomorrow's.
        Within the grace, the restarted serve runs the night again (its recovery settles the dead one).
        A night that recorded its own crash (exit 4, a full disk) ended: it was run a second time."""
        from tests.test_faults import dead_pid

        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        store_job_due_at(path, datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
        a_run_this_hour(path, status=status, pid=dead_pid())
        due = due_when_serve_restarts(path)
        this_hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        assert (due == this_hour) is due_now and (due > this_hour) is not due_now

    def test_a_night_running_on_another_host_is_not_taken_for_dead(self, tmp_path: Path) -> None:
        """A state dir two hosts reach (a network file system): a run another host records `running` is not
        known dead by its pid here, and is not run a second time beside it."""
        from tests.test_faults import dead_pid

        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        this_hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        store_job_due_at(path, this_hour + timedelta(hours=1))
        config = load(path)
        store = open_store(config)
        try:
            store.begin_run(config_path=str(path), pid=dead_pid(), host="another-host", state_id=state_identity(config.state_dir))
        finally:
            store.close()
        assert due_when_serve_restarts(path) == this_hour + timedelta(hours=1)

    @pytest.mark.parametrize(("child", "due_now"), [("dead", True), ("alive", False), ("before the fire", False), ("none", False)])
    def test_a_night_that_died_with_serve_before_recording_its_run_is_due_again(
        self, tmp_path: Path, sleeper: subprocess.Popen, child: str, due_now: bool
    ) -> None:
        """Power lost in the night's first seconds (its imports, an embedded model loading, a wait for the
        state lock): no run recorded, the stored fire time already tomorrow's. The marker serve wrote as it
        started the night says so: due again, unless that night's process still lives (serve alone died:
        it records its run), or the marker is an earlier fire's."""
        from orchestrator.night_marker import STARTED_MARKER_NAME, mark_started
        from tests.test_faults import dead_pid

        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        this_hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        store_job_due_at(path, this_hour + timedelta(hours=1))
        marker = load(path).state_dir / STARTED_MARKER_NAME
        if child != "none":
            mark_started(marker, pid=sleeper.pid if child == "alive" else dead_pid())
        if child == "before the fire":
            record = json.loads(marker.read_text(encoding="utf-8"))
            marker.write_text(json.dumps({**record, "at": (this_hour - timedelta(minutes=5)).isoformat()}), encoding="utf-8")
        due = due_when_serve_restarts(path)
        assert (due == this_hour) is due_now and (due > this_hour) is not due_now

    @pytest.mark.parametrize(
        ("zone", "fired"),
        [("Europe/Berlin", datetime(2026, 3, 29, 0, 30, tzinfo=timezone.utc)), ("America/New_York", datetime(2026, 11, 1, 5, 30, tzinfo=timezone.utc))],
    )
    def test_a_night_that_died_on_the_night_the_clocks_change_is_due_again(self, tmp_path: Path, zone: str, fired: datetime) -> None:
        """The grace was counted in the zone's clock time: 40 minutes after the fire, on the night the clocks
        went forward (or back, in New York: the fire is in the repeated hour), the dead night was lost."""
        from orchestrator.fired_night import interrupted_night
        from tests.test_faults import dead_pid

        path = write_schedule_config(tmp_path / "night", cron="30 1 * * *", zone=zone, grace_s=3600)
        run = a_run_this_hour(path, status="running", pid=dead_pid())
        begun_at(path, run, fired + timedelta(seconds=5))
        due = interrupted_night(load(path), now=fired + timedelta(minutes=40))
        assert due is not None and due.timestamp() == fired.timestamp()  # an hour that happens twice equals no other zone's
        assert interrupted_night(load(path), now=fired + timedelta(minutes=61)) is None

    def test_a_dead_nights_pid_taken_by_another_process_after_a_reboot_is_not_the_night(self, tmp_path: Path) -> None:
        """Pids are handed out again after a reboot: a shell holding the dead night's pid kept it `alive`."""
        from orchestrator.fired_night import interrupted_night

        clear_of_the_hour()
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=7200)
        fired = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        if datetime.now(timezone.utc) - fired < timedelta(minutes=2):
            fired -= timedelta(hours=1)  # a run that began 1 minute after the fire must lie in the past
        newcomer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            run = a_run_this_hour(path, status="running", pid=newcomer.pid)
            begun_at(path, run, fired + timedelta(seconds=60))
            assert interrupted_night(load(path), now=fired + timedelta(minutes=5)) == fired  # not the next hour's fire, should the clock pass it
            begun_at(path, run, datetime.now(timezone.utc))  # the process began before the record: the night's own
            assert interrupted_night(load(path)) is None
        finally:
            newcomer.kill()
            newcomer.wait()

    def test_a_lock_held_at_the_fire_is_waited_out_within_the_grace(
        self, tmp_path: Path, repo: Path, server: Any, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
    ) -> None:
        """An `overnight gc` from cron at the night's minute held the state dir: the night exited 75 and was
        lost until tomorrow's fire. It is tried again, and the one line names gc as the holder."""
        import orchestrator.schedule as schedule
        from orchestrator.lock import StateLock

        monkeypatch.setattr(schedule, "LOCKED_RETRY_S", 0.5)
        path = night_config(tmp_path, repo, server)
        server.enqueue(*FIX)
        lock = StateLock(load(path).state_dir, command="overnight gc").__enter__()
        threading.Timer(4.0, lock.__exit__, (None, None, None)).start()
        with capture_logs() as logs:
            assert run_scheduled_night(str(path), log_format="json") == 0
        assert "another overnight gc holds" in capfd.readouterr().err
        events = [log["event"] for log in logs]
        assert events[:3] == ["scheduled_night_started", "scheduled_night_finished", "scheduled_night_waits_for_lock"]
        assert events[-2:] == ["scheduled_night_started", "scheduled_night_finished"]
        assert [log["exit_code"] for log in logs if log["event"] == "scheduled_night_finished"][0] == 75

    def test_a_stop_while_the_lock_is_waited_for_ends_the_wait_at_once(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """SIGTERM to serve between two tries of a locked state dir: the night stays due (None) at once, not
        after the rest of the minute's wait (a service manager's stop timeout may run out first)."""
        import orchestrator.night_child as night_child
        import orchestrator.schedule as schedule
        from orchestrator.lock import StateLock

        monkeypatch.setattr(schedule, "LOCKED_RETRY_S", 30.0)
        monkeypatch.setattr(night_child, "_night", night_child.NightInFlight())  # serve's own, as stop_on_signals makes it
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=3600)
        outcome: list[int | None] = []
        with StateLock(load(path).state_dir), capture_logs() as logs:
            waiting = threading.Thread(target=lambda: outcome.append(run_scheduled_night(str(path))))
            waiting.start()
            deadline = time.monotonic() + 60
            while "scheduled_night_waits_for_lock" not in [log["event"] for log in logs] and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped = time.monotonic()
            night_child.night_in_flight().stop(signal.SIGTERM)
            waiting.join(10)
        assert outcome == [None] and time.monotonic() - stopped < 5

    def test_a_serve_that_dies_while_it_waits_for_the_lock_leaves_the_night_due(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Power lost (or kill -9) while serve waits out another process's lock: tomorrow's fire time is stored,
        the child that exited 75 recorded no run, and its marker was removed as it ended, so the restarted
        serve had nothing to find and the night was lost (found by a review). The marker stays through the
        wait: a serve started then runs the night at once. Gone once the night has ended."""
        import orchestrator.night_child as night_child
        import orchestrator.schedule as schedule
        from orchestrator.fired_night import interrupted_night
        from orchestrator.lock import StateLock
        from orchestrator.night_marker import STARTED_MARKER_NAME

        clear_of_the_hour(margin_s=60)
        monkeypatch.setattr(schedule, "LOCKED_RETRY_S", 30.0)
        monkeypatch.setattr(night_child, "_night", night_child.NightInFlight())  # serve's own, as stop_on_signals makes it
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=3600)
        this_hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        outcome: list[int | None] = []
        with StateLock(load(path).state_dir), capture_logs() as logs:
            waiting = threading.Thread(target=lambda: outcome.append(run_scheduled_night(str(path))))
            waiting.start()
            try:
                deadline = time.monotonic() + 60
                while "scheduled_night_waits_for_lock" not in [log["event"] for log in logs] and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert interrupted_night(load(path)) == this_hour  # what a serve started now would run at once
            finally:
                night_child.night_in_flight().stop(signal.SIGTERM)
                waiting.join(10)
        assert outcome == [None] and not (load(path).state_dir / STARTED_MARKER_NAME).exists()

    def test_a_lock_held_past_the_grace_is_the_nights_75(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        import orchestrator.schedule as schedule
        from orchestrator.lock import StateLock

        monkeypatch.setattr(schedule, "LOCKED_RETRY_S", 0.2)
        path = write_schedule_config(tmp_path / "night", cron="0 * * * *", grace_s=1)
        with StateLock(load(path).state_dir):
            assert run_scheduled_night(str(path)) == 75

    def test_serve_lives_through_a_job_store_that_fails_once(self, tmp_path: Path) -> None:
        """Storing the next fire time fails (a locked or unreachable database): serve logs it and asks
        again a little later instead of dying with a traceback."""
        path = write_schedule_config(tmp_path / "night")
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(seconds=30))
        failed: list[bool] = []

        def fail_once(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not failed and SCHEDULE_TABLE in statement and statement.lstrip().upper().startswith("UPDATE"):
                failed.append(True)
                raise RuntimeError("database is locked")

        config = load(path)
        scheduler = build_scheduler(config, path, job=MARKER_JOB)
        # Once started (adding the job stores it too): the fire's own update fails.
        scheduler.add_listener(lambda _: event.listen(Engine, "before_cursor_execute", fail_once), EVENT_SCHEDULER_STARTED)
        def stop_once_stored() -> None:  # tomorrow's time stored at the retry, or give up after 60 s
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (failed and stored_jobs(config)[0][1] > time.time()):
                time.sleep(0.2)
            scheduler.stop_requested = "SIGTERM"

        stopper = threading.Thread(target=stop_once_stored, daemon=True)
        stopper.start()
        try:
            with capture_logs() as logs:
                scheduler.start()  # returns once stop_requested is set
            scheduler.shutdown(wait=True)
        finally:
            stopper.join()
            event.remove(Engine, "before_cursor_execute", fail_once)
        assert failed
        assert "scheduler_store_failed" in [log["event"] for log in logs]
        [(_, next_run)] = stored_jobs(config)
        assert next_run > time.time()  # stored at the retry: tomorrow's night


class TestOverlap:
    def test_a_fire_refused_because_the_night_still_runs_says_which_night(self, tmp_path: Path) -> None:
        path = write_schedule_config(tmp_path / "night")
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(seconds=30))
        scheduler = build_scheduler(load(path), path, blocking=False, job=SLOW_MARKER_JOB)
        refused = threading.Event()
        scheduler.add_listener(lambda _: refused.set(), EVENT_JOB_MAX_INSTANCES)
        with capture_logs() as logs:
            scheduler.start()
            try:
                deadline = time.monotonic() + 10
                while fires(tmp_path / "night") == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                again = datetime.now(timezone.utc).replace(microsecond=0)
                scheduler.modify_job(NIGHT_JOB_ID, next_run_time=again)  # due again while the first still runs
                assert refused.wait(10)
            finally:
                scheduler.shutdown(wait=True)
        [overlap] = [log for log in logs if log["event"] == "scheduled_night_skipped_overlap"]
        assert datetime.fromisoformat(overlap["scheduled_for"]) == again


class TestServe:
    def test_sigterm_stops_serve_cleanly(self, tmp_path: Path) -> None:
        """`serve` logs its next fire time, then exits 0 on SIGTERM."""
        path = write_schedule_config(tmp_path, zone="Asia/Tokyo")
        log_path = tmp_path / "serve.log"
        program = (
            "import sys; from pathlib import Path; from orchestrator.logs import configure_logging; "
            "from orchestrator.schedule import serve; configure_logging('json'); sys.exit(serve(Path(sys.argv[1])))"
        )
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", program, str(path)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            )
        try:
            deadline = time.monotonic() + 15
            while "scheduler_started" not in log_path.read_text(encoding="utf-8"):
                assert process.poll() is None, log_path.read_text(encoding="utf-8")
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()

        output = log_path.read_text(encoding="utf-8")
        assert code == 0, output
        assert '"timezone": "Asia/Tokyo"' in output
        assert '"next_fire_time": "20' in output and "T01:30:00+09:00" in output
        assert "scheduler_stopped" in output

    def test_a_stop_while_serve_starts_up_exits_0_and_starts_no_night(self, tmp_path: Path) -> None:
        """SIGTERM as serve begins to load its config and scheduler (systemd restarting it at once): the usual
        handlers `main` had put back made that a death by signal, not serve's documented clean stop (0). Now
        serve notes it, stops as soon as its scheduler is up, with 0, and leaves a night due now due."""
        from tests.test_unattended import SIGNAL_AS_IT_BEGINS

        path = write_schedule_config(tmp_path)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_AS_IT_BEGINS, "orchestrator.schedule", "serve", "serve", "--config", str(path), "--log-format", "json"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr
        events = [json.loads(line)["event"] for line in done.stderr.splitlines()]
        assert "scheduler_stopped" in events and "scheduled_night_started" not in events
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run == due.timestamp()

    def test_a_stop_while_serve_imports_exits_0(self, tmp_path: Path) -> None:
        """Before any command has begun (the imports), a stop exits as the command would for it: serve with 0
        (it was 143, which systemd counts as a failed unit)."""
        from tests.test_unattended import _caught_signals

        path = write_schedule_config(tmp_path)
        with open(tmp_path / "serve.log", "w+", encoding="utf-8") as log:
            process = serve_process(path, log)
            deadline = time.monotonic() + 60
            while signal.SIGTERM not in _caught_signals(process.pid) and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.001)
            still_importing = "pydantic_core" not in Path(f"/proc/{process.pid}/maps").read_text()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        assert still_importing and not (tmp_path / "state").exists()

    def test_a_signal_as_the_night_falls_due_keeps_it_due(self, tmp_path: Path) -> None:
        """SIGTERM while serve picks up a due night: no failed submission; the night stays due, and the next start runs it."""
        path = write_schedule_config(tmp_path)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)

        logs = serve_signalled_while_picking_up(path)

        events = [log["event"] for log in logs]
        assert "scheduled_night_kept_due" in events
        assert not {"scheduled_night_started", "scheduled_night_failed", "scheduler_library_warning"} & set(events)
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run == due.timestamp()
        after = build_scheduler(load(path), path, blocking=False, job=MARKER_JOB)
        assert start_and_wait_for(after, EVENT_JOB_EXECUTED)
        assert fires(tmp_path) == 1

    def test_started_logs_the_stored_fire_time_of_a_missed_night(self, tmp_path: Path) -> None:
        """After a missed night within the grace, scheduler_started names that night's time (due now), not tomorrow's."""
        path = write_schedule_config(tmp_path)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)

        logs = serve_signalled_while_picking_up(path)

        [started] = [log for log in logs if log["event"] == "scheduler_started"]
        assert datetime.fromisoformat(started["next_fire_time"]) == due

    def test_apscheduler_warnings_become_named_events(self, tmp_path: Path) -> None:
        """A warning APScheduler logs itself (the job store failing) reaches our log as scheduler_library_warning."""
        path = write_schedule_config(tmp_path)

        logs = serve_signalled_while_picking_up(path, store_fails=True)

        [warning] = [log for log in logs if log["event"] == "scheduler_library_warning"]
        assert "Error getting due jobs" in warning["message"] and "database is locked" in warning["message"]

    @pytest.mark.parametrize("log_format", ["human", "json"])
    def test_a_second_serve_on_the_same_state_dir_exits_75_naming_the_first(self, tmp_path: Path, log_format: str) -> None:
        """While one serve runs, another on its state dir exits 75 at once with one line naming serve.lock's holder, and the first goes on."""
        path = write_schedule_config(tmp_path)
        log_path = tmp_path / "serve.log"
        with open(log_path, "wb") as log:
            first = serve_process(path, log)
        try:
            wait_until(lambda: "scheduler_started" in log_path.read_text(encoding="utf-8"), first, "the first serve's start")

            second = serve_cli(path, "--log-format", log_format)

            assert second.returncode == 75, second.stderr
            [line] = second.stderr.strip().splitlines()
            assert "another overnight serve holds" in line and "serve.lock" in line
            assert f"pid {first.pid} on {socket.gethostname()} since " in line
            assert first.poll() is None
            first.send_signal(signal.SIGTERM)
            assert first.wait(timeout=20) == 0
        finally:
            stop_leftovers(first, path)
        assert [line["event"] for line in json_lines(log_path.read_text(encoding="utf-8"))].count("scheduler_started") == 1

    def test_json_mode_stderr_holds_only_json_lines(self, tmp_path: Path) -> None:
        """With --log-format json, a missed night is one scheduled_night_missed JSON line, not APScheduler's plain warning."""
        missed = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(second=0, microsecond=0)
        path = write_schedule_config(tmp_path, cron=f"{missed.minute} {missed.hour} * * *", grace_s=3600)
        store_job_due_at(path, missed)
        code, logs = serve_then_signal(path, lambda log: "scheduled_night_missed" in log, "the missed night")

        events = [line["event"] for line in logs]
        assert code == 0
        assert events.count("scheduled_night_missed") == 1
        assert events[-1] == "scheduler_stopped"
        # docs/scheduling.md: it names the night it missed.
        [missed_event] = [line for line in logs if line["event"] == "scheduled_night_missed"]
        assert datetime.fromisoformat(missed_event["scheduled_for"]) == missed

    @pytest.mark.parametrize("signum, night_exit", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
    def test_a_signal_to_serve_alone_stops_the_night_in_flight(
        self, tmp_path: Path, repo: Path, server: Any, signum: int, night_exit: int
    ) -> None:
        """SIGTERM (or a closed terminal's SIGHUP) to serve's pid only: serve passes it on, the night rolls back (exit 143 / 129, its run id logged), then serve exits 0."""
        server.enqueue(call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=30))
        path = night_config(tmp_path, repo, server, request_timeout_s=60)
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(minutes=1))
        scratch = tmp_path / "state" / "worktrees" / "fix-greet" / "scratch.txt"
        code, logs = serve_then_signal(path, lambda log: scratch.exists(), "the night's first edit", signum)

        events = [line["event"] for line in logs]
        assert code == 0
        [finished] = [line for line in logs if line["event"] == "scheduled_night_finished"]
        assert events.index("scheduled_night_finished") < events.index("scheduler_stopped")
        with sqlite3.connect(tmp_path / "state" / "runs.db") as connection:
            [(run_id, status, exit_code)] = connection.execute("SELECT id, status, exit_code FROM runs").fetchall()
        assert (status, exit_code) == ("cancelled", night_exit)
        assert (finished["exit_code"], finished["run_id"]) == (night_exit, run_id)

    def test_a_night_killed_by_a_signal_it_cannot_handle_is_logged_as_a_shell_shows_it(
        self, tmp_path: Path, repo: Path, server: Any
    ) -> None:
        """The night alone killed with -9 (the OOM killer's signal): scheduled_night_finished says exit_code 137 and
        signal SIGKILL, not Python's -9; serve itself carries on and stops as asked."""
        server.enqueue(call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=30))
        path = night_config(tmp_path, repo, server, request_timeout_s=60)
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(minutes=1))
        scratch = tmp_path / "state" / "worktrees" / "fix-greet" / "scratch.txt"
        killed: list[int] = []

        def killed_then_logged(log: str) -> bool:
            if not killed and scratch.exists():
                [started] = [line for line in json_lines(log) if line["event"] == "scheduled_night_started"]
                os.kill(started["pid"], signal.SIGKILL)
                killed.append(started["pid"])
            return "scheduled_night_finished" in log

        code, logs = serve_then_signal(path, killed_then_logged, "the killed night's end")

        [finished] = [line for line in logs if line["event"] == "scheduled_night_finished"]
        assert code == 0
        assert (finished["exit_code"], finished["signal"]) == (137, "SIGKILL"), finished

    def test_a_signal_landing_in_the_handlers_own_stop_does_not_wait_for_ever(self, tmp_path: Path) -> None:
        """A second signal that lands while the first one's handler sets the stop event (Ctrl-C held down, on a
        busy host) ran the handler again inside it: it waited for the event's lock, which the handler it
        interrupted holds, for ever (each further signal one level deeper, until a RecursionError). Here, in
        a process of its own, the event's lock is held as the first handler holds it, and the signal comes."""
        script = (
            "import os, signal\n"
            "from orchestrator.night_child import NightInFlight\n"
            "night = NightInFlight()\n"
            "signal.signal(signal.SIGINT, lambda signum, frame: night.stop(signum))\n"
            "night.stop(signal.SIGTERM)  # the first stop\n"
            "with night._stopped._cond:  # where the first handler is when the second signal lands\n"
            "    os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, before the lock is let go\n"
            "print('stopped', night.stopping)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=10, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
        assert (done.returncode, done.stdout.strip()) == (0, "stopped True"), done.stderr

    def test_ctrl_c_held_down_on_serve_still_keeps_the_night_due(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """A Ctrl-C every 5 ms from the night's first edit to serve's end: the first stops, the second abandons
        the night, the rest land in serve's own stop, which still keeps the night due and exits 0."""
        server.enqueue(call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=30))
        path = night_config(tmp_path, repo, server, request_timeout_s=60)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)
        scratch = tmp_path / "state" / "worktrees" / "fix-greet" / "scratch.txt"
        with open(tmp_path / "serve.log", "wb") as log:
            process = serve_process(path, log)
        try:
            deadline = time.monotonic() + 60
            while not scratch.exists() and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.05)
            assert scratch.exists()
            while process.poll() is None and time.monotonic() < deadline:
                process.send_signal(signal.SIGINT)
                time.sleep(0.005)
            code = process.wait(timeout=30)
        finally:
            stop_leftovers(process, path)
        text = (tmp_path / "serve.log").read_text(encoding="utf-8")
        assert code == 0, text
        assert "Traceback" not in text and '"scheduler_stopped"' in text
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run == due.timestamp()

    def test_a_night_stopped_with_serve_runs_again_when_serve_restarts(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """Restarting serve mid-night: the night it cancelled (143) stays due, and the next serve runs it that night, not tomorrow."""
        server.enqueue(call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=30), *FIX)
        path = night_config(tmp_path, repo, server, request_timeout_s=60)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)
        scratch = tmp_path / "state" / "worktrees" / "fix-greet" / "scratch.txt"

        code, logs = serve_then_signal(path, lambda log: scratch.exists(), "the night's first edit")

        events = [line["event"] for line in logs]
        assert code == 0
        assert events[-3:] == ["scheduled_night_finished", "scheduled_night_kept_due", "scheduler_stopped"]
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run == due.timestamp()
        code, logs = serve_then_signal(path, lambda log: "scheduled_night_finished" in log, "the night run again")
        assert code == 0
        [finished] = [line for line in logs if line["event"] == "scheduled_night_finished"]
        assert finished["exit_code"] == 0
        with sqlite3.connect(tmp_path / "state" / "runs.db") as connection:
            runs = connection.execute("SELECT status, exit_code FROM runs ORDER BY id").fetchall()
        assert runs == [("cancelled", 143), ("finished", 0)]

    def test_a_night_killed_with_serve_as_it_starts_up_is_run_when_serve_restarts(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """serve and its night killed together (-9, as by a power loss) as the night starts up, before it
        recorded a run: the next serve finds the night due, not tomorrow's."""
        path = night_config(tmp_path, repo, server)
        hourly = path.read_text(encoding="utf-8").replace('cron = "30 1 * * *"', 'cron = "0 * * * *"').replace("misfire_grace_s = 3600", "misfire_grace_s = 7200")
        path.write_text(hourly, encoding="utf-8")  # a fire within the grace whenever the test runs
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)
        log_path = tmp_path / "serve.log"
        with open(log_path, "wb") as log:
            process = serve_process(path, log)
        try:
            wait_until(lambda: "scheduled_night_started" in log_path.read_text(encoding="utf-8"), process, "the night")
            [started] = [line for line in json_lines(log_path.read_text(encoding="utf-8")) if line["event"] == "scheduled_night_started"]
            os.killpg(started["pid"], signal.SIGKILL)
            process.kill()
            process.wait()
        finally:
            stop_leftovers(process, path)
        assert json.loads((tmp_path / "state" / "serve-night-started").read_text(encoding="utf-8"))["pid"] == started["pid"]
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run > due.timestamp()  # APScheduler had stored the next fire time
        assert due_when_serve_restarts(path).timestamp() <= time.time()  # the fire it died in: at once

    def test_a_night_stopped_while_starting_up_stays_due(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """SIGTERM as the night has just been started, before it began a run: it did no work, so it stays due."""
        path = night_config(tmp_path, repo, server)
        due = (datetime.now(timezone.utc) - timedelta(minutes=1)).replace(microsecond=0)
        store_job_due_at(path, due)
        code, logs = serve_then_signal(path, lambda log: "scheduled_night_started" in log, "the night")

        events = [line["event"] for line in logs]
        assert code == 0
        assert events[-2:] == ["scheduled_night_kept_due", "scheduler_stopped"] and "scheduled_night_finished" in events
        [(_, next_run)] = stored_jobs(load(path))
        assert next_run == due.timestamp()

    def test_the_night_logs_json_like_serve_on_a_terminal(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """`serve --log-format json` on a terminal: the night it starts logs JSON lines too, and its end names its run."""
        server.enqueue(*FIX)
        path = night_config(tmp_path, repo, server)
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(minutes=1))
        reader_end, terminal = pty.openpty()
        process = serve_process(path, terminal)
        os.close(terminal)
        output = bytearray()
        reader = threading.Thread(target=read_all, args=(reader_end, output), daemon=True)
        reader.start()
        try:
            wait_until(lambda: b"scheduled_night_finished" in output, process, "the night's end")
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=20)
        finally:
            stop_leftovers(process, path)
            reader.join(timeout=10)
            os.close(reader_end)

        logs = json_lines(output.decode("utf-8"))
        assert code == 0
        assert "night_started" in [line["event"] for line in logs]  # the child's own events, as JSON
        [finished] = [line for line in logs if line["event"] == "scheduled_night_finished"]
        assert (finished["exit_code"], finished["run_id"]) == (0, 1)  # the night names the run it recorded


class TestDocumentedSetups:
    @pytest.mark.parametrize(
        ("document", "fence", "folder"), [("docs/scheduling.md", "crontab", "/repo"), ("README.md", "cron", "/path/to/repo")]
    )
    def test_the_documented_crontab_lets_the_checks_find_the_venv(
        self, tmp_path: Path, repo: Path, server: Any, document: str, fence: str, folder: str
    ) -> None:
        """The documented crontab, run as cron runs it (its PATH is /usr/bin:/bin unless the crontab sets one): the check's python is found, the task succeeds."""
        if not (Path(sys.prefix) / "bin" / "overnight").exists():
            pytest.skip("overnight is not installed in this environment")
        server.enqueue(*FIX)
        project = tmp_path / "project"
        project.mkdir()
        (project / ".venv").symlink_to(sys.prefix)
        write_config(project / "overnight.toml", api_base=server.url, repo=repo)
        [crontab] = documented_blocks(document, fence)
        lines = [line.replace(folder, str(project)) for line in crontab if line.strip() and not line.startswith("#")]
        settings = dict(line.split("=", 1) for line in lines if "=" in line.split()[0])
        [job] = [line for line in lines if "=" not in line.split()[0]]
        cron_environment = {"HOME": str(tmp_path), "LOGNAME": "overnight", "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}

        result = subprocess.run(
            ["/bin/sh", "-c", job.split(None, 5)[5]], env={**cron_environment, **settings},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )

        log = project / ".overnight" / "cron.log"
        assert result.returncode == 0, log.read_text(encoding="utf-8") if log.exists() else result.stderr
        # The folder the crontab makes first is the default state dir: its owner's alone, as one overnight makes
        # (a plain `mkdir -p` left the transcripts and the run store readable by every user of the host).
        assert (project / ".overnight").stat().st_mode & 0o777 == 0o700

    def test_the_documented_services_put_the_venv_on_path(self) -> None:
        """Each documented systemd service (the timer's night and serve) puts the venv's bin on PATH, for the checks."""
        services = [block for block in documented_blocks("docs/scheduling.md", "ini") if "[Service]" in block]

        assert len(services) == 2
        for service in services:
            assert "Environment=PATH=/repo/.venv/bin:/usr/local/bin:/usr/bin:/bin" in service

    def test_the_documented_serve_unit_stops_a_night_in_flight_within_its_stop_timeout(
        self, tmp_path: Path, repo: Path, server: Any
    ) -> None:
        """`systemctl stop` under the documented unit (KillMode=mixed: SIGTERM to serve alone) while the night
        runs a check that ignores SIGTERM: serve passes the signal on, the night rolls back and ends (143), and
        serve exits 0 well within the unit's TimeoutStopSec, before systemd would kill the night mid-rollback."""
        [service] = [block for block in documented_blocks("docs/scheduling.md", "ini") if any(line.startswith("ExecStart=") and " serve" in line for line in block)]
        settings = dict(line.split("=", 1) for line in service if "=" in line and not line.startswith("#"))
        assert settings["KillMode"] == "mixed"
        stop_timeout_s = float(settings["TimeoutStopSec"])
        (repo / "slow_check.sh").write_text("trap '' TERM\nsleep 300\n", encoding="utf-8")
        git(repo, "add", "slow_check.sh")
        git(repo, "commit", "-q", "-m", "a slow check")
        server.enqueue(call("write_file", {"path": "scratch.txt", "content": "half-done"}), call("run_check", {}))
        path = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo,
            tasks=[{"name": "slow", "prompt": "p", "check": "sh slow_check.sh"}], night={"check_timeout_s": 3600},
            extra='[schedule]\ncron = "30 1 * * *"\ntimezone = "UTC"\nmisfire_grace_s = 3600\n',
        )
        store_job_due_at(path, datetime.now(timezone.utc) - timedelta(minutes=1))
        log_path = tmp_path / "serve.log"
        with open(log_path, "wb") as log:
            process = serve_process(path, log)
        try:
            wait_until(lambda: len(server.requests) >= 2, process, "the night's check")
            time.sleep(1)  # the check is running
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=stop_timeout_s)
            took = time.monotonic() - started
        finally:
            stop_leftovers(process, path)

        logs = json_lines(log_path.read_text(encoding="utf-8"))
        [finished] = [line for line in logs if line["event"] == "scheduled_night_finished"]
        assert code == 0 and finished["exit_code"] == 143
        assert took < stop_timeout_s / 2, took
        assert not (tmp_path / "state" / "worktrees" / "slow" / "scratch.txt").exists()

    def test_the_documented_units_pass_systemd_analyze_verify(self, tmp_path: Path) -> None:
        """The timer's service and timer, and serve's service, as written (with /repo a real folder holding
        the venv's overnight): systemd's own checker finds nothing to say about them."""
        analyze = shutil.which("systemd-analyze")
        if analyze is None or not (Path(sys.prefix) / "bin" / "overnight").exists():
            pytest.skip("needs systemd-analyze and an installed overnight")
        project = tmp_path / "repo"
        (project / ".venv").mkdir(parents=True)
        (project / ".venv" / "bin").symlink_to(Path(sys.prefix) / "bin")
        units = ["\n".join(block) + "\n" for block in documented_blocks("docs/scheduling.md", "ini")]
        names = ["overnight.service", "overnight.timer", "overnight-serve.service"]
        assert len(units) == len(names)
        for name, unit in zip(names, units):
            (tmp_path / name).write_text(unit.replace("/repo", str(project)), encoding="utf-8")
        for name in names:
            result = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / name)], capture_output=True, text=True, timeout=60)
            said = [line for line in (result.stdout + result.stderr).splitlines() if tmp_path.name in line or name in line]
            assert result.returncode == 0 and not said, (name, result.stdout, result.stderr)


TWO_TASKS = [
    {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
    {"name": "second", "prompt": "greet() should return 'hello' too.", "check": "python check_greet.py"},
]


def runs_of(path: Path) -> list[tuple[str, str, str, str]]:
    """(task, outcome, reason, commit) of every task of every run, in order."""
    with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
        return connection.execute("SELECT name, outcome, reason, \"commit\" FROM task_runs ORDER BY id").fetchall()


# A task's answer that changes nothing: its check fails (reason check_failed).
NOTHING = call("submit", {"summary": "nothing"})


def iterations_of(path: Path, task_run_id: int) -> list[tuple[int, str]]:
    """(number, outcome) of a task run's iterations."""
    with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
        return connection.execute("SELECT number, outcome FROM iterations WHERE task_run_id = ? ORDER BY id", (task_run_id,)).fetchall()


def json_events(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]


def report_text_of(path: Path, *extra: str) -> str:
    """`overnight report` of the latest run."""
    shown = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(path), *extra],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def report_json_of(path: Path) -> dict[str, Any]:
    """`overnight report --json` of the latest run (the text report is made too: it must not fail)."""
    report_text_of(path)
    return json.loads(report_text_of(path, "--json"))


def overnight_run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(path), "--log-format", "json", *args],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


class TestANightBegunAgain:
    """A scheduled night that serve starts again (restarted mid-night, or dead with it, within the
    grace) goes on from what that fire's earlier runs did: it neither works a finished task twice
    (a second commit on its branch) nor spends the night's token budget afresh."""

    def _first_night(self, tmp_path: Path, repo: Path, server: Any, *, left: int = 1, **night: Any) -> tuple[Path, datetime, str]:
        """fix-greet committed, `second` failed in its one iteration; the fire time before it and fix-greet's
        commit. The config then allows `left` iterations more (serve restarted with it edited)."""
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS, night={"max_iterations": 1, **night})
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(*FIX, NOTHING)
        assert overnight_run(path).returncode == 1
        [(_, done, _, commit), (_, failed, _, _)] = runs_of(path)
        assert (done, failed) == ("succeeded", "failed")
        path.write_text(path.read_text(encoding="utf-8").replace("max_iterations = 1\n", f"max_iterations = {1 + left}\n"), encoding="utf-8")
        return path, fired, commit

    def test_a_task_the_fires_earlier_run_finished_is_not_worked_again(self, tmp_path: Path, repo: Path, server: Any) -> None:
        path, fired, commit = self._first_night(tmp_path, repo, server)
        asked = len(server.requests)
        server.enqueue(*FIX)
        result = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert result.returncode == 0, result.stderr  # the one left succeeded; the other was done tonight
        skipped, worked = runs_of(path)[2:]
        assert skipped == ("fix-greet", "skipped", "done_earlier_tonight", commit)  # the morning's report shows the work
        assert worked[:3] == ("second", "succeeded", "")
        assert git_log(repo, "overnight/fix-greet").count("overnight: fix-greet iteration") == 1
        assert git_log(repo, "overnight/second").startswith("overnight: second iteration 2\n")  # numbered on from the earlier run's
        assert len(server.requests) - asked == len(FIX)  # the second task's, no more
        logs = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        events = [log["event"] for log in logs]
        assert "night_resumed" in events and "task_skipped_done_earlier_tonight" in events
        [finished] = [log for log in logs if log["event"] == "night_finished"]
        assert (finished["succeeded"], finished["done_already"]) == (1, 1)  # the exit code's 0 counts both

    def test_the_tokens_the_fires_earlier_run_spent_count_in_the_nights_budget(self, tmp_path: Path, repo: Path, server: Any) -> None:
        path, fired, _ = self._first_night(tmp_path, repo, server)
        with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
            [(spent,)] = connection.execute("SELECT SUM(tokens) FROM iterations").fetchall()
        text = path.read_text(encoding="utf-8").replace("[night]\n", f"[night]\nmax_tokens_per_night = {spent}\n")
        path.write_text(text, encoding="utf-8")
        asked = len(server.requests)
        assert overnight_run(path, "--scheduled-for", fired.isoformat()).returncode == 1
        assert runs_of(path)[3][1:3] == ("cancelled", f"night token budget of {spent} spent")
        assert len(server.requests) == asked

    def test_a_first_answer_the_fires_earlier_run_left_unused_counts_in_the_nights_budget(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The earlier run's night budget counted the first answer its skipped task never took: the night begun again counts it too."""
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS, night={"max_iterations": 1})
        git(repo, "checkout", "-q", "-b", "overnight/fix-greet")  # under review in the user's checkout: fix-greet is skipped
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(
            call("submit", {"summary": "done"}, prompt_tokens=1000, completion_tokens=100),  # fix-greet's, asked ahead, never taken
            call("submit", {"summary": "nothing"}, prompt_tokens=200, completion_tokens=20),
        )
        first = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert first.returncode == 1, first.stderr
        assert [row[:3] for row in runs_of(path)] == [("fix-greet", "skipped", "branch_checked_out"), ("second", "failed", "check_failed")]
        [unused] = [e for e in map(json.loads, first.stderr.splitlines()) if e["event"] == "first_answer_unused"]
        assert unused["tokens"] == 1100
        text = path.read_text(encoding="utf-8").replace("[night]\n", "[night]\nmax_tokens_per_night = 1320\n")
        path.write_text(text.replace("max_iterations = 1\n", "max_iterations = 2\n"), encoding="utf-8")
        asked = len(server.requests)
        again = overnight_run(path, "--scheduled-for", fired.isoformat())
        [resumed] = [e for e in map(json.loads, again.stderr.splitlines()) if e["event"] == "night_resumed"]
        assert resumed["tokens"] == 1320
        assert [row[1:3] for row in runs_of(path)[2:]] == [("cancelled", "night token budget of 1320 spent")] * 2
        assert len(server.requests) == asked

    def test_the_tokens_a_task_spent_in_the_fires_earlier_run_count_in_its_own_budget(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """`second` spent its whole `max_tokens_per_task` in the earlier run of the fire: no iteration more, and no request."""
        path, fired, _ = self._first_night(tmp_path, repo, server)
        with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
            [(spent,)] = connection.execute(
                "SELECT SUM(i.tokens) FROM iterations i JOIN task_runs t ON i.task_run_id = t.id WHERE t.name = 'second'"
            ).fetchall()
        text = path.read_text(encoding="utf-8").replace("[night]\n", f"[night]\nmax_tokens_per_task = {spent}\n")
        path.write_text(text, encoding="utf-8")
        asked = len(server.requests)
        assert overnight_run(path, "--scheduled-for", fired.isoformat()).returncode == 1
        assert runs_of(path)[3][:3] == ("second", "cancelled", f"task token budget of {spent} spent")
        assert len(server.requests) == asked

    def test_a_task_whose_check_changed_since_is_other_work(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """Restarting serve is how an edited config is taken up: a task whose check was made stricter was
        taken for done by the earlier run's commit, which the new check never judged."""
        path, fired, _ = self._first_night(tmp_path, repo, server)
        path.write_text(path.read_text(encoding="utf-8").replace('check = "python check_greet.py"', 'check = "python check_greet.py && true"', 1), encoding="utf-8")
        server.enqueue(*FIX, *FIX)
        result = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert result.returncode == 0, result.stderr
        assert [row[1:3] for row in runs_of(path)[2:]] == [("succeeded", ""), ("succeeded", "")]

    def test_runs_begun_before_the_fire_are_an_earlier_nights(self, tmp_path: Path, repo: Path, server: Any) -> None:
        path, _, _ = self._first_night(tmp_path, repo, server)
        server.enqueue(*FIX, *FIX)
        result = overnight_run(path, "--scheduled-for", datetime.now(timezone.utc).isoformat())
        assert result.returncode == 0, result.stderr
        assert [row[1] for row in runs_of(path)[2:]] == ["succeeded", "succeeded"]

    # --- a task the fire's earlier runs failed, parked, paused or saw interrupted ---------------------

    def test_a_task_that_failed_with_all_its_iterations_is_not_worked_again(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """A night begun again is not a second night: the task that spent its iterations is recorded as it ended."""
        path, fired, _ = self._first_night(tmp_path, repo, server, left=0)
        asked = len(server.requests)
        server.enqueue(*FIX)  # what the task would take, were it worked again
        junit = tmp_path / "junit.xml"
        result = overnight_run(path, "--scheduled-for", fired.isoformat(), "--junit", str(junit))
        assert result.returncode == 1, result.stderr  # as the night with that failed task
        assert [row[:3] for row in runs_of(path)[2:]] == [("fix-greet", "skipped", "done_earlier_tonight"), ("second", "failed", "failed_earlier_tonight")]
        assert len(server.requests) == asked
        [skipped] = [event for event in json_events(result) if event["event"] == "task_skipped_failed_earlier_tonight"]
        assert (skipped["task"], skipped["reason"], skipped["iterations"]) == ("second", "check_failed", 1)
        assert '<failure message="failed_earlier_tonight" type="failed_earlier_tonight">' in junit.read_text(encoding="utf-8")
        [_, second] = report_json_of(path)["tasks"]
        assert (second["outcome"], second["reason"], second["iterations"]) == ("failed", "failed_earlier_tonight", [])
        # Not "0 iteration(s)" for a task that used them all (found by a review):
        assert "second: failed (failed_earlier_tonight) · overnight/second · its iterations in an earlier run of this scheduled night" in report_text_of(path)

    def test_a_task_that_failed_with_iterations_left_gets_only_those(self, tmp_path: Path, repo: Path, server: Any) -> None:
        path, fired, _ = self._first_night(tmp_path, repo, server, left=1)  # max_iterations 2 now, 1 spent
        asked = len(server.requests)
        server.enqueue(NOTHING, NOTHING)
        result = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert result.returncode == 1, result.stderr
        assert len(server.requests) - asked == 1
        assert runs_of(path)[3][:3] == ("second", "failed", "check_failed")
        assert iterations_of(path, 4) == [(2, "rolled_back")]  # numbered on: notes.md has no second "iteration 1"

    def test_a_task_parked_earlier_tonight_stays_parked(self, tmp_path: Path, repo: Path, server: Any) -> None:
        path = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[1:], night={"max_iterations": 3}, guards={"park_after": 2}
        )
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(NOTHING, NOTHING)
        assert overnight_run(path).returncode == 1
        assert runs_of(path)[0][1:3] == ("parked", "parked")  # one of its three iterations left: more of the same
        asked = len(server.requests)
        server.enqueue(*FIX)
        junit = tmp_path / "junit.xml"
        result = overnight_run(path, "--scheduled-for", fired.isoformat(), "--junit", str(junit))
        assert result.returncode == 1, result.stderr
        assert runs_of(path)[1][:3] == ("second", "parked", "parked_earlier_tonight")
        assert len(server.requests) == asked
        assert "task_skipped_parked_earlier_tonight" in [event["event"] for event in json_events(result)]
        assert '<failure message="parked_earlier_tonight" type="parked_earlier_tonight">' in junit.read_text(encoding="utf-8")
        [second] = report_json_of(path)["tasks"]
        assert (second["outcome"], second["reason"]) == ("parked", "parked_earlier_tonight")

    def test_an_interrupted_iteration_is_not_counted(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """Killed mid-iteration (serve and its night died together): the night begun again has that iteration back."""
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[1:], night={"max_iterations": 2})
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(NOTHING, NOTHING)
        assert overnight_run(path).returncode == 1
        with sqlite3.connect(path.parent / "state" / "runs.db") as connection:  # as recovery leaves a dead night's
            connection.execute("UPDATE iterations SET outcome = 'interrupted', reason = 'interrupted' WHERE number = 2")
            connection.execute("UPDATE task_runs SET outcome = 'failed', reason = 'interrupted'")
            connection.execute("UPDATE runs SET status = 'crashed', exit_code = NULL")
        asked = len(server.requests)
        server.enqueue(NOTHING, NOTHING)
        assert overnight_run(path, "--scheduled-for", fired.isoformat()).returncode == 1
        assert len(server.requests) - asked == 1  # the interrupted one's, not two more
        assert iterations_of(path, 2) == [(3, "rolled_back")]

    def test_an_iteration_overnight_itself_ended_is_not_counted(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """`iteration_error` is overnight's or its environment's failure (a full disk, a failing store), fixed
        before serve was started again: the night begun again has that iteration back (found by a review)."""
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[1:], night={"max_iterations": 1})
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(NOTHING)
        assert overnight_run(path).returncode == 1
        with sqlite3.connect(path.parent / "state" / "runs.db") as connection:  # as an error in the iteration leaves it
            connection.execute("UPDATE iterations SET reason = 'iteration_error'")
            connection.execute("UPDATE task_runs SET reason = 'iteration_error'")
        asked = len(server.requests)
        server.enqueue(*FIX)
        assert overnight_run(path, "--scheduled-for", fired.isoformat()).returncode == 0
        assert len(server.requests) - asked == len(FIX)
        assert iterations_of(path, 2) == [(2, "committed")]

    def test_park_after_counts_on_across_the_runs_of_the_fire(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The same reason in the earlier run's last iteration and this run's first is two in a row: parked
        after one more iteration, not after two more (found by a review)."""
        path = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[1:], night={"max_iterations": 1}, guards={"park_after": 2}
        )
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(NOTHING)
        assert overnight_run(path).returncode == 1
        assert runs_of(path)[0][1:3] == ("failed", "check_failed")
        path.write_text(path.read_text(encoding="utf-8").replace("max_iterations = 1\n", "max_iterations = 3\n"), encoding="utf-8")
        asked = len(server.requests)
        server.enqueue(NOTHING, NOTHING)
        assert overnight_run(path, "--scheduled-for", fired.isoformat()).returncode == 1
        assert len(server.requests) - asked == 1
        assert runs_of(path)[1][1:3] == ("parked", "parked")
        assert iterations_of(path, 2) == [(2, "rolled_back")]

    def test_a_task_paused_earlier_tonight_is_worked_again(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The model unreachable is not the task's doing: the iteration it cut short is not counted."""
        path = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[1:], night={"max_iterations": 1}, model={"retries": 0}
        )
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(Reply(status=503))
        assert overnight_run(path).returncode == 3
        assert (len(server.requests), server.exhausted) == (1, 0)  # its one answer taken, no other asked for
        assert runs_of(path)[0][1:3] == ("paused", "model_unreachable")
        server.enqueue(*FIX)
        result = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert result.returncode == 0, result.stderr
        assert runs_of(path)[1][1:3] == ("succeeded", "")
        assert iterations_of(path, 2) == [(2, "committed")]

    def test_a_task_whose_prompt_changed_is_worked_anew(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """Both failed with their one iteration; `second`'s prompt edited since is other work, with its iterations."""
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS, night={"max_iterations": 1})
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        server.enqueue(NOTHING, NOTHING)
        assert overnight_run(path).returncode == 1
        path.write_text(path.read_text(encoding="utf-8").replace("'hello' too.", "'hello' too, please."), encoding="utf-8")
        asked = len(server.requests)
        server.enqueue(*FIX)
        result = overnight_run(path, "--scheduled-for", fired.isoformat())
        assert result.returncode == 1, result.stderr
        assert [row[:3] for row in runs_of(path)[2:]] == [("fix-greet", "failed", "failed_earlier_tonight"), ("second", "succeeded", "")]
        assert len(server.requests) - asked == len(FIX)  # second's, anew
        assert iterations_of(path, 4) == [(1, "committed")]

    @pytest.mark.parametrize("value", ["yesterday", "2026-12-02T01:30:00", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-10:00"])
    def test_a_fire_time_that_is_not_one_is_refused_in_one_line(self, tmp_path: Path, repo: Path, server: Any, value: str) -> None:
        path = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
        result = overnight_run(path, "--scheduled-for", value)
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert "--scheduled-for" in line and "Traceback" not in result.stderr
        assert not (tmp_path / "state").exists()

    def test_serve_names_the_fire_to_the_night_it_starts(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The night serve starts again after a restart skips the task the fire's cancelled run had finished."""
        clear_of_the_hour(90)  # a whole night runs before serve is asked about this hour's fire
        path = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS,
            extra='[schedule]\ncron = "0 * * * *"\ntimezone = "UTC"\nmisfire_grace_s = 7200\n',
        )
        server.enqueue(*FIX, *FIX)
        assert overnight_run(path).returncode == 0  # stands for the fire's first run, ended by serve's stop:
        with sqlite3.connect(path.parent / "state" / "runs.db") as connection:
            connection.execute("UPDATE runs SET status = 'cancelled', exit_code = 143")
            connection.execute("UPDATE task_runs SET outcome = 'cancelled', reason = 'SIGTERM' WHERE name = 'second'")
        this_hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        begun_at(path, 1, this_hour + timedelta(seconds=1))
        asked = len(server.requests)
        server.enqueue(*FIX)
        with capture_logs():
            assert run_scheduled_night(str(path)) == 0
        assert [row[:3] for row in runs_of(path)[2:]] == [("fix-greet", "skipped", "done_earlier_tonight"), ("second", "succeeded", "")]
        assert len(server.requests) - asked == len(FIX)


def git_log(repo: Path, branch: str) -> str:
    return subprocess.run(["git", "log", "--format=%s", branch], cwd=repo, capture_output=True, text=True, check=True).stdout


def crontab_by_the_minute(cron: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The reference: each UTC minute in [start, end) on the zone's clock, matched as crontab(5) matches a minute."""

    def values(field: str, low: int, high: int) -> set[int]:
        chosen: set[int] = set()
        for part in field.split(","):
            span, _, step = part.partition("/")
            first, _, last = (f"{low}-{high}" if span == "*" else span).partition("-")
            chosen.update(range(int(first), int(last or (high if step else first)) + 1, int(step or 1)))
        return chosen

    minute, hour, day, month, weekday = cron.split()
    minutes, hours, days, months = values(minute, 0, 59), values(hour, 0, 23), values(day, 1, 31), values(month, 1, 12)
    weekdays = {number % 7 for number in values(weekday, 0, 7)}
    either = not day.startswith("*") and not weekday.startswith("*")

    def matches(wall: datetime) -> bool:
        on_day, on_weekday = wall.day in days, wall.isoweekday() % 7 in weekdays
        return (wall.minute in minutes and wall.hour in hours and wall.month in months
                and (on_day or on_weekday if either else on_day and on_weekday))

    fires, seen, moment, offset_before = set(), set(), start, None
    while moment < end:
        offset = moment.astimezone(zone).utcoffset()
        wall = (moment + offset).replace(tzinfo=None)
        if offset_before is not None and offset > offset_before:  # clocks forward: skipped minutes, on the offset before
            skipped = wall - (offset - offset_before)
            fires.update((gone - offset_before).replace(tzinfo=timezone.utc) for gone in
                         (skipped + timedelta(minutes=step) for step in range((offset - offset_before) // timedelta(minutes=1)))
                         if matches(gone))
        if wall not in seen and matches(wall):  # a repeated minute at its first pass only
            fires.add(moment)
        seen.add(wall)
        moment, offset_before = moment + timedelta(minutes=1), offset
    return sorted(fires)
