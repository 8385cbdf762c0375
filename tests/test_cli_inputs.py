"""Bad input through the real CLI: one line on stderr naming the key, the documented exit code, nothing lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import write_config
from tests.test_cli import assert_one_line_error, overnight

API_BASE = "http://127.0.0.1:9/v1"


SQLITE_URIS_SQLITE_CANNOT_OPEN = [
    ("sqlite:///file:x.db?mode=RO&uri=true", "mode=RO"),
    ("sqlite:///file:x.db?mode=Rw&uri=true", "mode=Rw"),
    ("sqlite:///file:x.db?mode=rwx&uri=true", "mode=rwx"),
    ("sqlite:///file:x.db%3Fmode%3D?uri=true", "mode= is no access mode"),
    ("sqlite:///file:x.db%3Fmode%3Drw%26mode%3Drwc?uri=true", "access mode not allowed"),
    ("sqlite:///file:x.db%3Fmode%3DNOPE%26mode%3Drwc?uri=true", "mode=NOPE"),
    ("sqlite:///file:x.db?cache=Shared&uri=true", "cache=Shared"),
    ("sqlite:///file:x.db?vfs=UNIX-NONE&uri=true", "vfs=UNIX-NONE"),
    ("sqlite:///file:x.db?vfs=NOPE&uri=true", "vfs=NOPE"),
    ("sqlite:///file:x.db%3Fvfs%3Dunix%26vfs%3DNOPE?uri=true", "vfs=NOPE"),
    ("sqlite:///file:x.db?mode=rw&mode=ro&uri=true", "mode is given more than once"),
    ("sqlite:///file:x.db?mode=rwc&mode=rwc&uri=true", "mode is given more than once"),
    ("sqlite:///file:x.db?vfs=unix&vfs=unix&uri=true", "vfs is given more than once"),
    ("sqlite:///file:x.db?cache=private&cache=private&uri=true", "cache is given more than once"),
    ("sqlite:///file://otherhost/x.db?uri=true", "file://otherhost/ names another machine"),
    ("sqlite:///file://LOCALHOST/x.db?uri=true", "file://LOCALHOST/ names another machine"),
]
SQLITE_URIS_SQLITE_CANNOT_OPEN_IDS = [
    "mode-RO", "mode-Rw", "mode-unknown", "mode-blank-in-the-database-part", "mode-widened", "unknown-mode-before-a-known",
    "cache-Shared", "vfs-UNIX-NONE", "vfs-unknown", "last-vfs-unknown", "mode-twice", "same-mode-twice", "vfs-twice",
    "cache-twice", "another-host", "localhost-in-capitals",
]


def config_with(tmp_path: Path, repo: Path, replace: tuple[str, str] = ("", ""), extra: str = "") -> Path:
    """The usual test config, with one text replacement and lines added at its end."""
    config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, extra=extra)
    if replace[0]:
        text = config.read_text()
        assert replace[0] in text
        config.write_text(text.replace(replace[0], replace[1], 1))
    return config


class TestNulCharacters:
    @pytest.mark.parametrize(
        ("replace", "extra", "key"),
        [
            (("[repo]\npath = \"", "[repo]\npath = \"\\u0000"), "", "[repo] path"),
            (("[repo]\n", "[repo]\nbase = \"main\\u0000\"\n"), "", "[repo] base"),
            (("[repo]\n", "[repo]\nkeep = [\"build\", \"a\\u0000b\"]\n"), "", "[repo] keep"),
            (('dir = "state"', 'dir = "state\\u0000"'), "", "[state] dir"),
            (("", ""), "[store]\nurl = \"sqlite:///x\\u0000.db\"\n", "[store] url"),
            (("", ""), "[guards]\ncustom = [\"os\\u0000:X\"]\n", "[guards] custom"),
            (("check = \"", "check = \"true\\u0000"), "", "[[task]] #1 check"),
        ],
    )
    @pytest.mark.parametrize("command", ["run", "gc", "report"])
    def test_a_nul_in_any_string_is_one_line_naming_the_key(self, tmp_path, repo, replace, extra, key, command):
        """A NUL (legal in TOML) in any string of the config is refused at load, naming the key: no night, no state dir."""
        config = config_with(tmp_path, repo, replace, extra)
        assert_one_line_error(overnight(command, "--config", str(config)), 2, key, "NUL")
        assert not (tmp_path / "state").exists()


def test_a_blank_state_dir_is_refused_naming_the_key(tmp_path, repo):
    """`dir = ""` would be the config file's folder: the night's files among the user's."""
    config = config_with(tmp_path, repo, ('dir = "state"', 'dir = ""'))
    assert_one_line_error(overnight("run", "--config", str(config)), 2, "[state] dir", "blank")


class TestScheduleCheckedByRun:
    @pytest.mark.parametrize(
        ("schedule", "key"),
        [('cron = "not a cron"', "[schedule] cron"), ('cron = "0 3 31 2 *"', "[schedule] cron"), ('timezone = "Mars/Base"', "[schedule] timezone")],
    )
    def test_a_schedule_serve_would_refuse_is_refused_by_run_too(self, tmp_path, repo, schedule, key):
        """A typo in [schedule] is said tonight, by the cron job's `run`, not on the day someone starts `serve`."""
        config = config_with(tmp_path, repo, extra=f"[schedule]\n{schedule}\n")
        assert_one_line_error(overnight("run", "--config", str(config)), 2, key)
        assert not (tmp_path / "state").exists()

    def test_run_refuses_reboot_saying_what_to_write_instead(self, tmp_path, repo):
        """`cron = "@reboot"` names no time of day: `run` says so as serve would, exit 2, before the state dir."""
        config = config_with(tmp_path, repo, extra='[schedule]\ncron = "@reboot"\n')
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[schedule] cron: '@reboot'", "write the night's time")
        assert not (tmp_path / "state").exists()

    def test_run_accepts_a_shorthand_serve_accepts(self, tmp_path, repo):
        """`cron = "@daily"` passes run's check of [schedule]: the night goes on, to the model (unreachable here, exit 3)."""
        config = config_with(tmp_path, repo, extra='[schedule]\ncron = "@daily"\ntimezone = "UTC"\n')
        result = overnight("run", "--config", str(config))
        assert result.returncode == 3 and "[schedule]" not in result.stderr, result.stderr

    @pytest.mark.parametrize(("command", "grace"), [("run", "604801"), ("serve", "100000000000000000000")])
    def test_a_misfire_grace_past_a_week_is_refused_naming_the_key(self, tmp_path, repo, grace, command):
        """10**20 (a TOML integer) was accepted, then overflowed the date arithmetic of every restart (swallowed: missed nights
        were silently never run again): past a week is exit 2 naming the key, before the state dir."""
        config = config_with(tmp_path, repo, extra=f"[schedule]\nmisfire_grace_s = {grace}\n")
        assert_one_line_error(overnight(command, "--config", str(config)), 2, "[schedule] misfire_grace_s")
        assert not (tmp_path / "state").exists()

    def test_a_misfire_grace_of_a_week_is_accepted(self, tmp_path, repo):
        from orchestrator.config import load_config

        config = config_with(tmp_path, repo, extra="[schedule]\nmisfire_grace_s = 604800\n")
        assert load_config(config).schedule.misfire_grace_s == 604800


