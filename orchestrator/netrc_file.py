"""The passwords of the user's .netrc, read without waiting on a pipe or a device there (`netrc_file_passwords`)."""

from __future__ import annotations

import os
import stat

from orchestrator.inline_secrets import netrc_passwords

# More than any .netrc: a file that large is no credentials file, and is read no further.
_NETRC_MAX_BYTES = 1 << 20


def netrc_file_passwords() -> list[str]:
    """The passwords of the .netrc that curl, git and ftp read (`$NETRC`, else `~/.netrc`): the agent's commands can
    read the file (`cat ~/.netrc`, `curl --netrc -v`), and the redaction keeps its known values out of the records."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        # Without O_NONBLOCK a pipe's open waits for a writer: a FIFO at ~/.netrc (one a password manager fills) held every
        # night's start, and each Redactor.for_night after it, for ever. Only a regular file is read: a device (/dev/tty,
        # /dev/stdin) would be waited on, and a pipe's text would be taken from curl or git, which read it next.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none, or unreadable
        return []
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a folder, a pipe, a device
            return []
        os.set_blocking(descriptor, True)
        with os.fdopen(descriptor, "rb", closefd=False) as netrc:
            return netrc_passwords(netrc.read(_NETRC_MAX_BYTES).decode("utf-8", errors="surrogateescape"))
    except OSError:  # the read failed (EIO)
        return []
    finally:
        os.close(descriptor)
