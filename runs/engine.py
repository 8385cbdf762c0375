"""The database a `[store] url` names: its engine, made and set up, and how the URL is read and shown.

Each new SQLite connection gets its pragmas (WAL, a busy timeout) as it opens; a PostgreSQL one gets
libpq's time limits, so that a stuck server or a dropped network ends in one line, not a hung night
(the scheduler's job store makes its engine with the same limits). The same reading of a URL serves
the config (a SQLite `file:` URI's path), the CLI and the build (the files a SQLite store is kept
in); and every message that names the store shows it through `safe_url` (no password) or `store_shown`
(a SQLite store as its file) and the database's complaint through `database_complaint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from orchestrator.url_secrets import shown_url


def database_complaint(exc: BaseException) -> str:
    """The database's own complaint, without SQLAlchemy's statement dump and links."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


# How long a write waits for another process's to end (SQLite takes one writer at a time) before
# it fails ("database is locked"), unless the URL's `?timeout=S` (the driver's) says otherwise.
BUSY_TIMEOUT_MS = 30_000


def _pragmas_on_connect(busy_timeout_ms: int | None) -> Callable[[Any, Any], None]:
    """The listener that sets each new connection up; `busy_timeout_ms` None: the driver's, the URL's `?timeout=S`."""

    def set_up(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            # WAL lets readers (the CLI) look while the night writes; NORMAL is safe under WAL.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            if busy_timeout_ms is not None:
                cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    return set_up


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        # libpq waits for a host that accepts but never answers (a stuck pooler) without end, and on
        # a connection the network dropped (a partition), for as long as TCP retries (15 minutes and
        # more): a night would hang with nothing said. Bounded, unless the URL says otherwise.
        return create_engine(parsed, pool_pre_ping=True, connect_args=postgres_bounds(parsed))
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        parent = Path(database).expanduser().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            # mkdir's own message ("File exists") hides that the path is a regular file.
            raise NotADirectoryError(f"{parent} is not a directory") from None
    engine = create_engine(parsed)
    # The driver sets a URL's `?timeout=S` as the connection's busy timeout: overwritten by the
    # default here, it was a query argument checked at load and then ignored.
    busy_timeout_ms = None if "timeout" in parsed.query else BUSY_TIMEOUT_MS
    event.listen(engine, "connect", _pragmas_on_connect(busy_timeout_ms))
    return engine


def postgres_bounds(parsed: URL) -> dict[str, Any]:
    """libpq's time limits for a PostgreSQL connection, those the URL sets left as it sets them."""
    limits = {"connect_timeout": CONNECT_TIMEOUT_S, **_SILENCE_LIMITS}
    return {name: value for name, value in limits.items() if name not in parsed.query}


# Seconds to wait for a PostgreSQL server to accept a connection (unless the URL says otherwise).
CONNECT_TIMEOUT_S = 20
# libpq's limits on a connection that goes silent: keepalive probes after 30 s idle, every 10 s,
# 3 unanswered end it; data left unacknowledged for 60 s ends it (Linux). A StateError then.
_SILENCE_LIMITS = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}


