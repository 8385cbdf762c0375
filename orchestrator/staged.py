"""What an index holds against a base commit, as `git diff-index --cached --raw -z` lists it.

One parser for every reader of that output: a commit's size limit (large_files.py), and the search
for `pass_env` values and the moves that carried them (secret_commits.py). `written`, `added` and
`new_content` judge `--no-renames` output: read with -M or -C, a moved or copied file's entry is
neither written nor added, whatever its edits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

# The index's mode of a submodule's entry (a gitlink).
GITLINK = "160000"


@dataclass(frozen=True)
class StagedChange:
    """One entry of `git diff-index --cached --raw`: a path the index holds otherwise than the base."""

    path: str
    status: str
    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str
    # Where a rename or copy (status R or C, found with -M or -C) took its content from; "" for any other entry.
    source: str = ""

    @property
    def written(self) -> bool:
        """New content in the index (added, modified, its type changed), a submodule's commit excepted."""
        return self.status[:1] in ("A", "M", "T") and self.new_mode != GITLINK

    @property
    def added(self) -> bool:
        """A path HEAD does not have, a submodule's excepted (a nested repository is never put back)."""
        return self.status[:1] == "A" and self.new_mode != GITLINK

    @property
    def had_blob(self) -> bool:
        """Whether the base has a blob at the path (not a new file, nor a submodule's commit)."""
        return self.old_mode not in ("000000", GITLINK) and self.old_blob.strip("0") != ""

    @property
    def renamed(self) -> bool:
        """A rename git's detection paired (-M): `source` gone, `path` new, their contents alike."""
        return self.status[:1] == "R"


def staged_changes(raw: str) -> Iterator[StagedChange]:
    """The entries of `git diff-index --raw -z` output. A rename's or a copy's entry names two paths, its source first."""
    fields = raw.split("\0")
    at = 0
    while at < len(fields) - 1:
        meta = fields[at].split()
        paired = bool(meta) and meta[-1][:1] in ("R", "C")
        if len(meta) >= 5:
            path, source = (fields[at + 2], fields[at + 1]) if paired else (fields[at + 1], "")
            yield StagedChange(path, meta[4], meta[0].lstrip(":"), meta[1], meta[2], meta[3], source)
        at += 3 if paired else 2


def new_content(changes: list[StagedChange]) -> list[StagedChange]:
    """The changes that put content in the index the base lacks: a blob the base already has (a file moved or
    copied, a mode changed) is no new content."""
    old_blobs = {change.old_blob for change in changes}
    return [change for change in changes if change.written and change.new_blob not in old_blobs]