class TestInit:
    def test_init_force_on_a_full_disk_leaves_the_old_config_whole(self, tmp_path):
        """`init --force` that cannot write the whole example (a file size limit stands in for a full disk)
        leaves the user's config as it was and no temp file beside it."""
        import resource

        mine = "# my precious config\n[[task]]\nname = 'a'\nprompt = 'p'\ncheck = 'true'\n"
        (tmp_path / "overnight.toml").write_text(mine)

        def small_files() -> None:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "init", "--force"], cwd=tmp_path, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=60, preexec_fn=small_files, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert_one_line_error(result, 2, "cannot write")
        assert (tmp_path / "overnight.toml").read_text() == mine
        assert [path.name for path in tmp_path.iterdir()] == ["overnight.toml"]

    def test_init_force_keeps_the_files_permissions(self, tmp_path):
        """The example replaces the config whole, with the permissions the user gave it."""
        config = tmp_path / "overnight.toml"
        config.write_text("# mine\n")
        config.chmod(0o640)
        assert overnight("init", "--force", cwd=tmp_path).returncode == 0
        assert "[model]" in config.read_text() and config.stat().st_mode & 0o777 == 0o640

    def test_init_force_writes_a_writable_config_in_a_read_only_folder(self):
        """The temp file beside the config needs a folder we may write in; a config we may write in a folder
        we may not (a shared, read-only settings folder) is written in place, as before the temp file."""
        base = Path(tempfile.mkdtemp(prefix="overnight-init-"))  # not under pytest's folder, which nobody may not enter
        prefix: list[str] = []
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("running as root without setpriv: no ordinary user whom a folder's mode stops")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        try:
            folder = base / "settings"
            folder.mkdir()
            config = folder / "overnight.toml"
            config.write_text("# mine\n")
            config.chmod(0o666)
            folder.chmod(0o555)
            base.chmod(0o755)
            env = {**os.environ, "HOME": str(base), "PYTHONPATH": str(Path(__file__).parent.parent)}
            done = subprocess.run(
                [*prefix, sys.executable, "-m", "orchestrator.cli", "init", "--force", "-c", str(config)],
                env=env, capture_output=True, text=True, timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert "[model]" in config.read_text()
        finally:
            subprocess.run(["chmod", "-R", "u+rwX", str(base)], capture_output=True)
            shutil.rmtree(base, ignore_errors=True)

    @pytest.mark.parametrize("force", [True, False])
    def test_init_on_a_pipe_is_refused_and_leaves_it(self, tmp_path, force):
        """`init -c <fifo>` neither blocks on the pipe nor replaces it: one line, exit 2."""
        os.mkfifo(tmp_path / "overnight.toml")
        result = overnight("init", *(["--force"] if force else []), cwd=tmp_path)
        assert_one_line_error(result, 2, "overnight.toml", "not a regular file")
        assert (tmp_path / "overnight.toml").is_fifo()


class TestStoreUrl:
    @pytest.mark.parametrize("query", ["timeout=abc", "check_same_thread=maybe", "mode=ro", "bogus=1"])
    @pytest.mark.parametrize("command", ["run", "serve"])
    def test_a_query_the_driver_cannot_take_or_ignores_is_refused_at_load(self, tmp_path, repo, query, command):
        """`[store] url` arguments the sqlite driver refuses or ignores: exit 2 naming the key; stderr holds
        that one JSON line and nothing else (no traceback, no SQLAlchemy warning)."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "sqlite:///x.db?{query}"\n')
        result = overnight(command, "--config", str(config), "--log-format", "json")
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        event = json.loads(line)
        assert event["event"] == "command_failed" and "[store] url" in event["error"] and query.split("=")[0] in event["error"]
        assert not (tmp_path / "x.db").exists() and not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        ("url", "said"),
        [
            ("sqlite:///file:x.db?cache=shared&uri=true", "cache=shared"),
            ("sqlite:///file:x.db%3Fcache%3Dshared?uri=true", "cache=shared"),
            ("sqlite:///file:x.db%3Fmode%3Dmemory?uri=true", "in-memory"),
            ("sqlite:///file::memory:?uri=true", "in-memory"),
            ("sqlite:///file:/x.db?vfs=memdb&uri=true", "in-memory"),
            ("sqlite:///file://localhost?uri=true", "in-memory"),
        ],
        ids=[
            "shared-cache", "shared-cache-in-the-database-part", "memory-in-the-database-part", "memory-uri", "memdb-vfs",
            "temporary-uri-with-an-authority",
        ],
    )
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_a_sqlite_database_not_shared_with_waits_is_refused_at_load(self, tmp_path, repo, url, said, command):
        """A SQLite URI in the shared cache (whose writes fail with "database table is locked" at once, the busy timeout
        ignored, at concurrency above 1) or in memory however it is written (SQLite's `memdb` files, and the temporary
        database `file://localhost` names were taken): exit 2 naming `[store] url` and why, one line, before any
        database or state dir is made."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        assert_one_line_error(overnight(command, "--config", str(config)), 2, "[store] url", said)
        assert not list(tmp_path.glob("x.db*")) and not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        ("url", "said"),
        [
            ("sqlite:///file:x.db?nolock=1&uri=true", "nolock=1"),
            ("sqlite:///file:x.db?nolock=yes&uri=true", "nolock=yes"),
            ("sqlite:///file:x.db?nolock=TRUE&uri=true", "nolock=TRUE"),
            ("sqlite:///file:x.db?nolock=On&uri=true", "nolock=On"),
            ("sqlite:///file:x.db?nolock=2&uri=true", "nolock=2"),
            ("sqlite:///file:x.db?nolock=0x1&uri=true", "nolock=0x1"),
            ("sqlite:///file:x.db?nolock=257&uri=true", "nolock=257"),
            ("sqlite:///file:x.db%3Fnolock%3D1%26nolock%3D0?uri=true", "nolock=1"),
            ("sqlite:///file:x.db?vfs=unix-none&uri=true", "vfs=unix-none"),
            ("sqlite:///file:x.db%3Fvfs%3Dunix%26vfs%3Dunix-none?uri=true", "vfs=unix-none"),
            ("sqlite:///file:x.db%3Fnolock%2500x%3D1?uri=true", "nolock=1"),
            ("sqlite:///file:x.db%3Fvfs%3Dunix-none%2500x?uri=true", "vfs=unix-none"),
        ],
        ids=[
            "1", "yes", "TRUE", "On", "2", "hex", "low-byte-1", "first-of-two-in-the-database-part", "unix-none", "last-vfs-wins",
            "name-cut-by-a-nul", "value-cut-by-a-nul",
        ],
    )
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_a_sqlite_store_without_file_locks_is_refused_at_load(self, tmp_path, repo, url, said, command):
        """`nolock` in any form SQLite takes as true (a number not 0; on, yes, true in any case; the first of the name
        counting, as in SQLite) and `vfs=unix-none` (the last `vfs` counting) turn SQLite's file locks off: writers at
        once (a night's tasks at concurrency above 1, serve and run together) could corrupt the store. Exit 2 naming
        `[store] url`, why and what to drop, one line, before any database or state dir is made."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        result = overnight(command, "--config", str(config))
        drop = "drop nolock" if said.startswith("nolock") else f"drop {said}"
        assert_one_line_error(result, 2, "[store] url", said, "file locks off", "corrupt the store", drop)
        assert not list(tmp_path.glob("x.db*")) and not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        ("url", "said"),
        [
            ("sqlite:///file:x.db?immutable=1&uri=true", "immutable=1"),
            ("sqlite:///file:x.db?immutable=Yes&uri=true", "immutable=Yes"),
            ("sqlite:///file:x.db?immutable=0X1&uri=true", "immutable=0X1"),
            ("sqlite:///file:x.db?mode=ro&uri=true", "mode=ro"),
            ("sqlite:///file:x.db%3Fmode%3Drw%26mode%3Dro?uri=true", "mode=ro"),
            ("sqlite:///file:x.db%3Fmode%3Dro%26mode%3Drwc?uri=true", "mode=ro"),
            ("sqlite:///file:x.db%3Fimmutable%2500x%3D1?uri=true", "immutable=1"),
            ("sqlite:///file:x.db%3Fmode%3Dro%2500x?uri=true", "mode=ro"),
        ],
        ids=[
            "immutable", "immutable-Yes", "immutable-hex", "read-only", "read-only-last", "read-only-then-wider",
            "name-cut-by-a-nul", "value-cut-by-a-nul",
        ],
    )
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_a_read_only_sqlite_store_is_refused_at_load(self, tmp_path, repo, url, said, command):
        """`immutable` (true as SQLite reads it) or `mode=ro` (last, or before a wider mode SQLite then refuses): the
        store is written every night, which failed as it opened (exit 4). Exit 2 at load, saying it must be writable."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        result = overnight(command, "--config", str(config))
        assert_one_line_error(result, 2, "[store] url", said, "the store must be writable", f"drop {said}")
        assert not list(tmp_path.glob("x.db*")) and not (tmp_path / "state").exists()

    @pytest.mark.parametrize(
        ("url", "folder"),
        [
            ("sqlite:////", "/"),
            ("sqlite:///file:///?uri=true", "/"),
            ("sqlite:///kept", "kept"),
            ("sqlite:///file:kept?mode=rwc&uri=true", "kept"),
            ("sqlite:///kept/", "kept"),
        ],
        ids=["root", "root-uri", "relative-folder", "relative-folder-uri", "trailing-slash"],
    )
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_a_sqlite_store_naming_a_folder_is_refused_at_load(self, tmp_path, repo, url, folder, command):
        """`sqlite:////` (the root folder) or a URL whose database is an existing folder cannot be opened as a database:
        exit 2 at load naming the folder, one line; nothing is made in it or beside it."""
        (tmp_path / "kept").mkdir()
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        result = overnight(command, "--config", str(config))
        shown = "/" if folder == "/" else str(tmp_path / folder)
        assert_one_line_error(result, 2, "[store] url", f"{shown} names a folder, not a database file")
        assert not list((tmp_path / "kept").iterdir()) and not (tmp_path / "state").exists()

    def test_sqlite_parameters_sqlite_ignores_or_reads_as_false_are_accepted(self, tmp_path, repo):
        """SQLite's parameter names are case-sensitive (`NoLock`, `Immutable` are none of its own) and a boolean is
        false unless a number not 0 or on/yes/true (`full`, `+1`, a number past 32 bits); of a repeated `nolock` the
        first counts, of a repeated `vfs` or `mode` the last. None of these is refused (the store's file there, as `mode=rw`
        needs)."""
        import sqlite3

        from orchestrator.config import load_config

        sqlite3.connect(tmp_path / "x.db").close()
        for query in (
            "nolock=0", "nolock=full", "nolock=%2B1", "nolock=", "NoLock=1", "immutable=0", "immutable=2147483648",
            "Immutable=1", "vfs=unix", "mode=rw", "mode=rwc", "Mode=ro", "nolock=256", "nolock=0x100", "immutable=512",
        ):
            config = config_with(tmp_path, repo, extra=f'[store]\nurl = "sqlite:///file:x.db?{query}&uri=true"\n')
            assert load_config(config).store.url.endswith(f"{query}&uri=true"), query
        for database in ("file:x.db%3Fnolock%3D0%26nolock%3D1", "file:x.db%3Fvfs%3Dunix-none%26vfs%3Dunix"):
            config = config_with(tmp_path, repo, extra=f'[store]\nurl = "sqlite:///{database}?uri=true"\n')
            assert load_config(config).store.url.startswith(f"sqlite:///{database}"), database

    def test_nolock_is_refused_exactly_where_sqlite_writes_without_a_lock(self, tmp_path, repo):
        """Each value of `nolock` is refused at load where, and only where, this SQLite writes past another connection's
        exclusive lock with it: SQLite reads a value starting with a digit as a 32-bit int (hex after `0x`) cut to its
        low byte (`256` is false, `0x1` true), so a reading of its own could drift from SQLite's either way."""
        import sqlite3

        from orchestrator.config import load_config
        from orchestrator.errors import ConfigError

        def sqlite_writes_unlocked(value: str) -> bool:
            database = tmp_path / "probe.db"
            database.unlink(missing_ok=True)
            holder = sqlite3.connect(database, isolation_level=None)
            try:
                holder.execute("CREATE TABLE t (a)")
                holder.execute("BEGIN EXCLUSIVE")
                writer = sqlite3.connect(f"file:{database}?nolock={value}", uri=True, timeout=0)
                try:
                    with writer:
                        writer.execute("INSERT INTO t VALUES (1)")
                    return True
                except sqlite3.OperationalError:
                    return False
                finally:
                    writer.close()
            finally:
                holder.close()

        values = ("1", "0", "2", "255", "256", "257", "512", "0x1", "0X1", "0x100", "0x101", "0x7fffffff", "0x80000001",
                  "0x000000001", "0x123456789", "0xg", "2147483647", "2147483648", "0000000000000257", "12345678901", "1x",
                  "1.5", "yes", "on", "TRUE", "full", "off")
        for value in values:
            config = config_with(tmp_path, repo, extra=f'[store]\nurl = "sqlite:///file:x.db?nolock={value}&uri=true"\n')
            try:
                load_config(config)
                refused = False
            except ConfigError:
                refused = True
            assert refused == sqlite_writes_unlocked(value), value

    def test_a_private_cache_is_accepted(self, tmp_path, repo):
        """`cache=private`, SQLite's default, and a parameter name SQLite does not know (`Cache`: its names are
        case-sensitive) are no shared cache."""
        from orchestrator.config import load_config

        for query in ("cache=private", "Cache=shared"):
            config = config_with(tmp_path, repo, extra=f'[store]\nurl = "sqlite:///file:x.db?{query}&uri=true"\n')
            assert load_config(config).store.url.endswith(f"{query}&uri=true")

    def test_a_uri_query_sqlite_takes_is_accepted(self, tmp_path, repo):
        """`?mode=...&uri=true` is SQLite's own URI syntax: passed to SQLite, not refused."""
        from orchestrator.config import load_config

        config = config_with(tmp_path, repo, extra='[store]\nurl = "sqlite:///file:x.db?mode=rwc&uri=true&timeout=5"\n')
        assert load_config(config).store.url.endswith("timeout=5")

    @pytest.mark.parametrize(("url", "said"), SQLITE_URIS_SQLITE_CANNOT_OPEN, ids=SQLITE_URIS_SQLITE_CANNOT_OPEN_IDS)
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_a_sqlite_uri_sqlite_cannot_open_is_refused_at_load(self, tmp_path, repo, url, said, command):
        """A `mode` or `cache` value SQLite does not know (it compares them exactly: `RO`, `Rw`), a `mode` wider than the
        one before it, a last `vfs` no VFS of this SQLite is named (`UNIX-NONE`), an authority other than `localhost`
        (`file://otherhost/`), or `mode`, `cache` or `vfs` given twice in the query (SQLAlchemy hands SQLite
        `mode=('rw', 'ro')`): the store failed as it opened (exit 4). Exit 2 at load naming `[store] url` and the
        parameter, one line, nothing made."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        assert_one_line_error(overnight(command, "--config", str(config)), 2, "[store] url", said)
        assert not list(tmp_path.glob("x.db*")) and not (tmp_path / "state").exists()

    @pytest.mark.parametrize(("url", "said"), SQLITE_URIS_SQLITE_CANNOT_OPEN, ids=SQLITE_URIS_SQLITE_CANNOT_OPEN_IDS)
    def test_each_sqlite_uri_refused_at_load_is_one_sqlite_cannot_open(self, tmp_path, url, said):
        """Each URI refused above is one this SQLite, through the driver, refuses to open on a database that is there: the
        refusal reads SQLite, it does not guess."""
        import sqlite3

        from sqlalchemy import create_engine, text
        from sqlalchemy.exc import OperationalError

        sqlite3.connect(tmp_path / "x.db").close()
        engine = create_engine(url.replace("sqlite:///file:x.db", f"sqlite:///file:{tmp_path}/x.db"))
        try:
            with pytest.raises(OperationalError):
                with engine.connect() as connection:
                    connection.execute(text("SELECT 1"))
        finally:
            engine.dispose()

    @pytest.mark.parametrize(
        "url",
        [
            "sqlite:///file:x.db?vfs=unix-dotfile&uri=true",
            "sqlite:///file:x.db?vfs=unix-excl&uri=true",
            "sqlite:///file:x.db?vfs=unix&cache=private&mode=rwc&uri=true",
            "sqlite:///file:x.db%3Fvfs%3DNOPE%26vfs%3Dunix?uri=true",
            "sqlite:///file:x.db?mode=&vfs=&uri=true",
            "sqlite:///file:x.db?nolock=1&nolock=1&uri=true",
        ],
        ids=["dotfile", "excl", "known-values", "unknown-vfs-then-known", "blank-values-dropped", "nolock-twice"],
    )
    def test_sqlite_uris_sqlite_opens_are_accepted_and_open(self, tmp_path, repo, url):
        """What this SQLite opens stays accepted: its other VFSs, known values, an unknown `vfs` SQLite never looks up (only
        the last counts), blank values (SQLAlchemy drops them) and a boolean given twice in the query (SQLite reads
        `nolock=('1', '1')` as false). The store opens and makes its tables."""
        from orchestrator.config import load_config
        from runs.store import RunStore

        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        RunStore.open(load_config(config).store_url).close()

    @pytest.mark.parametrize(
        "url",
        ["sqlite:///file:x.db?mode=rw&uri=true", "sqlite:///file:x.db%3Fmode%3Drwc%26mode%3Drw?uri=true"],
        ids=["rw", "rw-last"],
    )
    @pytest.mark.parametrize("command", ["run", "report"])
    def test_mode_rw_on_a_store_not_there_yet_is_refused_at_load(self, tmp_path, repo, url, command):
        """`mode=rw` (the last `mode`) opens only a file that is there: the first night, which makes its store, failed as it
        opened ("unable to open database file", exit 4). Exit 2 at load saying so and what to use, nothing made."""
        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        result = overnight(command, "--config", str(config))
        assert_one_line_error(result, 2, "[store] url", "mode=rw opens only a database file that is there", "use mode=rwc")
        assert not list(tmp_path.glob("x.db*")) and not (tmp_path / "state").exists()

    def test_a_relative_sqlite_uri_keeps_its_own_parameters(self, tmp_path, repo):
        """Parameters in a relative `file:` URI's own part (`file:x.db%3Fvfs%3Dunix-dotfile`), which the load checks read,
        reach SQLite as the store opens: under the dot-file VFS, which has no shared memory, the store keeps its rollback
        journal (they were dropped, and the store went to WAL under the default VFS)."""
        import sqlite3

        from orchestrator.config import load_config
        from runs.store import RunStore

        config = config_with(tmp_path, repo, extra='[store]\nurl = "sqlite:///file:x.db%3Fvfs%3Dunix-dotfile?uri=true"\n')
        RunStore.open(load_config(config).store_url).close()
        reader = sqlite3.connect(tmp_path / "x.db")
        try:
            assert reader.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        finally:
            reader.close()

    @pytest.mark.parametrize(
        ("written", "read"),
        [("nolock%00x=1", "nolock=1"), ("vfs=unix-none%00x", "vfs=unix-none"), ("immutable%00x=1", "immutable=1")],
        ids=["name", "vfs-value", "immutable-name"],
    )
    def test_sqlite_ends_a_uri_parameter_at_a_nul(self, tmp_path, written, read):
        """SQLite ends a parameter's name or value at an escaped NUL (`%00`), which is why the load reads them so: written
        either way, the store opens alike (here read-only, `immutable`, the one of the three a test can see)."""
        import sqlite3

        sqlite3.connect(tmp_path / "x.db").close()
        for parameter in (written, read):
            connection = sqlite3.connect(f"file:{tmp_path}/x.db?{parameter}", uri=True)
            try:
                if parameter.startswith("immutable"):
                    with pytest.raises(sqlite3.OperationalError, match="readonly"):
                        connection.execute("CREATE TABLE t (a)")
                else:
                    connection.execute("CREATE TABLE IF NOT EXISTS t (a)")
            finally:
                connection.close()

    @pytest.mark.parametrize("command", ["run", "gc"])
    def test_a_sqlite_uri_path_cut_by_a_nul_is_the_file_sqlite_opens(self, tmp_path, repo, command):
        """`file:x%00y.db` is SQLite's file `x` (it ends a path at an escaped NUL): overnight reads the path so, and the
        commands use that file (the path was read with the NUL in it: a traceback, "embedded null byte")."""
        config = config_with(tmp_path, repo, extra='[store]\nurl = "sqlite:///file:x%2500y.db?uri=true"\n')
        result = overnight(command, "--config", str(config))
        assert "Traceback" not in result.stderr and result.returncode in (0, 3), result.stderr
        assert (tmp_path / "x").is_file() or command == "gc"

    def test_a_sqlite_value_cut_by_a_nul_to_one_sqlite_knows_is_accepted(self, tmp_path, repo):
        """`mode=rwc%00x` is SQLite's `mode=rwc` (it ends a value at an escaped NUL): accepted, and the store opens."""
        from orchestrator.config import load_config
        from runs.store import RunStore

        config = config_with(tmp_path, repo, extra='[store]\nurl = "sqlite:///file:x.db%3Fmode%3Drwc%2500x?uri=true"\n')
        RunStore.open(load_config(config).store_url).close()
        assert (tmp_path / "x.db").is_file()

    @pytest.mark.parametrize(
        "url",
        ["sqlite:///file:x.db%3Fa%3D1%23f?uri=true&cache=private&immutable=1", "sqlite:///file:x.db%23f?uri=true&immutable=1"],
        ids=["after-own-parameters", "straight-after-the-path"],
    )
    def test_a_relative_sqlite_uri_keeps_its_fragment(self, tmp_path, repo, url):
        """SQLite reads no parameter past a `#`, not even those the driver appends from the query after it
        (`file:x.db?a=1#f?cache=private&immutable=1`, `file:x.db#f?immutable=1`), and neither does the load; the relative
        file, made absolute, keeps its fragment so they stay unread (dropped, `immutable=1` reached SQLite: a store it
        could not make or write)."""
        from orchestrator.config import load_config
        from runs.store import RunStore

        config = config_with(tmp_path, repo, extra=f'[store]\nurl = "{url}"\n')
        RunStore.open(load_config(config).store_url).close()
        assert (tmp_path / "x.db").is_file()

    def test_mode_rw_on_a_store_that_is_there_is_accepted(self, tmp_path, repo):
        """Once the store's file is there, `mode=rw` opens it as SQLite does: accepted, and the store opens."""
        from orchestrator.config import load_config
        from runs.store import RunStore

        config = config_with(tmp_path, repo, extra='[store]\nurl = "sqlite:///file:x.db?mode=rw&uri=true"\n')
        RunStore.open(f"sqlite:///{tmp_path}/x.db").close()
        RunStore.open(load_config(config).store_url).close()


