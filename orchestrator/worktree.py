"""A task's git worktree: its own branch, a checkpoint, an exact rollback.

The user's checkout is never touched: everything happens in
`<state.dir>/worktrees/<task>` on `overnight/<task>`. Rollback is
`git reset --hard` plus `git clean -ffdx` in the worktree only, which costs
milliseconds where re-creating the worktree would cost seconds.

The agent runs git in its worktree and may break the `.git` link file there
(delete it, point it at the user's repository, `git init` over it), so overnight's
own git never finds its repository by discovery (worktree_git.py), and the link is put
back as git wrote it before each rollback, commit and status check (worktree_link.py).

This module is the life of a task's worktree, each step one call into the module that does that job: creation
(worktree_registration.py, first_checkout.py), HEAD kept on the branch (head_on_branch.py, branch_holders.py),
what is work (work_paths.py, hidden_files.py), the commit (commit_staging.py, large_files.py, secret_commits.py),
the rollback (worktree_submodules.py) and what recovery keeps (changes_branch.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from orchestrator import branch_holders, head_on_branch
from orchestrator.changes_branch import changes_branch
from orchestrator.command_environment import UNATTENDED_ENV
from orchestrator.commit_staging import add_all, has_staged_changes
from orchestrator.errors import StateError
from orchestrator.first_checkout import check_out_files
from orchestrator.git_errors import git_reason
from orchestrator.gitdir import admin_dir, common_of, head_commit
from orchestrator.hidden_files import status_seeing_hidden_files, unhide_hidden_files
from orchestrator.large_files import refuse_large_committed, refuse_large_staged
from orchestrator.operations_under_way import log_operations_quit, refuse_bisect_behind, with_operations_quit
from orchestrator.overnights_own import mark_as_task_worktree
from orchestrator.records import CheckResult, KeptOutOfCommit
from orchestrator.repository import open_repo
from orchestrator.secret_commits import SecretKeeping, WorktreeGit, with_folded_subjects
from orchestrator.state_files import WORKTREES_FOLDER
from orchestrator.task_branches import branch_for
from orchestrator.work_paths import kept_by_clean, untracked
from orchestrator.worktree_git import GIT_TIMEOUT_S, run_git, worktree_env
from orchestrator.worktree_link import link_content, restore_link
from orchestrator.worktree_registration import ensure_registered
from orchestrator.worktree_submodules import refuse_left_in_submodules, roll_back_submodules
from orchestrator.writable import make_writable

if TYPE_CHECKING:
    from orchestrator.passed_secrets import PassedSecrets


class Worktree:
    """Implements protocols.Workspace for one task."""

    git_timeout_s: float = GIT_TIMEOUT_S

    def __init__(
        self, path: Path, branch: str, keep: Sequence[str] = (), *, common_dir: Path | None = None, admin: Path | None = None
    ) -> None:
        """The registered worktree at `path`, of the repository at `common_dir` (its git common dir).

        Without `common_dir` (recovery), a link the agent broke is repaired when its
        registration can be found from the broken link or the repository above `path`, or is given
        as `admin` (recovery looks in the configured repository too: `gitdir.admin_dir_for_recovery`);
        otherwise StateError. `admin`: `admin_dir(path, common_dir)`, when the caller has just found it.
        """
        self.path = path
        self.branch = branch
        self.keep = tuple(keep)
        admin = admin if admin is not None else admin_dir(path, common_dir)
        if admin is None:
            raise StateError(f"worktree {path}: its .git link is missing or broken and no repository registers it")
        self._admin = Path(os.path.abspath(admin))
        self._link = link_content(path, admin)
        self._restore_link()
        # The repository's config, which the user's checkout reads too (the agent's commands may not change it).
        self._common = Path(os.path.abspath(common_dir)) if common_dir is not None else common_of(self._admin)
        self.shared_config = self._common / "config"
        self._env = worktree_env(path, self._admin)

    @classmethod
    def ensure(
        cls, repo_path: Path, state_dir: Path, task: str, base: str, keep: Sequence[str] = (), *, repo: Any = None,
        on_commits_kept: Callable[[str, str], None] | None = None, cancel: Any = None,
    ) -> "Worktree":
        """The task's worktree, created from `base` the first time and reused after.
        `on_commits_kept(task, branch)`: told of commits kept off a detached HEAD (see `back_on_branch`).
        `cancel`: the night's CancelToken; its cancel stops the checkout of the files (Cancelled), the worktree
        left registered without an index for the next night to check out (see first_checkout.py).

        Safe to call from several threads, sharing one opened `repo` or not: only
        registering the worktree is serialised, the checkout of its files (the
        slow part in a large repository) runs in parallel.
        """
        repo = repo if repo is not None else open_repo(repo_path)
        repo.git.update_environment(**UNATTENDED_ENV)
        path = state_dir / WORKTREES_FOLDER / task
        branch = branch_for(task)
        admin = ensure_registered(repo, state_dir, path, task, branch, base)
        worktree = cls(path, branch, keep, common_dir=Path(repo.common_dir), admin=admin)
        check_out_files(worktree._git, path, worktree._admin, task, cancel)
        worktree.back_on_branch(task, on_commits_kept=on_commits_kept)
        # On its branch now: marked as the task's, so that off it (detached for a review) it is still told from a person's.
        mark_as_task_worktree(worktree._admin, task)
        return worktree

    def back_on_branch(self, task: str, *, on_commits_kept: Callable[[str, str], None] | None = None) -> None:
        """Put HEAD back on the task's branch, at the branch's tip, files and all, when a person left it
        off; commits they made on the detached HEAD kept first, `on_commits_kept(task, branch)` told
        (see `head_on_branch.back_on_branch`). BranchCheckedOut (nothing changed) while another worktree
        has the branch checked out, or rebases or bisects it."""
        head_on_branch.back_on_branch(self._git, self.path, self._admin, self._common, self.branch, task, on_commits_kept)

    def held_elsewhere(self) -> str | None:
        """The folder of another worktree that has this task's branch checked out, or is rebasing or
        bisecting it, while this one's HEAD is off it. A file read when HEAD is on the branch."""
        return branch_holders.held_elsewhere(self._git, self.path, self._admin, self._common, self.branch)

    def checkpoint(self) -> str:
        # Read from the ref files, not `git rev-parse`: this runs twice an iteration.
        commit = head_commit(self._admin, self._common)
        if commit is None:
            raise StateError(f"worktree {self.path} has no commit checked out")
        return commit

    def rollback(self, checkpoint: str) -> None:
        """Back to `checkpoint`, nothing left under way (see operations_under_way.py), or StateError (one line) when git
        cannot get there."""
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
        if dropped := head_on_branch.onto_branch(self._git, self._admin, self.branch):
            log_operations_quit(self.branch, dropped, before="rollback")
        unhide_hidden_files(self._git, self.path, self._admin)
        self._git("reset", "--hard", "--quiet", checkpoint)
        # -ff: also remove nested repositories the agent may have created.
        self._git("clean", "-ffdxq", *kept_by_clean(self.keep))
        if (self.path / ".gitmodules").exists():
            roll_back_submodules(self._git, self.path)

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
            return changes_branch(
                self._git, self._admin, self.keep, branch, message, secrets, self._secret_keeping, on_kept_out, onto
            )
        except (git.GitCommandError, OSError) as exc:
            raise StateError(f"cannot keep the changes in the worktree {self.path}: {git_reason(exc)}") from None

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
            return tracked + untracked(self._git, self.keep)
        except (git.GitCommandError, OSError) as exc:
            raise StateError(f"cannot list the changes in the worktree {self.path}: {git_reason(exc)}") from None

    def idle_state(self) -> str:
        """What a worktree no iteration runs in holds besides its HEAD: "clean"; "ignored" when only files git
        ignores, which a rollback would remove (`keep` paths it spares are no change at all); else "changed"."""
        self._restore_link()
        # A person's edit to a file they hid from `git status` (skip-worktree, assume-unchanged) is a change too:
        # "clean", recovery kept nothing of it, and the night's first rollback undid it.
        status = self._status_seeing_hidden_files("status", "--porcelain", "--ignored", "--untracked-files=all").splitlines()
        if not status:
            return "clean"
        if any(not line.startswith(("!! ", "?? ")) for line in status):
            return "changed"
        # New files under `keep` (a check's .venv that .gitignore does not name) are "??" too: no change, or every
        # night kept nothing on a branch (seconds in a large project) and logged the worktree as cleaned.
        if any(line.startswith("?? ") for line in status) and (not self.keep or untracked(self._git, self.keep)):
            return "changed"
        if not self.keep:
            return "ignored"
        # A large build folder kept across rollbacks was "changed" every night: a keep commit of nothing
        # and a rollback, seconds each, before any task began.
        return "ignored" if self._git("clean", "-ndffx", *kept_by_clean(self.keep)).strip() else "clean"

    def commit(
        self, message: str, onto: str | None = None, max_file_bytes: int = 0, secrets: PassedSecrets | None = None,
        on_kept_out: Callable[[KeptOutOfCommit], None] | None = None,
    ) -> str:
        """Commit everything the agent left; the current HEAD if it changed nothing.

        `onto`: the iteration's checkpoint. If the agent moved the branch so that it no longer
        holds it (`reset --hard HEAD~1`, `commit --amend`, the branch deleted), the branch is put
        back on it, files and index as they are: the commit then records the worktree exactly,
        and no earlier night's commit leaves the branch. Commits the agent added on top stay.
        A merge, cherry-pick, revert, rebase or bisect the agent left under way is quit first, the message saying so
        (see operations_under_way.py): the commit has one parent, and overnight's author. A bisect left on a commit
        without `onto` or the branch's tip is QualityError `iteration_error`, nothing committed (the caller rolls back).
        A file staged of more than `max_file_bytes` (0: any size) is QualityError `file_too_large`,
        before anything is committed (the caller rolls back).
        `secrets`: the values the check got through the task's `pass_env`; a file that would be committed holding one
        its checkpoint version did not hold is put back as it was there (see `SecretKeeping.keep_out`), `on_kept_out` told.
        """
        import git

        self._restore_link()
        refuse_bisect_behind(self._git, self._admin, self.branch, onto or f"refs/heads/{self.branch}")
        if dropped := head_on_branch.onto_branch(self._git, self._admin, self.branch):
            # A merge's second parent, a cherry-pick's author: dropped, and the commit says so to the morning's reader.
            log_operations_quit(self.branch, dropped, before="commit")
            message = with_operations_quit(message, dropped)
        if onto is not None:
            head_on_branch.keep_on_branch(self._git, self._admin, self._common, onto)
        unhide_hidden_files(self._git, self.path, self._admin)
        # --verbose names every path it stages. Silence means the files match the index, so
        # only changes staged earlier (by a `git add` of the agent's) could still be committed:
        # asked of git only then, an unchanged worktree costs one process fewer.
        staged = add_all(self._git, self._admin, self.keep)
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
        if staged.strip() or (differs if differs is not None else has_staged_changes(self._git)):
            try:
                self._git("commit", "--quiet", "--no-verify", "-m", message, identity=True)
            except git.GitCommandError:
                # Paths staged back to what HEAD has are "no change"; anything else is an error.
                if has_staged_changes(self._git):
                    raise
        refuse_left_in_submodules(self._git, self.path, self.uncommitted_paths)
        return self.checkpoint()

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

    def _status_seeing_hidden_files(self, *status: str) -> str:
        return status_seeing_hidden_files(self._git, self.path, self._admin, *status)

    def _restore_link(self) -> None:
        """Put `.git` back as git made it if the agent removed or changed it (see worktree_link.py)."""
        restore_link(self.path, self._admin, self._link)

    def _git(
        self, *args: str, identity: bool = False, env: dict[str, str] | None = None, stdin: bytes | None = None, cancel: Any = None,
    ) -> str:
        """One git command in this worktree (see `worktree_git.run_git`), `env` added to its environment, killed after
        `git_timeout_s` (read at each call: a test or a caller may lower it on one worktree), or when `cancel` is set."""
        return run_git(
            args, folder=self.path, admin=self._admin, env=self._env, timeout_s=self.git_timeout_s, identity=identity,
            extra_env=env, stdin=stdin, cancel=cancel,
        )

    def _secret_keeping(self, secrets: PassedSecrets) -> SecretKeeping:
        """What keeps the values of `secrets` out of this worktree's commits, running git as `_git` does."""
        return SecretKeeping(WorktreeGit(self._git, self.path, self._env, self.git_timeout_s), secrets)
