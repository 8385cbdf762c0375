"""`overnight gc`: remove the worktrees and branches of tasks that left the config.

A task's worktree is `<state dir>/worktrees/<task>` on `overnight/<task>` (or detached there,
when its HEAD commit is on some branch, tag or remote); gc removes no other worktree. One elsewhere, even on an `overnight/` branch, is the user's
(a review checkout, say): it and its branch are left alone, as are the main
worktree and every branch outside `overnight/`. A stale task's worktree is
removed when it holds no uncommitted change, since the branch then has all of
it and `Worktree.ensure` recreates it if the task comes back; one with changes
is kept unless `force` (one whose branch a person deleted counts its changes from
the commit it was last on, and is kept too while that commit's own are on no
other ref). The branch is deleted only when each of its commits is on another ref: merged into `[repo] base` (or another branch, or a tag) or on a
remote-tracking branch (pushed); a detached HEAD and `overnight-kept/*` branches do not count. A branch rebased
into base (each commit's change there byte for byte, whitespace included, as `git patch-id --verbatim`
tells; `git cherry` ignores whitespace) counts as merged, unless it has a merge commit of its own
(whose conflict resolution patch ids cannot see), or git is older than 2.39 (no `--verbatim`).
Otherwise it is kept, with the reason, unless `force`. The branch `[repo] base` names is
always kept, even merged: the next night starts from it. Transcripts, notes.md and the run
store keep their history.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.command_environment import UNATTENDED_ENV, base_environment
from orchestrator.config import Config
from orchestrator.errors import ConfigError, StateError
from orchestrator.gitdir import admin_dir, branches_held_by_operations
from orchestrator.operations_under_way import operation_under_way
from orchestrator.repository import check_base, open_repo
from orchestrator.task_branches import BRANCH_PREFIX, KEPT_BRANCH_PREFIX
from orchestrator.worktree import Worktree
from orchestrator.worktree_registration import repair_moved
from orchestrator.writable import make_writable

_GIT_ENV = {**UNATTENDED_ENV, "LC_ALL": "C"}  # C: git's messages are parsed


@dataclass(frozen=True)
class KeptBranch:
    branch: str
    reason: str


@dataclass(frozen=True)
class KeptWorktree:
    path: Path
    reason: str


@dataclass(frozen=True)
class GcResult:
    """What gc removed (or, with dry_run, would remove) and what it kept and why."""

    removed_worktrees: tuple[Path, ...] = ()
    removed_branches: tuple[str, ...] = ()
    kept_branches: tuple[KeptBranch, ...] = ()
    dry_run: bool = False
    kept_worktrees: tuple[KeptWorktree, ...] = ()

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"{verb} worktree {path}" for path in self.removed_worktrees]
        lines += [f"kept worktree {kept.path}: {kept.reason}" for kept in self.kept_worktrees]
        lines += [f"{verb} branch {branch}" for branch in self.removed_branches]
        lines += [f"kept branch {kept.branch}: {kept.reason}" for kept in self.kept_branches]
        return lines or ["nothing to collect"]


def collect_garbage(config: Config, *, force: bool = False, dry_run: bool = False) -> GcResult:
    """Remove worktrees and `overnight/` branches of tasks no longer in `config`.

    What git refuses for one worktree or branch (a lock, files that cannot be deleted, a branch
    a rebase has checked out) keeps that one, with git's reason, and gc goes on with the rest.
    """
    # The checks `overnight run` makes: a path that is a file, or no repository, is a ConfigError;
    # so is a base that names no commit (renamed since), against which every commit looks unmerged.
    repo = open_repo(config.repo_path)
    check_base(repo, config.repo.base)
    sweep = _Sweep(_Git(config.repo_path), Path(repo.common_dir), config, force, dry_run)
    _repair_moved(repo, config.worktrees_dir)
    ours, detached, checked_out, locks = _worktrees(sweep.git, config.worktrees_dir)
    # `ours` too: a task's worktree whose branch a person deleted (`git update-ref -d`) is still the task's.
    stale = sorted((_task_branches(sweep.git) | ours.keys() | detached.keys()) - {task.name for task in config.task})
    removed_worktrees, kept_worktrees, kept_on_branch = sweep.worktrees(stale, ours, detached, locks)
    removed_branches, kept_branches = sweep.branches(stale, {**checked_out, **kept_on_branch})
    return GcResult(tuple(removed_worktrees), tuple(removed_branches), tuple(kept_branches), dry_run, tuple(kept_worktrees))


@dataclass(frozen=True)
class _Sweep:
    """One gc over the stale tasks: their worktrees first, then their branches."""

    git: _Git
    common: Path
    config: Config
    force: bool
    dry_run: bool

    def worktrees(
        self, stale: list[str], ours: dict[str, Path], detached: dict[str, tuple[Path, str]], locks: dict[Path, str]
    ) -> tuple[list[Path], list[KeptWorktree], dict[str, str]]:
        """The stale tasks' worktrees removed (in a dry run: that would be), those kept with why, and
        where each kept one on its task's branch has that branch checked out (by branch)."""
        removed: list[Path] = []
        kept: list[KeptWorktree] = []
        kept_on_branch: dict[str, str] = {}
        for name in stale:
            path = ours.get(name) or detached.get(name, (None, ""))[0]
            if path is None:
                continue
            why_kept = self._why_keep_stale_worktree(name, path, ours, detached, locks)
            if why_kept is None and not self.dry_run:
                why_kept = _remove_worktree(self.git, path, self.common)
            if why_kept:
                kept.append(KeptWorktree(path, why_kept))
                if name in ours:
                    kept_on_branch[BRANCH_PREFIX + name] = str(path)
                continue
            removed.append(path)
        return removed, kept, kept_on_branch

    def _why_keep_stale_worktree(
        self, name: str, path: Path, ours: dict[str, Path], detached: dict[str, tuple[Path, str]], locks: dict[Path, str]
    ) -> str | None:
        """Why the stale task `name`'s worktree at `path` must stay (the same answer in a dry run), or None."""
        git, common, force = self.git, self.common, self.force
        # On a deleted branch (HEAD unborn), its changes are those since the commit it was last on.
        last = _last_commit(git, path, common) if name in ours and git.resolve(f"refs/heads/{BRANCH_PREFIX}{name}") is None else None
        why_kept = _why_keep_worktree(path, BRANCH_PREFIX + name, locks, self.config.repo.keep, common, force, last)
        if why_kept is None and last and not force:
            why_kept = _why_keep_unnamed(git, path, last, "its branch was deleted and its last commit")
        if why_kept is None and name in detached:
            # A rebase stopped at an `edit` shows its worktree detached: --force does not end it.
            why_kept = _operation_in_progress(path, common)
            if why_kept is None and not force:
                why_kept = _why_keep_unnamed(git, path, detached[name][1], "its detached HEAD")
        return why_kept

    def branches(self, stale: list[str], checked_out: dict[str, str]) -> tuple[list[str], list[KeptBranch]]:
        """The stale tasks' branches deleted (in a dry run: that would be) and those kept, with why.
        `checked_out`: where a worktree has each branch checked out, by branch."""
        busy = branches_held_by_operations(self.common)
        removed: list[str] = []
        kept: list[KeptBranch] = []
        base_ref = _symbolic_ref(self.git, self.config.repo.base)
        base_name = _base_label(self.config.repo.base, base_ref)
        base_branch = base_ref.removeprefix("refs/heads/") if base_ref.startswith("refs/heads/") else None
        for name in stale:
            branch = BRANCH_PREFIX + name
            tip = self.git.resolve(f"refs/heads/{branch}")
            if tip is None:
                continue
            why_kept = self._why_branch_is_held(branch, checked_out, busy, base_branch)
            if why_kept is None:
                why_kept = self._delete_branch(branch, tip, base_name, removed)
            if why_kept:
                kept.append(KeptBranch(branch, why_kept))
                continue
            removed.append(branch)
        return removed, kept

    def _why_branch_is_held(
        self, branch: str, checked_out: dict[str, str], busy: dict[str, tuple[Path, str]], base_branch: str | None
    ) -> str | None:
        """Why `branch` must stay whatever its commits: a worktree, `[repo] base` or a git operation holds it; or None."""
        if branch in checked_out:
            return f"checked out at {checked_out[branch]}"
        if branch == base_branch:  # deleting it would leave every later night without its base
            return f"it is [repo] base ({self.config.repo.base})"
        if branch in busy:  # a rebase or bisect holds it, though that worktree's HEAD is detached
            return "checked out at {} (a {} in progress)".format(*busy[branch])
        return None

    def _delete_branch(self, branch: str, tip: str, base_name: str | None, removed: list[str]) -> str | None:
        """Delete `branch` at `tip` (not in a dry run) unless that loses a commit and not `force`: None
        when it is (or would be) deleted, else why it stays. `removed`: the branches deleted before it."""
        try:
            unsafe = None if self.force else _why_unsafe(self.git, branch, tip, base_name, removed)
            if not unsafe and not self.dry_run:
                self.git.run("branch", "-D", "--quiet", branch)
        except _GitFailed as failed:
            unsafe = failed.detail
        return unsafe