class TestUnreadableToml:
    @pytest.mark.parametrize(
        ("text", "fragment"),
        [("a = " + "[" * 600 + "]" * 600 + "\n", "nested too deeply"), ("[night]\nmax_iterations = " + "9" * 4301 + "\n", "4300 digits")],
        ids=["deep", "bigint"],
    )
    @pytest.mark.parametrize("command", [("run",), ("report",), ("notes",), ("gc",), ("serve", "--next")])
    def test_toml_python_cannot_read_is_not_valid_toml(self, tmp_path, text, fragment, command):
        """Nesting past Python's recursion limit, an integer past its 4300 digits: "not valid TOML", exit 2, no traceback."""
        (tmp_path / "overnight.toml").write_text(text)
        assert_one_line_error(overnight(*command, cwd=tmp_path), 2, "not valid TOML", fragment)

    @pytest.mark.parametrize(("encoding", "name"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
    @pytest.mark.parametrize("command", [("run",), ("serve", "--next")])
    def test_a_config_saved_as_utf_16_says_so(self, tmp_path, encoding, name, command):
        """A config written with a UTF-16 or UTF-32 byte-order mark (PowerShell's `>`) is one line naming its encoding and the fix."""
        text = '[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n'
        mark = "\ufeff" if encoding == "utf-16-be" else ""  # utf-16 and utf-32 write their mark themselves
        (tmp_path / "overnight.toml").write_bytes((mark + text).encode(encoding))
        assert_one_line_error(overnight(*command, cwd=tmp_path), 2, f"it is {name}", "save it as UTF-8")


class TestGitMissing:
    @pytest.mark.parametrize("command", ["run", "gc", "serve"])
    def test_git_not_on_path_is_one_line_naming_path(self, tmp_path, repo, command):
        """cron's PATH without git: one line saying so and naming PATH, exit 2, before any file is made."""
        import shutil

        config = config_with(tmp_path, repo, replace=("python check_greet.py", "true"))
        bare_path = tmp_path / "bin"
        bare_path.mkdir()
        (bare_path / "true").symlink_to(shutil.which("true"))
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", command, "--config", str(config), *(["--log-format", "human"] if command != "gc" else [])],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "PATH": str(bare_path)},
        )
        assert_one_line_error(result, 2, "git not found on PATH", f"PATH={bare_path}")
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("command", ["run", "gc", "serve"])
    def test_a_git_that_cannot_start_is_one_line_with_gits_reason(self, tmp_path, repo, command):
        """A broken ~/.gitconfig (here GIT_CONFIG_GLOBAL's) makes every git fail, `git version` too: one line with
        git's reason, exit 2, nothing made; GitPython's import failed with a traceback, exit 1."""
        config = config_with(tmp_path, repo, replace=("python check_greet.py", "true"))
        broken = tmp_path / "gitconfig"
        broken.write_text("[user\n")
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", command, "--config", str(config), *(["--log-format", "human"] if command != "gc" else [])],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "GIT_CONFIG_GLOBAL": str(broken)},
        )
        assert_one_line_error(result, 2, "git cannot run", f"bad config line 1 in file {broken}")
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("command", ["run", "gc"])
    def test_a_repository_whose_config_git_cannot_read_blames_the_repository(self, tmp_path, repo, command):
        """A broken .git/config: the line names [repo] path and git's reason; it said "[repo] base: 'HEAD' is not a commit"."""
        config = config_with(tmp_path, repo, replace=("python check_greet.py", "true"))
        with (repo / ".git" / "config").open("a") as settings:
            settings.write("[core\n")
        result = overnight(command, "--config", str(config), *(["--log-format", "human"] if command != "gc" else []))
        assert_one_line_error(result, 2, "[repo] path: git refuses", "bad config line")
        assert "[repo] base" not in result.stderr


