"""A folder the agent made read-only (`chmod 555`), made writable again for a rollback or a removal."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def make_writable(top: Path) -> None:
    """u+rwX on `top` and everything under it; symbolic links left alone (what they name may be anyone's)."""
    _add_owner_rights(str(top))
    for folder, folders, files in os.walk(top):  # top down: each folder is made readable before it is listed
        for name in folders + files:
            _add_owner_rights(os.path.join(folder, name))


def _add_owner_rights(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISLNK(mode):
            executable = stat.S_ISDIR(mode) or mode & 0o111
            os.chmod(path, stat.S_IMODE(mode) | stat.S_IRUSR | stat.S_IWUSR | (stat.S_IXUSR if executable else 0))
    except OSError:
        pass  # not ours to change: the retry then says what git still cannot do