def sqlite_files(url: str) -> list[Path]:
    """The files a SQLite store is kept in (the database, its write-ahead log and shared memory, a
    rollback journal); [] for other databases."""
    database = sqlite_database_file(url)
    if database is None:
        return []
    return [database, *(database.with_name(database.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


def sqlite_database_file(url: str) -> Path | None:
    """The file a SQLite URL names, also in SQLite's URI form (`sqlite:///file:runs.db?mode=rwc&uri=true`);
    None for other databases (and in-memory ones)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:") and in_uri_form(parsed):
        path = sqlite_uri_path(database)
        return Path(path).expanduser() if path and path != ":memory:" and parsed.query.get("mode") != "memory" else None
    return Path(database).expanduser()


def in_uri_form(url: Any) -> bool:
    """Whether SQLite reads the parsed URL's database as a `file:` URI: only with `uri=true` (as the
    driver decides it); without, `file:runs.db` is a file of that name."""
    from sqlalchemy.util import asbool

    try:
        return asbool(url.query.get("uri", False))
    except ValueError:
        return False


def sqlite_uri_path(database: str) -> str:
    """The path a SQLite `file:` URI names (`file:runs.db`, `file:/abs/runs.db`, `file:///abs/runs.db`), decoded as SQLite
    decodes it (an escaped NUL ends it: `file:x%00y.db` is the file `x`)."""
    rest = database.removeprefix("file:").split("?", 1)[0].split("#", 1)[0]
    if rest.startswith("//"):  # an authority (empty or localhost), then the absolute path, if any
        # `file://localhost` has none: SQLite opens a temporary database there, not the root folder "/".
        _authority, slash, path = rest[2:].partition("/")
        rest = slash + path
    return _sqlite_unquote(rest)


def sqlite_uri_read(url: Any) -> tuple[str, list[tuple[str, str]]] | None:
    """The path and parameters SQLite reads from the `file:` URI the driver opens for the parsed URL: any its database
    part holds itself (`file:runs.db%3Fcache%3Dshared`, decoded by SQLAlchemy into a `?`), then its query's, each
    decoded, in the URI's order with a name repeated as often as it is given (SQLite takes the last `mode`, `vfs`,
    `cache`, the first `nolock`, `immutable`). None where SQLite reads no URI (no `uri=true`, another driver)."""
    try:
        (filename, *_), arguments = url.get_dialect()().create_connect_args(url)
    except Exception:  # a driver SQLAlchemy cannot load, arguments it cannot take: said where they are checked
        return None
    if not (arguments.get("uri") and isinstance(filename, str) and filename.startswith("file:")):
        return None
    # SQLite's parameters end at the first `#`, even one before the `?` (`file:x#y?nolock=1` has none).
    query = filename.partition("#")[0].partition("?")[2]
    pairs = (pair.partition("=") for pair in query.split("&") if pair)
    return sqlite_uri_path(filename), [(_sqlite_unquote(name), _sqlite_unquote(value)) for name, _, value in pairs]


def _sqlite_unquote(text: str) -> str:
    """A URI's path, or a parameter's name or value, decoded as SQLite decodes it: a `%00` ends it (SQLite skips the rest
    to the next `?`, `=` or `&`), so `nolock%00x=1` is SQLite's `nolock` and `vfs=unix-none%00x` its `unix-none`."""
    from urllib.parse import unquote

    return unquote(text.split("%00", 1)[0])


def sqlite_url(path: Path) -> str:
    """The URL of the SQLite file at `path`, whatever its name holds. Made, not written as f"sqlite:///{path}": SQLAlchemy
    reads that with `%41` decoded (`x%41y/runs.db` was `xAy/runs.db`) and a `?` as the query's start (`what?/runs.db` was
    a file `what`)."""
    try:
        return URL.create("sqlite", database=str(path)).render_as_string()
    except UnicodeEncodeError:
        # A name in another encoding than UTF-8 (a Latin-1 `café`), which no escape can carry: written as it is, read back
        # as it is unless it also holds `%` or `?`. A night refuses such a store (build._check_paths_are_text) in one line.
        return f"sqlite:///{path}"


def sqlite_uri(path: Path) -> str:
    """`path` as the database of a SQLite `file:` URI: what the URI form would read otherwise (`?`, `#`, `%`) escaped."""
    from urllib.parse import quote

    return "file:" + quote(str(path), safe="/")


def store_shown(url: str) -> str:
    """Where the store at `url` is, as a person looks for it: a SQLite store's file, another's URL without its password."""
    database = sqlite_database_file(url)
    return str(database) if database is not None else safe_url(url)


def safe_url(url: str) -> str:
    """`url` as it may be shown: the password as ***, in the user info or the query (`?password=`)."""
    try:
        url = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        pass
    return shown_url(url)