class TestBase:
    @pytest.mark.parametrize("base", ["HEAD^{tree}", "treetag"])
    @pytest.mark.parametrize("command", ["run", "gc"])
    def test_a_base_naming_a_tree_blames_the_base(self, tmp_path, repo, base, command):
        """`[repo] base` naming a tree, not a commit: the line names [repo] base, not the repository."""
        from tests.conftest import git

        git(repo, "tag", "treetag", "HEAD^{tree}")
        config = config_with(tmp_path, repo, replace=("[repo]\n", f'[repo]\nbase = "{base}"\n'))
        result = overnight(command, "--config", str(config))
        assert_one_line_error(result, 2, "[repo] base", repr(base), "is not a commit", "tree")
        assert "[repo] path" not in result.stderr and not (tmp_path / "state").exists()

    @pytest.mark.parametrize("command", ["run", "gc"])
    def test_a_negated_base_is_refused_before_the_night(self, tmp_path, repo, command):
        """`^HEAD` passed `rev-parse --verify` (as "^<sha>"); `git worktree add` refused it once the night had
        begun: a crashed run and a state dir made for nothing. Now exit 2 naming [repo] base, before any file."""
        config = config_with(tmp_path, repo, replace=("[repo]\n", '[repo]\nbase = "^HEAD"\n'))
        assert_one_line_error(overnight(command, "--config", str(config)), 2, "[repo] base", "'^HEAD'")
        assert not (tmp_path / "state").exists()


    @pytest.mark.parametrize("base", ["full", "short", "v1", "HEAD~1", "branch^{commit}", "@"])
    def test_what_names_a_commit_is_taken_as_base(self, tmp_path, repo, base):
        """The check that refuses `^HEAD` (git's answer must be a commit's full name) takes every other way
        of naming a commit: a full or abbreviated id, an annotated tag, a relative name, a peeled one."""
        from tests.conftest import git

        git(repo, "tag", "-a", "v1", "-m", "a tag")
        git(repo, "commit", "-q", "--allow-empty", "-m", "another")
        tip = git(repo, "rev-parse", "HEAD").strip()
        named = {"full": tip, "short": tip[:7], "branch^{commit}": git(repo, "branch", "--show-current").strip() + "^{commit}"}
        config = config_with(tmp_path, repo, replace=("[repo]\n", f'[repo]\nbase = "{named.get(base, base)}"\n'))
        result = overnight("gc", "--dry-run", "--config", str(config))
        assert (result.returncode, result.stdout.strip()) == (0, "nothing to collect"), result.stderr