def _why_keep_worktree(
    path: Path, branch: str, locks: dict[Path, str], keep: tuple[str, ...], common: Path, force: bool, last: str | None = None
) -> str | None:
    """Why the stale worktree at `path` must stay (the same answer in a dry run), or None. `last`: the
    commit to count changes from, for a worktree whose branch was deleted (None: its HEAD)."""
    if path in locks:  # `git worktree lock`: the user's word, which --force does not overrule
        return f"locked: {locks[path]}" if locks[path] else "locked"
    # A folder deleted by hand holds nothing; `worktree remove` then only forgets it.
    if force or not path.exists():
        return None
    try:
        changes = _uncommitted_changes(path, branch, keep, common, last)
    except StateError as failed:
        return str(failed)
    # Not "use --force": that would also delete every other kept worktree and branch.
    return f"{changes} uncommitted change(s) (to remove only this worktree: git worktree remove --force {path})" if changes else None


def _remove_worktree(git: _Git, path: Path, common: Path) -> str | None:
    """Remove the worktree at `path`; None when done, else git's reason.

    Files the agent or a tool made read-only (Go's module cache) are made writable and the
    removal tried once more. git forgets the worktree before it fails on its files: the folder
    left then is deleted here.
    """
    try:
        git.run("worktree", "remove", "--force", str(path))
        return None
    except _GitFailed as failed:
        first = failed.detail
    make_writable(path)
    try:
        if admin_dir(path, common) is not None:
            git.run("worktree", "remove", "--force", str(path))
        elif path.exists():
            shutil.rmtree(path)
    except (_GitFailed, OSError):
        return first
    return None


