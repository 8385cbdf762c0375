"""A task's git worktree: its own branch, a checkpoint, an exact rollback.

The user's checkout is never touched: everything happens in
`<state.dir>/worktrees/<task>` on `overnight/<task>`. Rollback is
`git reset --hard` plus `git clean -ffdx` in the worktree only, which costs
milliseconds where re-creating the worktree would cost seconds.

The agent runs git in its worktree and may break the `.git` link file there
(delete it, point it at the user's repository, `git init` over it), so overnight's
own git never finds its repository by discovery: every command gets GIT_DIR (the
worktree's admin folder in the repository) and GIT_WORK_TREE, and the link is put
back as git wrote it before each rollback, commit and status check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from orchestrator.commands import GIT_IDENTITY, UNATTENDED_ENV, WORKTREE_GIT_ENV, base_environment, kill_group
from orchestrator.config import WORKTREES_FOLDER
from orchestrator.errors import QualityError, StateError
from orchestrator.add_paths import fewest_exclusions, folders_of
from orchestrator.git_errors import CHECKED_OUT_AT, git_reason
from orchestrator.gitdir import (
    admin_dir, branches_held_by_operations, checkouts, common_of, gitdir_link, head_commit, index_may_hide_files, names_back,
)
from orchestrator.large_files import refuse_large_committed, refuse_large_staged
from orchestrator.records import CheckResult, KeptOutOfCommit
from orchestrator.repository import open_repo
from orchestrator.secret_commits import SecretKeeping, WorktreeGit, with_folded_subjects
from orchestrator.staged import GITLINK
from orchestrator.task_branches import BranchCheckedOut, branch_for, kept_branch
from orchestrator.worktree_registration import creation_error, ensure_registered, with_git_status
from orchestrator.writable import make_writable

if TYPE_CHECKING:
    from orchestrator.secrecy import PassedSecrets

# The most any of overnight's own git commands in a worktree may take. Far more than an honest
# one needs (a full checkout of a large repository included); a clean or smudge filter the agent
# configured (`sleep 100000`) would otherwise hang the night, SIGTERM included.
GIT_TIMEOUT_S = 600.0


def _log_commits_kept(task: str, branch: str) -> None:
    """`worktree_commits_kept` for a caller with no task run to name (a night names its own: orchestrator/night.py)."""
    from orchestrator.logs import get_logger

    get_logger().warning("worktree_commits_kept", task=task, branch=branch)


# glibc's malloc gave the heap back to the kernel and took it again for each object update-index wrote
# (four brk calls a file: 0.4 s of system time for 5,000 new files, against 0.15 s so); ignored elsewhere.
_KEEP_HEAP = {"MALLOC_TRIM_THRESHOLD_": str(4 << 20)}


class Worktree:
    """Implements protocols.Workspace for one task."""

    git_timeout_s: float = GIT_TIMEOUT_S

    def __init__(
        self, path: Path, branch: str, keep: Sequence[str] = (), *, common_dir: Path | None = None, admin: Path | None = None
    ) -> None:
        """The registered worktree at `path`, of the repository at `common_dir` (its git common dir).

        Without `common_dir` (recovery), a link the agent broke is repaired when its
        registration can be found from the broken link or the repository above `path`;
        otherwise StateError. `admin`: `admin_dir(path, common_dir)`, when the caller has just found it.
        """
        self.path = path
        self.branch = branch
        self.keep = tuple(keep)
        admin = admin if admin is not None else admin_dir(path, common_dir)
        if admin is None:
            raise StateError(f"worktree {path}: its .git link is missing or broken and no repository registers it")
        self._admin = Path(os.path.abspath(admin))
        # What `path/.git` must hold: as git wrote it when intact (it may be relative), else a fresh absolute link.
        intact = admin == gitdir_link(path)
        self._link = (path / ".git").read_bytes() if intact else b"gitdir: " + os.fsencode(self._admin) + b"\n"
        self._restore_link()
        # The repository's config, which the user's checkout reads too (the agent's commands may not change it).
        self._common = Path(os.path.abspath(common_dir)) if common_dir is not None else common_of(self._admin)
        self.shared_config = self._common / "config"
        # No discovery from the worktree's folder: whatever `.git` holds, git works on this worktree only.
        self._env = {
            **base_environment(), **UNATTENDED_ENV, **WORKTREE_GIT_ENV, "GIT_DIR": str(self._admin), "GIT_WORK_TREE": os.path.abspath(path)
        }

    @classmethod
    def ensure(
        cls, repo_path: Path, state_dir: Path, task: str, base: str, keep: Sequence[str] = (), *, repo: Any = None,
        on_commits_kept: Callable[[str, str], None] | None = None,
    ) -> "Worktree":
        """The task's worktree, created from `base` the first time and reused after.
        `on_commits_kept(task, branch)`: told of commits kept off a detached HEAD (see `back_on_branch`).

        Safe to call from several threads, sharing one opened `repo` or not: only
        registering the worktree is serialised, the checkout of its files (the
        slow part in a large repository) runs in parallel.
        """
        import git

        repo = repo if repo is not None else open_repo(repo_path)
        repo.git.update_environment(**UNATTENDED_ENV)
        path = state_dir / WORKTREES_FOLDER / task
        branch = branch_for(task)
        admin = ensure_registered(repo, state_dir, path, task, branch, base)
        worktree = cls(path, branch, keep, common_dir=Path(repo.common_dir), admin=admin)
        if not (worktree._admin / "index").exists():
            # Registered with --no-checkout, just now or by a night killed before this step:
            # check the files out (an empty index would commit every file as deleted).
            try:
                worktree._not_sparse()
                worktree._git("reset", "--hard", "--quiet")
            except (git.GitCommandError, OSError) as exc:
                failed = creation_error(f"cannot check out the files of task {task!r} at {path}", git_reason(exc), path)
                raise with_git_status(failed, exc) from None
        worktree.back_on_branch(task, on_commits_kept=on_commits_kept)
        return worktree

    def _not_sparse(self) -> None:
        """Leave out of this new worktree the sparse checkout `git worktree add` copied from the user's checkout
        (git >= 2.36: its patterns, and its config.worktree when extensions.worktreeConfig is on).

        Otherwise the files of the task's branch outside the user's patterns (the check's script, the code to fix)
        were missing here, and the task failed its check every night. Both are this worktree's own copies: the
        user's checkout keeps its patterns. Without a patterns file git checks out every file, even where the
        repository's shared config says core.sparseCheckout.
        """
        (self._admin / "info" / "sparse-checkout").unlink(missing_ok=True)
        own_config = self._admin / "config.worktree"
        if own_config.exists():
            self._git("config", "--file", str(own_config), "core.sparseCheckout", "false")

    def back_on_branch(self, task: str, *, on_commits_kept: Callable[[str, str], None] | None = None) -> None:
        """Put HEAD back on the task's branch, at the branch's tip, files and all, when a person left it
        off (git makes them detach it before they check the branch out in their own checkout).

        Otherwise the night's checkpoint would be where HEAD was left, and its first commit or
        rollback would move the branch off the commits the person added to it since. Commits the
        person made on the detached HEAD itself are first kept on `overnight-kept/<task>/<UTC time>`.
        A file read when HEAD is on the branch, as it is after every night; BranchCheckedOut
        (nothing changed) while another worktree has the branch checked out, or rebases or bisects it.
        """
        import git

        if self._head_file() == f"ref: refs/heads/{self.branch}":
            # Git lets a person check the branch out beside it (`checkout --ignore-other-worktrees`):
            # the night's commit or rollback would then move their checkout's branch under it.
            taken = self._also_held_elsewhere()
            if taken is not None:
                raise BranchCheckedOut(task, self.branch, taken)
            return
        taken = self.held_elsewhere()
        if taken is not None:
            raise BranchCheckedOut(task, self.branch, taken)
        try:
            if self._git("branch", "--list", self.branch).strip():
                self._keep_commits_only_head_has(task, on_commits_kept or _log_commits_kept)
                self._git("checkout", "--quiet", "--force", self.branch)
            else:  # the branch was deleted: made again where HEAD is
                self._git("checkout", "--quiet", "-b", self.branch)
        except git.GitCommandError as exc:
            taken_at = CHECKED_OUT_AT.search(git_reason(exc))
            if taken_at:  # taken between the look and the checkout
                raise BranchCheckedOut(task, self.branch, taken_at.group(1)) from None
            raise

    def _keep_commits_only_head_has(self, task: str, kept_on: Callable[[str, str], None]) -> None:
        """A detached HEAD with commits the branch lacks (a person's, made there): a branch of their own first."""
        import git

        try:
            self._git("merge-base", "--is-ancestor", "HEAD", self.branch)
            return
        except git.GitCommandError as exc:
            if exc.status != 1:
                raise
        kept = kept_branch(task)
        self._git("branch", kept, "HEAD")
        kept_on(task, kept)

    def held_elsewhere(self) -> str | None:
        """The folder of another worktree that has this task's branch checked out, or is rebasing or
        bisecting it (git shows such a worktree detached), while this one's HEAD is off it (git lets
        only one have it). A file read when HEAD is on the branch."""
        if self._head_file() == f"ref: refs/heads/{self.branch}":
            return None
        wanted = f"branch refs/heads/{self.branch}"
        for block in self._git("worktree", "list", "--porcelain", "-z").split("\0\0"):
            lines = block.strip("\0").split("\0")
            folder = lines[0].removeprefix("worktree ") if lines and lines[0].startswith("worktree ") else ""
            if wanted in lines and folder and os.path.realpath(folder) != os.path.realpath(self.path):
                return folder
        return self._held_by_an_operation()

    def _also_held_elsewhere(self) -> str | None:
        """While this worktree's HEAD is on the branch: another checkout whose HEAD is on it too, or
        that rebases or bisects it. File reads only (this runs at every task's start)."""
        wanted = f"ref: refs/heads/{self.branch}"
        for admin, folder in checkouts(self._common, exclude=self._admin):
            try:
                # A registration whose folder was deleted (not yet pruned) holds nothing for anyone;
                # a locked one (on a disk not mounted now) still holds it, as git says.
                gone = not folder.is_dir() and not (admin / "locked").exists()
                if (admin / "HEAD").read_text(encoding="utf-8", errors="replace").strip() == wanted and not gone:
                    return str(folder)
            except OSError:
                continue
        return self._held_by_an_operation()

    def _held_by_an_operation(self) -> str | None:
        """Another worktree that rebases or bisects the branch (git shows it detached), or None."""
        busy = branches_held_by_operations(self._common, exclude=self._admin)
        if self.branch in busy:
            folder, doing = busy[self.branch]
            return f"{folder} (a {doing} in progress)"
        return None

    def _head_file(self) -> str:
        try:
            return (self._admin / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""

    def checkpoint(self) -> str:
        # Read from the ref files, not `git rev-parse`: this runs twice an iteration.
        commit = head_commit(self._admin, self._common)
        if commit is None:
            raise StateError(f"worktree {self.path} has no commit checked out")
        return commit

    def rollback(self, checkpoint: str) -> None:
        """Back to `checkpoint`, or StateError (one line) when git cannot get there."""
        import git

        try:
            self._rollback(checkpoint)
        except (git.GitCommandError, OSError):
            # Most often what the agent made read-only (`chmod 555 folder`): git can neither
            # rewrite nor remove the files in it. Made writable again, and tried once more.
            make_writable(self.path)
            try:
                self._rollback(checkpoint)
            except (git.GitCommandError, OSError) as exc:
                raise StateError(f"cannot roll back the worktree {self.path}: {git_reason(exc)}") from None

    def _rollback(self, checkpoint: str) -> None:
        self._restore_link()
        self._onto_branch()
        self._unhide_hidden_files()
        self._git("reset", "--hard", "--quiet", checkpoint)
        # -ff: also remove nested repositories the agent may have created.
        self._git("clean", "-ffdxq", *self._kept_by_clean())
        if (self.path / ".gitmodules").exists():
            self._roll_back_submodules()

    def keep_changes(
        self, branch: str, message: str, secrets: PassedSecrets | None = None,
        on_kept_out: Callable[[KeptOutOfCommit], None] | None = None, onto: str | None = None,
    ) -> str | None:
        """Save what differs from HEAD (files changed, added, deleted; not ignored ones, nor `keep`
        paths) as a commit on its own new `branch`, worktree and index untouched; None if nothing does.

        Built in an index of its own: the worktree's index, and what the agent staged there, stay as
        they were. `secrets`: values a task's check got through `pass_env`; a file holding one that HEAD's
        version did not (or a new one whose path holds one) is left off the branch as `commit` leaves it off
        the task's (`SecretKeeping.keep_out`), `on_kept_out` told; the worktree keeps it, for the cleaning after. `onto`: the
        commit the worktree is rolled back to after; when the agent's own commits above it (HEAD) hold a value, the
        branch is made on `onto` instead, those commits folded in, as `commit` folds them.
        StateError (one line) when git cannot.
        """
        import git

        try:
            return self._keep_changes(branch, message, secrets, on_kept_out, onto)
        except (git.GitCommandError, OSError) as exc:
            raise StateError(f"cannot keep the changes in the worktree {self.path}: {git_reason(exc)}") from None

    def _keep_changes(
        self, branch: str, message: str, secrets: PassedSecrets | None, on_kept_out: Callable[[KeptOutOfCommit], None] | None,
        onto: str | None,
    ) -> str | None:
        if not (self._admin / "index").exists():
            return None  # a first checkout cut short: what differs is what it had not written yet
        parent = self._kept_parent(onto, secrets)
        with tempfile.TemporaryDirectory(prefix="overnight-keep-") as folder:
            index = {"GIT_INDEX_FILE": os.path.join(folder, "index"), "GIT_LITERAL_PATHSPECS": "1"}
            self._git("read-tree", "HEAD", env=index)
            self._git("add", "--update", env=index)  # tracked files changed or deleted
            # A nested repository shows as its folder ("scratch/"): git would add a link to its
            # commit, or fail when it has none, never its files. Left out, as the cleaning always did.
            new_files = [name for name in self._untracked(env=index) if not name.endswith("/")]
            if new_files:
                self._add_new_files(new_files, env=index)
            if secrets:
                kept_out = self._secret_keeping(secrets).keep_out(index, parent)
                if kept_out is not None and on_kept_out is not None:
                    on_kept_out(kept_out)
            tree = self._git("write-tree", env=index).strip()
        if tree == self._git("rev-parse", f"{parent}^{{tree}}").strip():
            return None
        commit = self._git("commit-tree", tree, "-p", parent, "-m", message, identity=True).strip()
        self._git("branch", branch, commit)
        return commit

    def _kept_parent(self, onto: str | None, secrets: PassedSecrets | None) -> str:
        """The kept branch's parent: HEAD, or `onto` below the agent's own commits when their history would carry a
        value. A checkpoint this clone lacks (the rollback's case too) leaves HEAD: nothing above it can be told apart."""
        import git

        if not secrets or onto is None:
            return "HEAD"
        try:
            self._git("rev-parse", "--verify", "--quiet", f"{onto}^{{commit}}")
        except git.GitCommandError:
            return "HEAD"
        return onto if self._secret_keeping(secrets).commits_hold_values(onto) else "HEAD"

    def _add_new_files(self, names: list[str], env: dict[str, str]) -> None:
        """The untracked files `names` into the index `env` names."""
        listed = b"\0".join(os.fsencode(name) for name in names)
        if self._in_folders_of_another_case(names, env):
            # A case-insensitive disk (macOS, Windows): `git add` files "dir/new" under the index's "Dir/",
            # update-index beside it, a second folder a checkout there cannot tell from the first.
            self._git("add", "--pathspec-from-file=-", "--pathspec-file-nul", env=env, stdin=listed)
            return
        # Paths, not pathspecs: `git add` matched each file against every pathspec given, seconds for
        # a person's thousands of new files; update-index takes each name as it is (filters and line
        # endings applied as `add` applies them), --replace as `add` replaces a file that became a
        # folder, --remove passes over one deleted since it was listed (an editor's swap file), which
        # `add` and update-index alone refuse, stopping the night.
        self._git("update-index", "--add", "--remove", "--replace", "-z", "--stdin", env={**env, **_KEEP_HEAP}, stdin=listed)

    def _in_folders_of_another_case(self, names: list[str], env: dict[str, str]) -> bool:
        """Whether git takes names case-insensitively (core.ignorecase) and one of `names` lies in a folder the
        index `env` names holds in another case ("lib/new.py" beside "Lib/old.py")."""
        if self._git("config", "--type=bool", "--default=false", "--get", "core.ignorecase").strip() != "true":
            return False
        tracked = {os.path.dirname(name) for name in self._git("ls-files", "-z", env=env).split("\0") if name}
        tracked_folders = {folder for name in tracked for folder in folders_of(name)}
        in_any_case = {folder.lower() for folder in tracked_folders}
        return any(
            folder not in tracked_folders and folder.lower() in in_any_case
            for name in names for folder in folders_of(os.path.dirname(name))
        )

    def uncommitted_paths(self, since: str | None = None) -> list[str]:
        """What differs from HEAD and is work: tracked files changed, staged or deleted (inside a
        submodule too, whatever .gitmodules says; hidden from `git status` too), and untracked files
        neither ignored nor `keep` paths (judged as `git clean -e` judges them: "/build" at the top
        only, "node_modules" at any depth). A nested repository counts as its folder. StateError
        (one line) when git cannot tell.

        `since`: the commit to compare with instead of HEAD, for a worktree whose branch was deleted
        (its HEAD then names no commit, and `git status` shows every file as added)."""
        import git

        status = ("status", "--porcelain", "-z", "--no-renames", "--untracked-files=no", "--ignore-submodules=none")
        diff = ("diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", "--ignore-submodules=none")
        try:
            self._restore_link()
            if since is None:
                tracked = [entry[3:] for entry in self._status_seeing_hidden_files(*status).split("\0") if entry]
            else:  # changed in the files or in the index, staged or not
                found = (self._status_seeing_hidden_files(*diff, *cached, since, "--") for cached in ((), ("--cached",)))
                tracked = sorted({name for names in found for name in names.split("\0") if name})
            return tracked + self._untracked()
        except (git.GitCommandError, OSError) as exc:
            raise StateError(f"cannot list the changes in the worktree {self.path}: {git_reason(exc)}") from None

    def _status_seeing_hidden_files(self, *status: str) -> str:
        """`git status` that also reports the files the index hides from it: those marked skip-worktree or
        assume-unchanged (`git update-index`), a person's way to keep a local edit out of commits, which
        would otherwise look like no change at all and be deleted with the worktree.

        Asked of a copy of the index without those bits: the worktree's own stays as the person set it.
        A process more only when the index has such bits.
        """
        if not index_may_hide_files(self._admin / "index"):
            return self._git(*status)
        with tempfile.TemporaryDirectory(prefix="overnight-status-") as folder:
            index = {"GIT_INDEX_FILE": os.path.join(folder, "index"), "GIT_LITERAL_PATHSPECS": "1"}
            shutil.copyfile(self._admin / "index", index["GIT_INDEX_FILE"])
            self._clear_hiding_bits(index)
            return self._git(*status, env=index)

    def _clear_hiding_bits(self, index: dict[str, str] | None = None) -> None:
        """Clear the skip-worktree and assume-unchanged bits in the worktree's index, or in the one `index` names
        (GIT_INDEX_FILE), but not a sparse checkout's own on the files it leaves out: absent on purpose, they are
        no deletion; a file the agent wrote outside it loses the bit: that is work."""
        tagged = [(entry[:1], entry[2:]) for entry in self._git("ls-files", "-v", "-z", env=index).split("\0") if entry[1:2] == " "]
        skipped = [path for tag, path in tagged if tag in ("S", "s")]
        # A sparse checkout's skip-worktree bits are its own (and git clears those of files present on disk itself).
        if (self._admin / "info" / "sparse-checkout").exists():
            skipped = [path for path in skipped if os.path.lexists(self.path / path)]
        assumed = [path for tag, path in tagged if tag.islower()]
        # One flag per run: given both, update-index applies only the last.
        for flag, paths in (("--no-skip-worktree", skipped), ("--no-assume-unchanged", assumed)):
            for start in range(0, len(paths), 1000):  # a command line holds only so many paths
                self._git("update-index", flag, "--", *paths[start : start + 1000], env=index)

    def _untracked(self, env: dict[str, str] | None = None) -> list[str]:
        """Untracked paths, not ignored and outside `keep` (the patterns `git clean -e` takes)."""
        excludes = [f"--exclude={pattern}" for pattern in self.keep]
        return [name for name in self._git("ls-files", "-z", "--others", "--exclude-standard", *excludes, env=env).split("\0") if name]

    def idle_state(self) -> str:
        """What a worktree no iteration runs in holds besides its HEAD: "clean"; "ignored" when only files git
        ignores, which a rollback would remove (`keep` paths it spares are no change at all); else "changed"."""
        self._restore_link()
        status = self._git("status", "--porcelain", "--ignored", "--untracked-files=all").splitlines()
        if not status:
            return "clean"
        if any(not line.startswith(("!! ", "?? ")) for line in status):
            return "changed"
        # New files under `keep` (a check's .venv that .gitignore does not name) are "??" too: no change, or every
        # night kept nothing on a branch (seconds in a large project) and logged the worktree as cleaned.
        if any(line.startswith("?? ") for line in status) and (not self.keep or self._untracked()):
            return "changed"
        if not self.keep:
            return "ignored"
        # A large build folder kept across rollbacks was "changed" every night: a keep commit of nothing
        # and a rollback, seconds each, before any task began.
        return "ignored" if self._git("clean", "-ndffx", *self._kept_by_clean()).strip() else "clean"

    def _kept_by_clean(self) -> list[str]:
        """`git clean`'s arguments that spare the `keep` paths."""
        return [arg for path in self.keep for arg in ("-e", path)]

    def commit(
        self, message: str, onto: str | None = None, max_file_bytes: int = 0, secrets: PassedSecrets | None = None,
        on_kept_out: Callable[[KeptOutOfCommit], None] | None = None,
    ) -> str:
        """Commit everything the agent left; the current HEAD if it changed nothing.

        `onto`: the iteration's checkpoint. If the agent moved the branch so that it no longer
        holds it (`reset --hard HEAD~1`, `commit --amend`, the branch deleted), the branch is put
        back on it, files and index as they are: the commit then records the worktree exactly,
        and no earlier night's commit leaves the branch. Commits the agent added on top stay.
        A file staged of more than `max_file_bytes` (0: any size) is QualityError `file_too_large`,
        before anything is committed (the caller rolls back).
        `secrets`: the values the check got through the task's `pass_env`; a file that would be committed holding one
        its checkpoint version did not hold is put back as it was there (see `SecretKeeping.keep_out`), `on_kept_out` told.
        """
        import git

        self._restore_link()
        self._onto_branch()
        if onto is not None:
            self._keep_on_branch(onto)
        self._unhide_hidden_files()
        # --verbose names every path it stages. Silence means the files match the index, so
        # only changes staged earlier (by a `git add` of the agent's) could still be committed:
        # asked of git only then, an unchanged worktree costs one process fewer.
        staged = self._add_all()
        if secrets:  # only a task with pass_env: no other check ever had a secret to write into the worktree
            keeping = self._secret_keeping(secrets)
            # The agent's own commits above the checkpoint: folded into this one when their history holds a value.
            folded = keeping.fold_commits(onto) if onto is not None and head_commit(self._admin, self._common) != onto else []
            if folded:
                message = with_folded_subjects(message, folded, secrets)
            kept_out = keeping.keep_out()
            if kept_out is not None:
                staged = ""  # what add named may have been put back: the index alone says what is left to commit
                if on_kept_out is not None:
                    on_kept_out(kept_out)
        # With a size limit, the index is compared with the checkpoint anyway: when HEAD is still
        # there, that also answers "anything staged?" without asking git again.
        differs = refuse_large_staged(self._git, self.path, onto or "HEAD", max_file_bytes) if max_file_bytes else None
        if differs is not None and onto is not None and head_commit(self._admin, self._common) != onto:
            differs = None  # the agent's own commits on top: the index is to be compared with them
            # and what those commits hold goes with the branch too, a file added and removed again included
            refuse_large_committed(self._git, onto, max_file_bytes)
        if staged.strip() or (differs if differs is not None else self._has_staged_changes()):
            try:
                self._git("commit", "--quiet", "--no-verify", "-m", message, identity=True)
            except git.GitCommandError:
                # Paths staged back to what HEAD has are "no change"; anything else is an error.
                if self._has_staged_changes():
                    raise
        self._nothing_left_behind()
        return self.checkpoint()

    def _add_all(self) -> str:
        """`git add --all --verbose`, new files under `keep` paths and nested repositories left out; in a sparse
        checkout with --sparse, which also takes what the agent wrote outside it (git >= 2.34: an older git,
        which has no such option, adds without it)."""
        import git

        untracked = self._untracked_all()
        # New files under `[repo] keep` paths (a check's .venv or build cache that .gitignore does not
        # name) are no work, as for a rollback, gc and a kept branch: staged, they went onto the task's
        # branch and into the morning's merge.
        kept_new = set(untracked) - set(self._untracked()) if self.keep else set()
        # A repository the agent made inside the worktree (`git init` or `git clone` into a folder; a nested
        # repository is listed as its folder) is left out, as kept branches and the rollback's cleaning leave
        # it: git would add only a link to its commit, which exists in that folder alone and no clone of the
        # task's branch can check out, never its files; and one with no commit yet failed the whole add.
        leave_out = [name for name in untracked if name.endswith("/") or name in kept_new]
        if kept_new:
            # One exclusion per file cost git a match of every path against every exclusion: a .venv's
            # 5,000 files in a 20,000-file project made each commit seconds of CPU. A folder holding no
            # work (no tracked file, no new file outside `keep`) is left out whole instead.
            work = [name for name in untracked if name not in kept_new]
            leave_out = fewest_exclusions(leave_out, work + self._tracked_paths())
        with tempfile.TemporaryDirectory(prefix="overnight-add-") if leave_out else contextlib.nullcontext() as folder:
            pathspec: list[str] = []
            if folder is not None:
                # From a file: a .venv's thousands of files would not fit on a command line.
                listed = Path(folder) / "pathspec"
                listed.write_bytes(b"\0".join(os.fsencode(spec) for spec in [".", *(f":(exclude,literal){name}" for name in leave_out)]))
                pathspec = [f"--pathspec-from-file={listed}", "--pathspec-file-nul"]
            if not (self._admin / "info" / "sparse-checkout").exists():
                return self._git("add", "--all", "--verbose", *pathspec)
            try:
                return self._git("add", "--all", "--verbose", "--sparse", *pathspec)
            except git.GitCommandError as exc:
                if "sparse" not in str(exc.stderr) or "unknown option" not in str(exc.stderr):
                    raise
                return self._git("add", "--all", "--verbose", *pathspec)

    def _tracked_paths(self) -> list[str]:
        """Every path the index holds (a sparse index is listed expanded)."""
        return [name for name in self._git("ls-files", "-z").split("\0") if name]

    def _untracked_all(self) -> list[str]:
        """Untracked paths not ignored, `keep` paths included."""
        return [name for name in self._git("ls-files", "-z", "--others", "--exclude-standard").split("\0") if name]

    def _roll_back_submodules(self) -> None:
        """What reset and clean do not reach: the checked-out submodules back on the commits the
        checkpoint records (the agent may have checked out another), cleaned; files the agent wrote
        into a submodule's folder that was never checked out (git sees none of them) removed."""
        import git

        try:
            self._git("submodule", "--quiet", "update", "--force", "--recursive", "--no-fetch")
        except git.GitCommandError:
            pass  # a recorded commit this clone lacks: at least each is reset to its own HEAD below
        self._git("submodule", "--quiet", "foreach", "--recursive", "git reset --hard --quiet && git clean -ffdxq")
        for folder in self._unpopulated_submodules():
            for entry in list(folder.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    make_writable(entry)
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    def _unpopulated_submodules(self) -> list[Path]:
        """The folders of submodules not checked out that hold files. The submodules are the index's
        gitlinks, not what .gitmodules says: an entry left there after a submodule was vendored in
        names a folder of tracked files."""
        found = []
        for entry in self._git("ls-files", "--stage", "-z").split("\0"):
            mode, _, rest = entry.partition(" ")
            if mode != GITLINK:
                continue
            folder = self.path / rest.split("\t", 1)[1]
            if folder.is_dir() and not folder.is_symlink() and not os.path.lexists(folder / ".git") and any(folder.iterdir()):
                found.append(folder)
        return found

    def _nothing_left_behind(self) -> None:
        """QualityError when a change is still uncommitted after the commit: edits inside a submodule
        (another repository: `add` records only which commit it is on; in one never checked out, git
        does not even see them), which the check passed on and no commit of the task's holds. Asked
        only where there are submodules (a file's existence otherwise)."""
        if not (self.path / ".gitmodules").exists():
            return
        left = self.uncommitted_paths() + [f"{folder.relative_to(self.path).as_posix()}/" for folder in self._unpopulated_submodules()]
        if left:
            raise QualityError(
                "iteration_error",
                "Your changes inside a submodule (another repository in this one) cannot be committed on the task's "
                "branch, so they were undone. Change only the files of this repository itself.",
                evidence="left uncommitted: " + ", ".join(left[:10]),
                message=f"changes no commit can hold: {', '.join(left[:3])}",
            )

    def _onto_branch(self) -> None:
        """Undo what the agent's own git left that would send overnight's reset or commit off the task's branch.

        A rebase half done is quit, and HEAD (moved to another branch, or detached) is pointed back
        at `overnight/<task>` with the files and index as they are: a commit then records the
        worktree exactly, on the branch's tip. Two file checks and a read; a process only if amiss.
        """
        if (self._admin / "rebase-merge").exists() or (self._admin / "rebase-apply").exists():
            self._git("rebase", "--quit")
        if self._head_file() != f"ref: refs/heads/{self.branch}":
            self._git("symbolic-ref", "HEAD", f"refs/heads/{self.branch}")

    def _keep_on_branch(self, checkpoint: str) -> None:
        """Put the branch back on `checkpoint` if the agent moved it off (a ref read; a process only then)."""
        import git

        tip = head_commit(self._admin, self._common)
        if tip == checkpoint:
            return
        if tip is not None:
            try:
                self._git("merge-base", "--is-ancestor", checkpoint, tip)
                return  # the agent's own commits, on top of the checkpoint
            except git.GitCommandError as exc:
                if exc.status != 1:  # 1: not an ancestor
                    raise
        self._git("reset", "--soft", "--quiet", checkpoint)

    def _unhide_hidden_files(self) -> None:
        """Clear the bits with which the agent hid files from git (`git update-index --skip-worktree`
        or `--assume-unchanged`).

        They survive `reset --hard`, which then leaves such a file as the agent changed it, and
        hide it from status and add: a commit would leave out a change the check passed on, and
        the next check pass on a change no commit holds. A process only when the index has such bits.
        """
        if index_may_hide_files(self._admin / "index"):
            self._clear_hiding_bits()

    def _restore_link(self) -> None:
        """Put `.git` back as git made it if the agent removed or changed it (a file read when it did not),
        and the registration's link back to it (`git worktree move` changes both).

        overnight's git does not need it (GIT_DIR), but the agent's next commands, the check and
        the person reviewing the worktree do; and a `.git` folder (`git init`) would otherwise
        be a second repository inside the worktree that neither `clean` nor `add` touches.
        """
        link = self.path / ".git"
        try:
            if stat.S_ISREG(os.lstat(link).st_mode) and link.read_bytes() == self._link:
                return
        except OSError:
            pass
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)
        elif os.path.lexists(link):
            link.unlink()
        self.path.mkdir(parents=True, exist_ok=True)  # the agent may have removed the whole folder: reset --hard refills it
        link.write_bytes(self._link)
        if not names_back(self._admin, self.path):  # `git worktree move`: the registration names the new folder
            (self._admin / "gitdir").write_bytes(os.fsencode(os.path.abspath(link)) + b"\n")

    def _git(self, *args: str, identity: bool = False, env: dict[str, str] | None = None, stdin: bytes | None = None) -> str:
        """One git command in this worktree, given `stdin` when not None: its output, or GitCommandError
        (also when killed, with what it started, after `git_timeout_s`). Not GitPython's
        `kill_after_timeout`, which starts a timer thread for every command: four a commit, in the burst
        of tasks ending together."""
        import git

        command = ["git", *args]
        extra = {**(GIT_IDENTITY if identity else {}), **(env or {})}
        process = subprocess.Popen(
            command,
            cwd=self.path,
            env={**self._env, **extra} if extra else self._env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Its own group, so that the limit ends a filter or hook it started too.
            process_group=0,
        )
        try:
            out, err = process.communicate(stdin, timeout=self.git_timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            out, err = process.communicate()
            # The index lock it held would fail every later command.
            (self._admin / "index.lock").unlink(missing_ok=True)
            err += f"\ntimed out after {self.git_timeout_s:g}s: killed, with what it started".encode()
        if process.returncode != 0:
            raise git.GitCommandError(command, process.returncode, _text(err), _text(out))
        return _text(out)

    def _secret_keeping(self, secrets: PassedSecrets) -> SecretKeeping:
        """What keeps the values of `secrets` out of this worktree's commits, running git as `_git` does."""
        return SecretKeeping(WorktreeGit(self._git, self.path, self._env, self.git_timeout_s), secrets)

    def _has_staged_changes(self) -> bool:
        import git

        try:
            self._git("diff", "--cached", "--quiet")
        except git.GitCommandError as exc:
            if exc.status == 1:  # --quiet's "there are"
                return True
            raise
        return False

    def run_check(
        self, command: str, timeout_s: float, max_output_chars: int = 8000, cancel: object = None, pass_env: Sequence[str] = (),
        redact: Callable[[str], str] = str,
    ) -> CheckResult:
        from orchestrator.commands import run_shell

        result = run_shell(
            command, cwd=self.path, timeout_s=timeout_s, max_output_chars=max_output_chars, cancel=cancel, pass_env=pass_env,
            redact=redact,
        )
        return CheckResult(exit_code=result.exit_code, output=result.output, timed_out=result.timed_out)



def _text(output: bytes) -> str:
    """git's output as text; file names that are not UTF-8 survive the way back into a command."""
    return os.fsdecode(output).removesuffix("\n")