class TestGcAndServeCheckLikeRun:
    @pytest.mark.parametrize("state", ["repo", "repo/.git/overnight"])
    @pytest.mark.parametrize("command", [("gc",), ("gc", "--dry-run"), ("serve",)])
    def test_a_state_dir_in_the_checkout_or_its_git_is_refused_before_any_file(self, tmp_path, repo, state, command):
        """gc and serve refuse what run refuses: no lock, no store, nothing written into the user's checkout or .git."""
        from tests.conftest import git

        config = config_with(tmp_path, repo, replace=('dir = "state"', f'dir = "{state}"'))
        assert_one_line_error(overnight(*command, "--config", str(config)), 2, "[state] dir", "a folder of its own")
        assert git(repo, "status", "--porcelain", "--ignored") == "" and not (repo / ".git" / "overnight").exists()

    def test_serve_with_no_repository_is_refused_at_once(self, tmp_path, repo):
        """serve on a [repo] path that is no repository exits 2 at once, instead of serving nights that each exit 2."""
        config = config_with(tmp_path, repo, replace=(f'path = "{repo}"', f'path = "{tmp_path / "nothing"}"'))
        assert_one_line_error(overnight("serve", "--config", str(config)), 2, "[repo] path")
        assert not (tmp_path / "state").exists()


class TestModelAddress:
    @pytest.mark.parametrize("key", ["sk-live-SECRET\n", " sk-live-SECRET", "sk-live-SECRET\t", "sk-live-\u201cSECRET\u201d", "sk-\x07SECRET"])
    def test_an_api_key_no_header_can_carry_is_refused_without_showing_it(self, tmp_path, repo, key):
        """A key copied with its newline passed the checks; every request then failed as iteration_error, and
        the error, key and all, went into notes.md, the log and the next prompt (found by a review)."""
        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, model={"api_key": key})
        done = overnight("run", "--config", str(config))
        assert_one_line_error(done, 2, "[model] api_key", "the key is not shown")
        assert "SECRET" not in done.stderr + done.stdout and not (tmp_path / "state").exists()

    @pytest.mark.parametrize("api_base", ["http://a b:8080/v1", "http://127.0.0.1:8080/v1 ", "http://127.0.0.1:8080/v\n1", "http://127.0.0.1:8080/v1\u201d"])
    def test_an_api_base_with_a_space_or_control_character_is_refused(self, tmp_path, repo, api_base):
        config = write_config(tmp_path / "overnight.toml", api_base=api_base, repo=repo)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, "[model] api_base", "a control character or a character outside ASCII")
        assert not (tmp_path / "state").exists()

    def test_a_key_with_spaces_inside_is_still_read(self, tmp_path, repo):
        from orchestrator.config import load_config

        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, model={"api_key": "Bearer-ish key 123"})
        assert load_config(config).model.api_key == "Bearer-ish key 123"


class TestNotesThatAreNotAFile:
    """A pipe at notes.md (mkfifo): `notes` hung, and `run` hung after night_started, deaf to SIGTERM,
    until something wrote into the pipe (found by a review); so did one at state-id. Now exit 4, at once."""

    def test_notes_refuses_a_pipe(self, tmp_path, repo):
        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo)
        (tmp_path / "state").mkdir()
        os.mkfifo(tmp_path / "state" / "notes.md")
        assert_one_line_error(overnight("notes", "--config", str(config)), 4, "notes.md", "not a regular file")

    def test_run_refuses_a_pipe_at_the_state_id(self, tmp_path, repo):
        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo)
        (tmp_path / "state").mkdir()
        os.mkfifo(tmp_path / "state" / "state-id")
        done = overnight("run", "--config", str(config))
        assert done.returncode == 4 and "state-id: not a regular file" in done.stderr.strip().splitlines()[-1]

    def test_run_refuses_a_pipe_before_asking_the_model(self, tmp_path, repo, server):
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
        (tmp_path / "state").mkdir()
        os.mkfifo(tmp_path / "state" / "notes.md")
        done = overnight("run", "--config", str(config))
        assert done.returncode == 4 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("overnight: error: cannot read") and "not a regular file" in done.stderr
        assert server.requests == []


