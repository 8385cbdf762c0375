"""The `mode`, `cache` and `vfs` parameters of a SQLite `file:` URI, read in order as SQLite's sqlite3ParseUri reads them:
what SQLite would refuse as the store opens (exit 4), said at load instead, and the access mode it ends with."""

from __future__ import annotations

# The open flags each `mode` value stands for (SQLITE_OPEN_READONLY, _READWRITE, _READWRITE|_CREATE, _MEMORY): SQLite
# compares values exactly, case-sensitive (`RO`, `Rw` are "no such access mode").
_ACCESS_MODES = {"ro": 0x1, "rw": 0x2, "rwc": 0x6, "memory": 0x80}
_CACHE_MODES = ("shared", "private")
# The flags Python's sqlite3 opens with (READWRITE|CREATE): no `mode` may ask for more.
_DRIVER_FLAGS = _ACCESS_MODES["rwc"]


def sqlite_uri_refusal(pairs: list[tuple[str, str]]) -> str | None:
    """Why SQLite fails to open a URI with these parameters (in the URI's order, decoded), or None: a `mode` or `cache`
    value it does not know (each one given, not only the last), a `mode` wider than the one before it ("access mode not
    allowed": `mode=rw&mode=rwc`), or a last `vfs` no VFS of this SQLite is registered under."""
    allowed = _DRIVER_FLAGS
    for name, value in pairs:
        if name == "cache" and value not in _CACHE_MODES:
            return f"cache={value} is no cache mode SQLite knows (shared or private, case-sensitive); drop it"
        if name != "mode":
            continue
        flags = _ACCESS_MODES.get(value)
        if flags is None:
            return f"mode={value} is no access mode SQLite knows (ro, rw, rwc or memory, case-sensitive); use mode=rwc or drop it"
        if flags & ~_ACCESS_MODES["memory"] > allowed:
            return f'mode={value} after a narrower mode is refused by SQLite ("access mode not allowed"); give mode once'
        allowed = flags
    vfs = last_value(pairs, "vfs")
    if vfs is not None and not _vfs_registered(vfs):
        return f"vfs={vfs} is no VFS this SQLite has (names are case-sensitive; unix, the default, is always there); drop it"
    return None


def sqlite_authority_refusal(database: str) -> str | None:
    """Why SQLite fails to open a `file:` URI database part for its authority ("invalid uri authority"), or None: SQLite
    takes only none (`file:///abs/runs.db`) or exactly `localhost`, a file on this machine."""
    if not database.startswith("file://"):
        return None
    authority = database.removeprefix("file://").partition("/")[0]
    if authority in ("", "localhost"):
        return None
    return f"file://{authority}/ names another machine, which SQLite cannot open (only file:/// or file://localhost/)"


def last_value(pairs: list[tuple[str, str]], name: str) -> str | None:
    """The value SQLite takes for a parameter it reads the last of (`mode`, `vfs`, `cache`); None where not given."""
    values = [value for given, value in pairs if given == name]
    return values[-1] if values else None


def _vfs_registered(name: str) -> bool:
    """Whether this process's SQLite (the pysqlite driver's: Python's sqlite3) has a VFS of this name, asked of SQLite
    itself through a database in memory, which makes no file: the VFSs a build registers differ by platform."""
    import sqlite3
    from urllib.parse import quote

    try:
        sqlite3.connect(f"file::memory:?vfs={quote(name, safe='')}", uri=True).close()
    except sqlite3.Error:
        return False
    return True
