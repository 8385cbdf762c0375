"""A process's /proc/PID/stat fields, read as bytes: its name (between the parentheses) is any bytes a program
chose, spaces and bytes that are no UTF-8 included, so the fields are those after its last parenthesis."""

from __future__ import annotations


def stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields from the third (state) on: [0] state, [1] parent, [4] terminal, [19] start time."""
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return stat_file.read().rsplit(b")", 1)[1].split()