class TestHandEditedNotes:
    @pytest.mark.parametrize(("command", "code"), [(("notes", "--task", "fix-greet"), 0), (("run", "--log-format", "human"), 3)])
    def test_an_iteration_number_too_long_for_int_is_a_persons_heading_not_a_crash(self, tmp_path, repo, command, code):
        """A header whose iteration number a hand edit made 5000 digits long (more than int() reads) crashed `overnight notes`
        and every night (a traceback, exit 1, the run `crashed`): now it is a person's heading and the night goes on."""
        config = config_with(tmp_path, repo)
        (tmp_path / "state").mkdir()
        header = f"## 2026-01-31 04:05 UTC · task `fix-greet` · iteration {'9' * 5000} · `max_turns`"
        (tmp_path / "state" / "notes.md").write_text(f"{header}\n\n**Correction:** look first.\n")
        done = overnight(*command, "--config", str(config))
        assert done.returncode == code, done.stderr
        assert "Traceback" not in done.stderr


class TestLocale:
    def test_a_check_the_locale_cannot_encode_is_refused_at_load(self, tmp_path, repo):
        """Under a Latin-1 locale, a check with '→' raised UnicodeEncodeError in every iteration (an
        iteration_error, the task parked; found by a review): exit 2 now, naming the key and the fix."""
        locales = tmp_path / "locales"
        locales.mkdir()
        made = subprocess.run(["localedef", "--no-archive", "-i", "en_US", "-f", "ISO-8859-1", str(locales / "en_US.ISO-8859-1")],
                              capture_output=True, text=True)
        if made.returncode not in (0, 1) or not (locales / "en_US.ISO-8859-1").is_dir():
            pytest.skip(f"cannot make a Latin-1 locale here: {made.stderr.strip()[:100]}")
        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo,
                              tasks=[{"name": "t", "prompt": "p", "check": "echo 'failed \u2192 see log'; false"}])
        env = {"PATH": os.environ["PATH"], "LOCPATH": str(locales), "LC_ALL": "en_US.ISO-8859-1", "NO_COLOR": "1"}
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
                              capture_output=True, text=True, encoding="latin-1", errors="replace", stdin=subprocess.DEVNULL, timeout=60, env=env)
        assert_one_line_error(done, 2, "[[task]] #1 check", "iso8859-1", "UTF-8 locale")
        assert not (tmp_path / "state").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's limit on one argument (MAX_ARG_STRLEN)")
class TestLongerThanOneArgument:
    LIMIT = 32 * os.sysconf("SC_PAGE_SIZE")

    @pytest.mark.parametrize(
        ("replace", "key", "command"),
        [
            (("check = \"python check_greet.py\"", "check = \"true {long}\""), "[[task]] #1 check", "run"),
            (("[repo]\n", "[repo]\nbase = \"{long}\"\n"), "[repo] base", "run"),
            (("[repo]\n", "[repo]\nbase = \"{long}\"\n"), "[repo] base", "gc"),
            (("[repo]\n", "[repo]\nkeep = [\"{long}\"]\n"), "[repo] keep", "run"),
        ],
    )
    def test_a_value_git_or_bash_cannot_be_given_is_refused_before_the_night(self, tmp_path, repo, replace, key, command):
        """A check, base or keep pattern past 128 KiB could never reach bash or git (E2BIG): the check failed every iteration
        with an iteration_error's traceback, a base was a traceback (exit 1) and a keep pattern stopped the first rollback
        (exit 4); now exit 2 naming the key, before the state dir."""
        config = config_with(tmp_path, repo, (replace[0], replace[1].format(long="x" * self.LIMIT)))
        result = overnight(command, "--config", str(config))
        assert_one_line_error(result, 2, key)
        assert len(result.stderr) < 1000
        assert not (tmp_path / "state").exists()

    def test_keep_patterns_each_within_one_argument_but_past_the_command_line_together_are_refused(self, tmp_path, repo):
        """17 patterns of 124 KiB, each one argument git can take, went onto one command line together (`git clean -e`,
        `ls-files --exclude=`): past its 2 MiB the first rollback stopped the night (E2BIG, exit 4); now exit 2 naming the
        key, before the state dir."""
        each = self.LIMIT - 4096
        patterns = ", ".join(f'"{number:03d}{"x" * each}"' for number in range(os.sysconf("SC_ARG_MAX") // each + 1))
        config = config_with(tmp_path, repo, ("[repo]\n", f"[repo]\nkeep = [{patterns}]\n"))
        result = overnight("run", "--config", str(config))
        assert_one_line_error(result, 2, "[repo] keep")
        assert not (tmp_path / "state").exists()

    def test_the_longest_check_bash_can_start_is_taken_and_runs(self, tmp_path):
        from orchestrator.commands import run_shell
        from orchestrator.config import TaskConfig

        check = "true " + "x" * (self.LIMIT - 6)
        assert TaskConfig(name="t", prompt="p", check=check).check == check
        assert run_shell(check, tmp_path, timeout_s=30, max_output_chars=100).exit_code == 0

class TestLaxTypes:
    @pytest.mark.parametrize(
        ("sections", "key"),
        [
            ({"night": {"max_tokens_per_night": True}}, "[night] max_tokens_per_night"),
            ({"night": {"concurrency": True}}, "[night] concurrency"),
            ({"model": {"request_timeout_s": True}}, "[model] request_timeout_s"),
            ({"model": {"retries": False}}, "[model] retries"),
            ({"guards": {"context_warn_ratio": True}}, "[guards] context_warn_ratio"),
            ({"tasks": [{"name": "t", "prompt": "p", "check": "   "}]}, "[[task]] #1 check"),
            ({"tasks": [{"name": "t", "prompt": " \n\t", "check": "true"}]}, "[[task]] #1 prompt"),
        ],
    )
    def test_a_boolean_for_a_number_or_a_blank_check_is_refused(self, tmp_path, repo, sections, key):
        """true is no token budget and '   ' no check (sh -c '   ' passes every submit): exit 2 naming the key."""
        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, **sections)
        assert_one_line_error(overnight("run", "--config", str(config)), 2, key)
        assert not (tmp_path / "state").exists()

    def test_numeric_strings_and_whole_floats_are_still_read(self, tmp_path, repo):
        """What was accepted stays accepted: "3" and 2.0 where a number goes."""
        from orchestrator.config import load_config

        config = write_config(
            tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, model={"max_tokens": 2.0, "temperature": "0.5"}, night={"max_iterations": "3"},
        )
        loaded = load_config(config)
        assert (loaded.model.max_tokens, loaded.model.temperature, loaded.night.max_iterations) == (2, 0.5, 3)


class TestLocalThreads:
    @pytest.mark.parametrize("value", ["\u00b2", "0", "four", "-2", "1025", "99999999999999999999", pytest.param("1" * 5000, id="5000-digits")])
    def test_a_bad_thread_count_is_one_line_before_the_night(self, tmp_path, repo, value):
        """OVERNIGHT_LOCAL_THREADS set to anything but a whole number above 0 ('²' passed str.isdigit, then crashed int()):
        exit 2 naming it, before the state dir, the model download or the server."""
        config = config_with(tmp_path, repo, replace=('name = "openai/scripted"', 'name = "local"'))
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "human"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "OVERNIGHT_LOCAL_THREADS": value},
        )
        assert_one_line_error(result, 2, "OVERNIGHT_LOCAL_THREADS", repr(value))
        assert not (tmp_path / "state").exists()

    def test_a_thread_count_is_taken(self, monkeypatch):
        """A plain number is the thread count; unset, the default (1 to 4)."""
        from orchestrator.cpu_threads import default_threads

        monkeypatch.setenv("OVERNIGHT_LOCAL_THREADS", "3")
        assert default_threads() == 3
        monkeypatch.delenv("OVERNIGHT_LOCAL_THREADS")
        assert 1 <= default_threads() <= 4


