"""The values a task's check got through `pass_env` kept off the task's branch (see passed_secrets.PassedSecrets).

A check given a database password may write it into a file (a `.env`, a log, a cache named after
it) that the iteration's commit would then carry to the branch CI pushes. Before such a commit,
worktree.py asks a `SecretKeeping` to put each staged file holding a new value back as the base
has it, and to fold the agent's own commits into the iteration's when their history holds one.

Found by reading every staged object whole, in pieces, through one `git cat-file --batch`. Not
found: a value split across lines, or written encoded (base64, or escaped otherwise than as
escaped_forms.py's: a JSON encoder's, repr()'s or ascii()'s, a URL's percent-encoding); a file a filter (LFS)
stores elsewhere is judged by what the index holds.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from orchestrator.process_groups import kill_group
from orchestrator.records import KeptOutOfCommit
from orchestrator.staged import StagedChange, new_content, staged_changes

if TYPE_CHECKING:
    from orchestrator.passed_secrets import PassedSecrets


@dataclass(frozen=True)
class WorktreeGit:
    """git in one worktree, as the search for values runs it: `run(*args, env=None, stdin=None)` one command (its
    output as text, or GitCommandError), and for the `git cat-file --batch` it keeps open itself, the worktree's
    `folder`, the `env` its git runs with and the `timeout_s` that process may take."""

    run: Callable[..., str]
    folder: Path
    env: Mapping[str, str]
    timeout_s: float


@dataclass(frozen=True)
class SecretKeeping:
    """Keeps the values of `secrets` out of what the index of the worktree `git` runs in would commit."""

    git: WorktreeGit
    secrets: PassedSecrets

    def fold_commits(self, onto: str) -> list[str]:
        """The agent's own commits on top of `onto` (HEAD above it) folded into the iteration's commit (HEAD back on
        `onto`, index and worktree as they are) when an object of theirs holds a value (its `run_check` gets `pass_env`
        too): their history would carry it even after the file went. Their subjects, oldest first, for the commit that
        replaces them (see `with_folded_subjects`); none when nothing was folded."""
        if not self.commits_hold_values(onto):
            return []
        subjects = self.git.run("log", "--reverse", "--format=%s", f"{onto}..HEAD").splitlines()
        self.git.run("reset", "--soft", "--quiet", onto)
        return subjects

    def keep_out(self, index: dict[str, str] | None = None, base: str = "HEAD") -> KeptOutOfCommit | None:
        """Put back, as `base` has them (HEAD: the checkpoint, or the agent's own commits on it, which hold no value
        now: else folded before), the staged files whose content holds a value that their version there did not (a
        project's settings file with its own default password is no leak), and the new files whose path holds one: a
        changed file gets that version, a new one is removed; a file moved to such a path is back where it was. In the
        worktree's index, the worktree too, so that no later keep or cleaning commits it either; in the index `index`
        names (a kept branch's, of its own), that index alone. What was put back; None when nothing was.
        A file put back gets HEAD's version, not the checkpoint's (which would undo what the agent's own commits
        changed in it)."""
        leaked = self._leaks(index, base)
        if not leaked:
            return None
        where = ("--staged",) if index is not None else ("--staged", "--worktree")
        self.git.run(
            "restore", f"--source={base}", *where, "--pathspec-from-file=-", "--pathspec-file-nul",
            env={**(index or {}), "GIT_LITERAL_PATHSPECS": "1"}, stdin=_nul_listed([*leaked, *self._moved_to(leaked, index, base)]),
        )
        return _kept_out(leaked, self.secrets)

    def commits_hold_values(self, onto: str) -> bool:
        """Whether an object of the commits on top of `onto` (a commit's message, a file's content) holds a value."""
        objects = {line.split(" ", 1)[0] for line in self.git.run("rev-list", "--objects", f"{onto}..HEAD").splitlines() if line}
        return any(self._values_in_objects(objects).values())

    def _moved_to(self, leaked: Iterable[str], index: dict[str, str] | None, base: str) -> list[str]:
        """The paths `base` has that the staged changes (in the worktree's index, or the one `index` names) move to one
        of `leaked` (`git mv config.py $TOKEN/config.py`), as git's rename detection pairs them: the move kept out, its
        source is put back too, or the commit would still remove it. Only a pairing that is a move: the same file name
        in another folder, or the same (non-empty) content; git also pairs a file the agent deleted with an unrelated
        new one half like it (an empty `__init__.py` with an empty cache file), whose putting back would undo that deletion."""
        leaked = set(leaked)
        raw = self.git.run("diff-index", "--cached", "--raw", "-z", "-M", base, env=index)
        return [change.source for change in staged_changes(raw) if change.renamed and change.path in leaked and _a_move(change)]

    def _leaks(self, index: dict[str, str] | None, base: str) -> dict[str, frozenset[bytes]]:
        """The files staged (in the worktree's index, or the one `index` names) whose content holds values that their
        version in `base` did not, and the new ones whose path holds one: those values, by path."""
        changes = list(staged_changes(self.git.run("diff-index", "--cached", "--raw", "-z", "--no-renames", base, env=index)))
        leaked = self._new_values_in_contents(changes)
        # A new path named after a value (a cache keyed by the token) puts it in the branch's tree, whatever the file holds.
        for change in changes:
            named = self.secrets.found_in([os.fsencode(change.path)]) if change.added else frozenset()
            if named:
                leaked[change.path] = leaked.get(change.path, frozenset()) | named
        return leaked

    def _new_values_in_contents(self, changes: list[StagedChange]) -> dict[str, frozenset[bytes]]:
        """The staged files among `changes` whose content holds values that their base version did not: those values,
        by path."""
        written = new_content(changes)
        if not written:
            return {}
        found = self._values_in_objects({change.new_blob for change in written})
        holding = [change for change in written if found[change.new_blob]]
        if not holding:
            return {}
        held_before = self._values_in_objects({change.old_blob for change in holding if change.had_blob})
        leaked = {change.path: found[change.new_blob] - held_before.get(change.old_blob, frozenset()) for change in holding}
        return {path: values for path, values in leaked.items() if values}

    def _values_in_objects(self, objects: Iterable[str]) -> dict[str, frozenset[bytes]]:
        """The values each object holds, read whole, whatever its size (in chunks: no more than one in memory), through
        one `git cat-file --batch`. GitCommandError when git cannot give one, or takes longer than `timeout_s` for all:
        the caller rolls back rather than commit what it could not read."""
        import git

        objects = list(objects)
        if not objects:
            return {}
        command = ["git", "cat-file", "--batch"]
        process = subprocess.Popen(
            command, cwd=self.git.folder, env=self.git.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, process_group=0,
        )
        assert process.stdin is not None and process.stdout is not None
        # A timer, not a per-read timeout: a pipe's read has none. Killed, git's output ends and the read below fails.
        timer = threading.Timer(self.git.timeout_s, kill_group, (process.pid,))
        timer.start()
        found: dict[str, frozenset[bytes]] = {}
        try:
            for name in objects:
                # --batch answers each request before it reads the next: a request and its answer at a time.
                process.stdin.write(name.encode() + b"\n")
                process.stdin.flush()
                header = process.stdout.readline().split()
                if len(header) != 3:
                    said = os.fsdecode(b" ".join(header[1:])) or "git ended"
                    raise git.GitCommandError(command, 128, f"cannot read {name}: {said}")
                found[name] = self.secrets.found_in(_chunks(process.stdout, int(header[2])))
                process.stdout.read(1)  # the newline after each object
        except (BrokenPipeError, EOFError) as exc:
            raise git.GitCommandError(command, 128, f"git cat-file ended: {exc}") from None
        finally:
            timer.cancel()
            timer.join()  # a kill already under way lands before the wait below frees the pid for reuse
            with contextlib.suppress(OSError):
                process.stdin.close()
            process.kill()
            process.wait()
        return found


def with_folded_subjects(message: str, subjects: Sequence[str], secrets: PassedSecrets) -> str:
    """`message`, followed by the subjects of the agent's own commits it folds (their values as ***): the history
    keeps what they said they did, not what they held. The first `_FOLDED_LISTED` only, each cut at
    `_FOLDED_SUBJECT_CHARS` (after the redaction: a cut value would show its start): the message goes to git as one
    argument, which Linux caps at 128 KiB (a thousand commits, or one subject a whole test log long, would pass it)."""
    listed = [f"- {_cut(secrets.redacted(subject), _FOLDED_SUBJECT_CHARS)}" for subject in subjects[:_FOLDED_LISTED]]
    if len(subjects) > _FOLDED_LISTED:
        listed.append(f"- ... and {len(subjects) - _FOLDED_LISTED} more")
    lines = "\n".join(listed)
    return f"{message}\n\nFolded in, as one of their files or messages held a value passed through pass_env, the agent's commits:\n{lines}"


def _cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "..."


_FOLDED_LISTED = 100
_FOLDED_SUBJECT_CHARS = 200


def _a_move(rename: StagedChange) -> bool:
    """Whether a rename `diff-index -M` reports moves one file: its name kept (another folder), or its content whole
    and not the empty blob, which any empty file shares."""
    if os.path.basename(rename.source) == os.path.basename(rename.path):
        return True
    return rename.status == "R100" and rename.old_blob not in _EMPTY_BLOBS


# The empty blob's id in a SHA-1 and in a SHA-256 repository.
_EMPTY_BLOBS = frozenset({"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391", "473a0f4c3be8a93681a267e3b1e9a7dcda1185436fe141f7749120a303721813"})


def _nul_listed(paths: Iterable[str]) -> bytes:
    """`paths`, sorted, as `--pathspec-file-nul` reads them."""
    return b"\0".join(os.fsencode(path) for path in sorted(paths))


def _kept_out(leaked: Mapping[str, frozenset[bytes]], secrets: PassedSecrets) -> KeptOutOfCommit:
    """What a log may say of the files `leaked` names: their paths, and the variables of the values, never the values."""
    return KeptOutOfCommit(paths=tuple(sorted(leaked)), names=secrets.names(value for values in leaked.values() for value in values))


# How much of an object is in memory at once while it is scanned for secrets.
_SCAN_CHUNK_BYTES = 1 << 20


def _chunks(stream: Any, size: int) -> Iterator[bytes]:
    """`size` bytes of `stream`, a chunk at a time; EOFError when it ends first."""
    left = size
    while left:
        chunk = stream.read(min(left, _SCAN_CHUNK_BYTES))
        if not chunk:
            raise EOFError(f"{left} of {size} bytes missing")
        left -= len(chunk)
        yield chunk