def _repair_moved(repo, worktrees_dir: Path) -> None:
    """Task worktrees moved into `worktrees_dir` with the state dir are registered here again
    (`git worktree repair`, as `overnight run` does; a dry run too: it deletes nothing)."""
    try:
        folders = sorted(folder for folder in worktrees_dir.iterdir() if folder.is_dir() and not folder.is_symlink())
    except OSError:
        return
    for folder in folders:
        repair_moved(repo, folder)


def _why_unsafe(git: _Git, branch: str, tip: str, base_name: str | None, removed: list[str]) -> str | None:
    """None when deleting the branch loses no commit; else why it would.

    A commit is safe when a ref other than the branch keeps it: a local branch (`[repo] base`
    among them when it names one), a tag, or a remote-tracking branch (pushed). Not HEAD: a
    detached HEAD (the night's commit checked out to try it) keeps nothing once the user
    switches back. Branches this gc deletes keep nothing either, dry run or not; nor do
    `overnight-kept/*` branches (a person's stray edits, kept by recovery on top of the task's
    commits), which the person deletes once they have looked, the task's commits with them.
    """
    others = [f"--exclude={name.removeprefix('refs/heads/')}" for name in (branch, *removed)]
    others.append(f"--exclude={KEPT_BRANCH_PREFIX}*")
    lost = int(git.run("rev-list", "--count", tip, "--not", *others, "--branches", "--tags", "--remotes"))
    if not lost or (base_name and _rebased_into(git, base_name, tip)):
        return None
    where = f"merged into {base_name}" if base_name else "on another branch or tag"
    # Not "use --force": that would also delete every other kept branch and worktree.
    return f"{lost} commit(s) not {where} and not pushed (to delete only this branch: git branch -D {branch})"


def _rebased_into(git: _Git, base: str, tip: str) -> bool:
    """Whether `base` holds a commit with the very same change as each commit of the branch, whitespace
    included: the branch was rebased into it, or squashed when it had one commit.

    What `git cherry` answers, but byte for byte: its patch ids ignore whitespace, and a line
    indented otherwise (Python, YAML, a Makefile) is another program. Never for a branch with a
    merge commit of its own: patch ids skip merges, and a merge's conflict resolution can carry
    work no other commit has.
    """
    if int(git.run("rev-list", "--count", "--merges", f"{base}..{tip}")):
        return False
    ours = git.run("rev-list", "--no-merges", f"{base}..{tip}").split()
    # git's own patch ids, whitespace ignored, first: cheap, and only the base commits they pair
    # with need a diff of their own ("=": another commit on the other side has the same patch id).
    marked = git.run("rev-list", "--cherry-mark", "--no-merges", f"{tip}...{base}").split()
    paired = {line[1:] for line in marked if line.startswith("=")}
    if not ours or not paired.issuperset(ours):
        return False
    ids = _verbatim_patch_ids(git, [*ours, *(paired - set(ours))])
    if ids is None:
        return False  # a git without `patch-id --verbatim`: the branch is kept rather than maybe lost
    theirs = {ids[commit] for commit in paired - set(ours) if commit in ids}
    return all(ids.get(commit) in theirs for commit in ours)