class TestMinor:
    def test_serve_next_reports_a_config_error_as_a_json_event(self, tmp_path):
        """`serve --next --log-format json`: a bad config is the command_failed JSON event, as from every other command."""
        (tmp_path / "overnight.toml").write_text('[schedule]\ncron = "bogus"\n[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n')
        result = overnight("serve", "--next", "--log-format", "json", cwd=tmp_path)
        assert result.returncode == 2
        (line,) = result.stderr.strip().splitlines()
        event = json.loads(line)
        assert event["event"] == "command_failed" and "[schedule] cron" in event["error"] and event["exit_code"] == 2

    def test_a_newline_in_a_path_stays_one_line(self, tmp_path):
        """A newline (or another control character) in what the error quotes is escaped: the error stays one line."""
        (tmp_path / "overnight.toml").write_text('[repo]\npath = "/tmp/x\\ny\\u2028z"\n[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n')
        result = overnight("run", "--log-format", "human", cwd=tmp_path)
        assert_one_line_error(result, 2, "[repo] path", "/tmp/x\\ny\\u2028z")

    @pytest.mark.parametrize("where", ["repo/.git/config", "repo/.git/junit.xml"])
    def test_junit_inside_the_repositorys_git_folder_is_refused(self, tmp_path, repo, where):
        """--junit must not write over the repository's .git/config (or anything in .git): exit 2, .git untouched."""
        from tests.conftest import git

        config = config_with(tmp_path, repo)
        before = (repo / ".git" / "config").read_text()
        assert_one_line_error(overnight("run", "--config", str(config), "--junit", str(tmp_path / where)), 2, "--junit", "git folder")
        assert (repo / ".git" / "config").read_text() == before and not (repo / ".git" / "junit.xml").exists()
        assert git(repo, "status", "--porcelain") == "" and not (tmp_path / "state").exists()


class TestHugeNumbers:
    @pytest.mark.parametrize("key", ["dead_loop_window", "dead_loop_recent"])
    def test_a_dead_loop_window_past_any_run_is_one_line(self, tmp_path, repo, key):
        """18446744073709551616 was a 50-line OverflowError traceback from the guard's deque, exit 1."""
        config = config_with(tmp_path, repo, extra=f"\n[guards]\n{key} = 18446744073709551616\n")
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "human"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        )
        assert_one_line_error(result, 2, key)
        assert not (tmp_path / "state").exists()

    def test_a_context_window_past_any_float_is_one_line_before_the_night(self, tmp_path, repo):
        """A context_window of 309 digits was an OverflowError traceback once the night had begun (run recorded crashed, exit 1)."""
        config = config_with(tmp_path, repo, ("[repo]\n", f"context_window = 1{'0' * 309}\n\n[repo]\n"))
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "human"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        )
        assert_one_line_error(result, 2, "[model] context_window")
        assert not (tmp_path / "state").exists()


class TestDocumentedBounds:
    """The edges docs/reference.md gives are exact: the last value allowed loads, the first past it is exit 2 naming the key."""

    @pytest.mark.parametrize(
        ("sections", "fine"),
        [
            ({"guards": {"repeat_remind_at": 4, "repeat_stop_at": 4}}, True),  # "remind not above stop": equal is fine
            ({"guards": {"failing_streak_at": 5, "failing_streak_stop_at": 5}}, True),  # "not below failing_streak_at"
            ({"night": {"concurrency": 64}}, True),
            ({"model": {"context_window": 1_000_000_000}}, True),
            ({"model": {"context_window": 1_000_000_001}}, False),
            ({"night": {"concurrency": 65}}, False),
            ({"night": {"deadline": "23:59"}}, True),
            # "(at least 1)" / "(at least 0)", as reference.md now says of each key without another bound.
            ({"night": {"max_turns": 1, "max_iterations": 1, "notes_budget_chars": 0}}, True),
            ({"night": {"max_turns": 0}}, False),
            ({"night": {"notes_budget_chars": -1}}, False),
            ({"night": {"max_tokens_per_night": 0}}, False),
            ({"guards": {"empty_stop_at": 1, "broken_stop_at": 1, "unknown_tool_stop_at": 1, "no_tool_call_stop_at": 1, "max_output_chars": 1}}, True),
            ({"guards": {"max_output_chars": 0}}, False),
            ({"night": {"deadline": "24:00"}}, False),
            # Each "at most" the config tables give, at it and just past it.
            ({"model": {"request_timeout_s": 86400, "temperature": 2, "retries": 100, "retry_backoff_s": 3600}}, True),
            ({"model": {"request_timeout_s": 86400.5}}, False),
            ({"model": {"temperature": 2.01}}, False),
            ({"model": {"retries": 101}}, False),
            ({"model": {"retry_backoff_s": 3600.5}}, False),
            ({"night": {"check_timeout_s": 86400, "command_timeout_s": 86400}}, True),
            ({"night": {"check_timeout_s": 86400.5}}, False),
            ({"state": {"keep_transcripts_days": 36500, "keep_notes_days": 36500}}, True),
            ({"state": {"keep_transcripts_days": 36500.5}}, False),
            ({"state": {"keep_notes_days": 0.5}}, False),  # "else 1 to 36500"
            ({"guards": {"dead_loop_window": 1000, "dead_loop_recent": 1000, "context_warn_ratio": 1}}, True),
            ({"guards": {"dead_loop_window": 1001}}, False),
            ({"guards": {"context_warn_ratio": 1.01}}, False),
            ({"tasks": [{"name": "a" * 64, "prompt": "p", "check": "true"}]}, True),
            ({"tasks": [{"name": "a" * 65, "prompt": "p", "check": "true"}]}, False),
            ({"tasks": [{"name": "fix.lock", "prompt": "p", "check": "true"}]}, False),
        ],
    )
    def test_each_bound_is_where_the_reference_puts_it(self, tmp_path, repo, sections, fine):
        import re

        from orchestrator.config import load_config
        from orchestrator.errors import ConfigError

        config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, **sections)
        if fine:
            load_config(config)
            return
        [(section, values)] = sections.items()
        key = "[[task]] #1 name" if section == "tasks" else f"[{section}] {next(iter(values))}"
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(config)


class TestPathsThatCannotBeLookedAt:
    """Path.exists() and is_dir() raise what is neither "nothing there" nor "a file in the way": a name too long
    here, and (the same code path) a folder on the way this user may not enter. Each was a traceback, exit 1."""

    TOO_LONG = "a" * 300

    @pytest.mark.parametrize("command", [("run",), ("report",), ("init",), ("serve", "--next")])
    def test_a_config_path_that_cannot_be_looked_at_is_one_line(self, tmp_path, command):
        assert_one_line_error(overnight(*command, "--config", self.TOO_LONG, cwd=tmp_path), 2, "config file", "File name too long")
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("command", [("report",), ("gc", "--dry-run")])
    def test_a_state_dir_that_cannot_be_looked_at_is_one_line(self, tmp_path, repo, command):
        config = config_with(tmp_path, repo, ('dir = "state"', f'dir = "{self.TOO_LONG}"'))
        assert_one_line_error(overnight(*command, "--config", str(config)), 4, "state dir", "File name too long")

    def test_a_junit_path_that_cannot_be_looked_at_is_one_line_before_the_night(self, tmp_path, repo):
        config = config_with(tmp_path, repo)
        result = overnight("run", "--config", str(config), "--log-format", "human", "--junit", str(tmp_path / self.TOO_LONG))
        assert_one_line_error(result, 2, "--junit", "File name too long")
        assert not (tmp_path / "state").exists()

    @pytest.mark.parametrize("command", [("run",), ("notes",)])
    def test_a_config_path_that_is_a_folder_is_named_once(self, tmp_path, command):
        """`--config` naming a folder: "Is a directory", the path said once (not Python's "[Errno 21] ...: '<path>'" after it)."""
        (tmp_path / "overnight.toml").mkdir()
        result = overnight(*command, cwd=tmp_path)
        assert_one_line_error(result, 2, "cannot read config file overnight.toml: Is a directory")
        assert result.stderr.count("overnight.toml") == 1


