"""`overnight serve`: the night job in the run store's database, its zone, misfires and restarts."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from apscheduler.events import EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
from apscheduler.schedulers.base import BaseScheduler
from structlog.testing import capture_logs

from orchestrator.config import Config, load_config
from orchestrator.errors import ConfigError
from orchestrator.schedule import (
    NIGHT_JOB_ID,
    SCHEDULE_TABLE,
    build_scheduler,
    crontab_weekdays,
    next_fire_times,
    run_scheduled_night,
)

MARKER_JOB = "tests.test_schedule:marker_job"
FIRED_LOG = "fired.log"


def marker_job(config_path: str) -> int:
    """Stands in for a night: one line per fire, next to the config."""
    with open(Path(config_path).parent / FIRED_LOG, "a", encoding="utf-8") as fired:
        fired.write("fired\n")
    return 0


def write_schedule_config(folder: Path, *, cron: str = "30 1 * * *", zone: str = "UTC", grace_s: int = 3600) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
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

    def test_restarting_the_scheduler_keeps_one_job(self, tmp_path: Path) -> None:
        """A second scheduler on the same database replaces the job instead of adding another."""
        path = write_schedule_config(tmp_path)
        for _ in range(2):
            scheduler = build_scheduler(load(path), path, blocking=False)
            scheduler.start(paused=True)
            scheduler.shutdown()

        assert len(stored_jobs(load(path))) == 1

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
        assert crontab_weekdays("mon-fri") == "mon-fri"


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
        with capture_logs() as logs:
            assert start_and_wait_for(after, EVENT_JOB_EXECUTED | EVENT_JOB_MISSED)

        assert fires(tmp_path) == expected_fires
        assert any(log["event"] == "scheduled_night_missed" for log in logs) == (expected_fires == 0)
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

    @pytest.mark.parametrize("cron", ["61 1 * * *", "30 1 * *", "30 1 * * 9", "thirty one * * *"])
    def test_bad_cron_is_one_line_naming_the_key(self, tmp_path: Path, cron: str) -> None:
        """A cron expression that cannot fire fails with one line naming [schedule] cron."""
        config = load(write_schedule_config(tmp_path, cron=cron))

        with pytest.raises(ConfigError) as raised:
            next_fire_times(config)

        message = str(raised.value)
        assert f"[schedule] cron: {cron!r}" in message
        assert "\n" not in message


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