# The change a commit makes, and nothing a person's config adds or hides: no external diff or
# textconv (two binary edits shown alike), no colour, no rename (git's patch ids detect none).
_PATCH = ("log", "--stdin", "--no-walk=unsorted", "--format=commit %H", "--patch", "--full-index",
          "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color")


def _verbatim_patch_ids(git: _Git, commits: list[str]) -> dict[str, str] | None:
    """Each commit's patch id, whitespace as it is (`git patch-id --verbatim`, git 2.39 on), by commit;
    None where git has no `--verbatim`. A commit that changes nothing has none."""
    patches = git.feed(*_PATCH, data="\n".join(commits).encode())
    try:
        listed = git.feed("patch-id", "--verbatim", data=patches).decode()
    except _GitFailed:
        return None
    return {commit: patch_id for patch_id, commit in (line.split() for line in listed.splitlines())}


def _symbolic_ref(git: _Git, base: str) -> str:
    """The full ref `[repo] base` names (HEAD on a branch: that branch's), or "" when it names none."""
    done = git._call("rev-parse", "--symbolic-full-name", base)
    return done.stdout.strip() if done.returncode == 0 else ""


# What a git operation under way leaves in a worktree's admin folder, and its name.
def _operation_in_progress(path: Path, common: Path) -> str | None:
    """Why the worktree at `path` must stay because a person's git operation is under way in it, or None."""
    admin = admin_dir(path, common)
    doing = operation_under_way(Path(admin)) if admin is not None else None
    if doing is None:
        return None
    return f"{'an' if doing == 'am' else 'a'} {doing} is in progress there (finish or abort it first)"


def _base_label(base: str, ref: str) -> str | None:
    """How to name `[repo] base` (whose full ref is `ref`) in a reason: itself when it names a ref
    (HEAD on a branch: that branch); None when it names no ref (a detached HEAD, a commit id), which
    keeps no commit."""
    if not ref.startswith(("refs/heads/", "refs/tags/", "refs/remotes/")):
        return None
    return base if base != "HEAD" else ref.removeprefix("refs/heads/")


def _uncommitted_changes(path: Path, branch: str, keep: tuple[str, ...], common: Path, last: str | None = None) -> int:
    """What a rollback would undo in the worktree at `path`: `[repo] keep` and ignored files are not work.
    `last`: the commit to count from when its branch was deleted (see Worktree.uncommitted_paths)."""
    return len(Worktree(path, branch, keep, common_dir=common).uncommitted_paths(since=last))


def _last_commit(git: _Git, path: Path, common: Path) -> str | None:
    """The commit the worktree at `path` was last on, from its HEAD's reflog; None when that is gone
    (its changes are then counted against nothing: every file, which keeps it unless `force`)."""
    admin = admin_dir(path, common)
    try:
        entries = (Path(admin) / "logs" / "HEAD").read_text().splitlines() if admin is not None else []
    except OSError:
        return None
    fields = entries[-1].split()[:2] if entries else []
    if len(fields) < 2:
        return None
    before, after = fields
    # Deleted from inside the worktree, git logs the deletion itself last: its new id all zeros.
    return git.resolve(before if set(after) == {"0"} else after)


def _why_keep_unnamed(git: _Git, path: Path, commit: str, holder: str) -> str | None:
    """Why a stale task's worktree must stay: `commit` (its detached HEAD, or the commit it was last on
    when its branch was deleted) has commits on no branch, tag or remote, and removing the worktree
    removes the only name they have (its HEAD and reflog). `holder` says which, in the reason."""
    try:
        lost = int(git.run("rev-list", "--count", commit, "--not", "--branches", "--tags", "--remotes"))
    except _GitFailed as failed:
        return failed.detail
    if not lost:
        return None
    return f"{holder} has {lost} commit(s) on no branch, tag or remote (to remove only this worktree: git worktree remove --force {path})"