class TestPathsThatAreNotUtf8:
    @pytest.mark.parametrize("command", [("run",), ("serve",)])
    def test_a_config_in_a_folder_named_in_latin_1_is_one_line_before_the_state_dir(self, tmp_path, repo, command):
        """A config (and so its state dir) in a folder whose name is not UTF-8 is refused in one line, exit 2, before the state dir is made: the run store cannot record the paths."""
        folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
        folder.mkdir()
        config = config_with(folder, repo)
        assert_one_line_error(overnight(*command, "--config", str(config), "--log-format", "human"), 2, "--config", "caf\\xe9", "UTF-8")
        assert not (folder / "state").exists()


class TestHomeInPaths:
    def test_a_state_dir_under_home_is_made_there_not_as_a_folder_named_tilde(self, tmp_path, repo, monkeypatch):
        """`[state] dir = "~/…"` is in the user's home, as `~` in a SQLite `[store] url` is, not a folder named `~` beside the config."""
        home = tmp_path / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        config = config_with(tmp_path, repo, ('dir = "state"', 'dir = "~/night-state"'))
        done = overnight("gc", "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert (home / "night-state" / "overnight.lock").is_file()
        assert not (tmp_path / "~").exists()


class TestStateDirAmongTheUsersFiles:
    def test_the_home_folder_as_state_dir_is_refused_before_any_of_its_files_is_touched(self, tmp_path, repo, monkeypatch):
        """`dir = "~"`: a night deleted the user's old ~/transcripts/*.jsonl and removed a worktree of theirs kept in
        ~/worktrees; it is refused at load (exit 2, one line), every file there as it was."""
        from tests.conftest import git

        home = tmp_path / "home"
        (home / "transcripts").mkdir(parents=True)
        journal = home / "transcripts" / "journal.jsonl"
        journal.write_text('{"mine": 1}\n')
        os.utime(journal, (1e9, 1e9))
        git(repo, "worktree", "add", "-q", "--detach", str(home / "worktrees" / "experiment"))
        (home / "worktrees" / "experiment" / "greet.py").write_text("# my edit\n")
        monkeypatch.setenv("HOME", str(home))
        config = config_with(tmp_path, repo, ('dir = "state"', 'dir = "~"\nkeep_transcripts_days = 1'))
        refused = overnight("run", "--config", str(config))
        assert_one_line_error(refused, 2, "[state] dir", "your home folder", "a folder of its own")
        assert journal.is_file() and (home / "worktrees" / "experiment" / "greet.py").read_text() == "# my edit\n"
        assert sorted(entry.name for entry in home.iterdir()) == ["transcripts", "worktrees"]

    @pytest.mark.parametrize("state", ["/", "~", "~/.."])
    @pytest.mark.parametrize("command", ["report", "notes"])
    def test_the_home_folder_or_one_above_it_is_refused_by_every_command(self, tmp_path, repo, monkeypatch, state, command):
        """`/`, `~` and the folder home is in are refused as the config loads, by the commands that only read too (these
        two: a regression here must not write into `/`)."""
        home = tmp_path / "home"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        config = config_with(tmp_path, repo, ('dir = "state"', f'dir = "{state}"'))
        assert_one_line_error(overnight(command, "--config", str(config)), 2, "[state] dir", "home", "a folder of its own")

    def test_the_home_the_password_database_gives_is_refused_with_home_set_elsewhere(self, tmp_path, repo, monkeypatch):
        """HOME a CI job's temporary folder: the user's real home (`dir = "~root"` for root) was taken, its files reached."""
        import pwd

        real = pwd.getpwuid(os.getuid()).pw_dir
        if not os.path.isabs(real) or os.path.realpath(real) == "/":
            pytest.skip("this user's password entry names no home of its own")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        config = config_with(tmp_path, repo, ('dir = "state"', f'dir = "{real}"'))
        assert_one_line_error(overnight("report", "--config", str(config)), 2, "[state] dir", "your home folder")

    @pytest.mark.parametrize("command", [("run",), ("gc",)])
    def test_a_folder_of_the_checkout_holding_tracked_files_is_refused_before_they_are_touched(self, tmp_path, command):
        """`dir = "docs"` with docs/notes.md tracked: a night appended to it, deleted a tracked old transcripts/*.jsonl, and
        its exclude line hid the user's new files in docs/ from `git status`; refused (exit 2), the checkout untouched."""
        from tests.conftest import SAMPLE_FILES, git, make_repo

        tracked = {"docs/notes.md": "# design\n", "docs/transcripts/talk.jsonl": "{}\n"}
        repo = make_repo(tmp_path / "repo", {**SAMPLE_FILES, **tracked})
        os.utime(repo / "docs" / "transcripts" / "talk.jsonl", (1e9, 1e9))
        config = config_with(tmp_path, repo, ('dir = "state"', 'dir = "repo/docs"\nkeep_transcripts_days = 1'))
        assert_one_line_error(overnight(*command, "--config", str(config)), 2, "[state] dir", "git tracks", "docs/notes.md")
        assert git(repo, "status", "--porcelain", "--ignored") == ""
        assert "docs" not in (repo / ".git" / "info" / "exclude").read_text()

    def test_a_tracked_folder_of_the_main_checkout_is_refused_when_the_repo_path_is_a_linked_worktree(self, tmp_path):
        """`[repo] path` a worktree of the repository, `dir` a folder of its main checkout with tracked files: only the
        linked worktree's files were looked at, so gc took it and wrote its lock among them (found by a review)."""
        from tests.conftest import SAMPLE_FILES, git, make_repo

        main = make_repo(tmp_path / "repo", {**SAMPLE_FILES, "docs/notes.md": "# design\n"})
        git(main, "worktree", "add", "-q", "--detach", str(tmp_path / "linked"))
        config = config_with(tmp_path, tmp_path / "linked", ('dir = "state"', 'dir = "repo/docs"'))
        assert_one_line_error(overnight("gc", "--config", str(config)), 2, "[state] dir", "git tracks", "docs/notes.md")
        assert git(main, "status", "--porcelain", "--ignored") == ""

    def test_a_folder_of_a_submodule_holding_its_tracked_files_is_refused(self, tmp_path):
        """`dir` inside a submodule of the checkout: the checkout's own `git ls-files` lists only the submodule itself, so
        gc took it and wrote its lock among the submodule's files (found by a review)."""
        from tests.conftest import SAMPLE_FILES, git, make_repo

        lib = make_repo(tmp_path / "lib", {"docs/notes.md": "# lib design\n", "lib.txt": "lib\n"})
        repo = make_repo(tmp_path / "repo", dict(SAMPLE_FILES))
        git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
        git(repo, "commit", "-q", "-m", "the library")
        config = config_with(tmp_path, repo, ('dir = "state"', 'dir = "repo/lib/docs"'))
        assert_one_line_error(overnight("gc", "--config", str(config)), 2, "[state] dir", "git tracks", "docs/notes.md")
        assert git(repo / "lib", "status", "--porcelain", "--ignored") == ""

    def test_an_inherited_git_dir_does_not_change_which_checkout_holds_the_state_dir(self, tmp_path, repo, monkeypatch):
        """Asked in-process with GIT_DIR naming the repository, git took the state dir itself for the checkout's top and
        named the repository's .gitignore as tracked there: the check must ask git as overnight's other git runs are asked."""
        from orchestrator.state_dir_place import tracked_files_problem
        from tests.conftest import make_repo

        other = make_repo(tmp_path / "other", {"docs/notes.md": "# design\n"})
        monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
        assert tracked_files_problem((other / "docs").resolve()) == f"inside the checkout {other.resolve()}, with files git tracks (docs/notes.md)"

    @pytest.mark.parametrize("state", ["repo/.overnight", "repo/*", "~/night-state"])
    def test_a_folder_of_its_own_in_the_checkout_or_under_home_is_taken(self, tmp_path, repo, monkeypatch, state):
        """Odd but safe stays accepted: a new folder in the checkout (one named `*` is that folder, not every tracked file)
        or under home."""
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        config = config_with(tmp_path, repo, ('dir = "state"', f'dir = "{state}"'))
        done = overnight("gc", "--config", str(config))
        assert (done.returncode, done.stdout.strip()) == (0, "nothing to collect"), done.stderr