def _task_branches(git: _Git) -> set[str]:
    refs = git.run("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_PREFIX}").split()
    names = {ref.removeprefix(f"refs/heads/{BRANCH_PREFIX}") for ref in refs}
    # Task names hold no slash, so overnight/a/b was made by someone else.
    return {name for name in names if "/" not in name}


def _worktrees(git: _Git, worktrees_dir: Path) -> tuple[dict[str, Path], dict[str, tuple[Path, str]], dict[str, str], dict[Path, str]]:
    """Task worktrees by task name (on their branch, and on a detached HEAD), where every other
    worktree has its branch checked out (by branch), and the locked worktrees with the lock's
    reason ("" when none was given).

    Only `<worktrees_dir>/<task>` is a task's: on `overnight/<task>`, or detached (with its HEAD
    commit; git makes a person detach it to check the task's branch out in their own checkout for
    review). The main worktree and any the user added are theirs, whatever their branch, and
    their branches stay.
    """
    ours: dict[str, Path] = {}
    detached: dict[str, tuple[Path, str]] = {}
    theirs: dict[str, str] = {}
    locks: dict[Path, str] = {}
    home = worktrees_dir.resolve()
    for index, block in enumerate(_worktree_blocks(git)):
        if "worktree" not in block:
            continue
        path = Path(block["worktree"])
        branch = block.get("branch", "").removeprefix("refs/heads/")
        if "locked" in block:
            locks[path] = block["locked"]
        in_home = index > 0 and path.resolve().parent == home
        if in_home and branch == BRANCH_PREFIX + path.name:
            ours[path.name] = path
        elif in_home and "detached" in block and "/" not in path.name:
            detached[path.name] = (path, block.get("HEAD", "HEAD"))
        elif branch and "prunable" in block:
            theirs[branch] = f"{path}, a folder that no longer exists (`git worktree prune` forgets it)"
        elif branch:
            theirs[branch] = str(path)
    return ours, detached, theirs, locks


def _worktree_blocks(git: _Git) -> list[dict[str, str]]:
    """`git worktree list --porcelain`, one dict a worktree; the main worktree first."""
    blocks: list[dict[str, str]] = []
    for chunk in git.run("worktree", "list", "--porcelain").split("\n\n"):
        fields = dict((line.split(" ", 1) + [""])[:2] for line in chunk.splitlines() if line)
        if fields:
            blocks.append(fields)
    return blocks


class _GitFailed(ConfigError):
    """A git command gc ran failed; `detail` is git's one line, without its "fatal:" or "error:"."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail.removeprefix("fatal:").removeprefix("error:").strip()


class _Git:
    """git in one folder of the user's repository; never prompts, never pages."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], stdin=subprocess.DEVNULL, text=True, **self._options())

    def _options(self) -> dict:
        """subprocess.run's arguments for any git command here."""
        return dict(
            cwd=self.folder,
            # Without an inherited GIT_DIR (a hook, a shell's dotfiles): it would send gc to another repository.
            env={**base_environment(), **_GIT_ENV},
            capture_output=True,
            timeout=120,
        )

    def run(self, *args: str) -> str:
        done = self._call(*args)
        if done.returncode != 0:
            raise self._failed(args, done.stderr)
        return done.stdout

    def feed(self, *args: str, data: bytes) -> bytes:
        """git's output, bytes as they are, for `data` on its standard input (a patch, which need not be text)."""
        done = subprocess.run(["git", *args], input=data, **self._options())
        if done.returncode != 0:
            raise self._failed(args, done.stderr.decode(errors="replace"))
        return done.stdout

    def _failed(self, args: tuple[str, ...], stderr: str) -> _GitFailed:
        lines = stderr.strip().splitlines() or ["failed"]
        # git's own "fatal:" or "error:" line says why; hints follow it (for dubious ownership, a command to copy).
        detail = next((line.strip() for line in lines if line.startswith(("fatal:", "error:"))), lines[-1].strip())
        if not detail.removeprefix("fatal:").removeprefix("error:").strip():
            detail = "git failed and said no more"  # an empty reason would count the worktree or branch as removed
        return _GitFailed(f"gc: git {' '.join(args[:2])} failed in {self.folder}: {detail}", detail)

    def resolve(self, revision: str) -> str | None:
        done = self._call("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        return done.stdout.strip() or None if done.returncode == 0 else None
