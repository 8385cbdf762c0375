"""Why `overnight gc` keeps a stale task's worktree or branch: what removing it would lose, or who holds it."""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import StateError
from orchestrator.gc_git import GcGit, GcGitFailed
from orchestrator.gitdir import admin_dir
from orchestrator.operations_under_way import operation_under_way
from orchestrator.task_branches import KEPT_BRANCH_PREFIX
from orchestrator.worktree import Worktree


def why_keep_worktree(
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


def why_unsafe(git: GcGit, branch: str, tip: str, base_name: str | None, removed: list[str]) -> str | None:
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


def _rebased_into(git: GcGit, base: str, tip: str) -> bool:
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


def _verbatim_patch_ids(git: GcGit, commits: list[str]) -> dict[str, str] | None:
    """Each commit's patch id, whitespace as it is (`git patch-id --verbatim`, git 2.39 on), by commit;
    None where git has no `--verbatim`. A commit that changes nothing has none."""
    patches = git.feed(*_PATCH, data="\n".join(commits).encode())
    try:
        listed = git.feed("patch-id", "--verbatim", data=patches).decode()
    except GcGitFailed:
        return None
    return {commit: patch_id for patch_id, commit in (line.split() for line in listed.splitlines())}


def operation_in_progress(path: Path, common: Path) -> str | None:
    """Why the worktree at `path` must stay because a person's git operation is under way in it, or None."""
    admin = admin_dir(path, common)
    doing = operation_under_way(Path(admin)) if admin is not None else None
    if doing is None:
        return None
    return f"{'an' if doing == 'am' else 'a'} {doing} is in progress there (finish or abort it first)"


def base_label(base: str, ref: str) -> str | None:
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


def last_commit(git: GcGit, path: Path, common: Path) -> str | None:
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


def why_keep_unnamed(git: GcGit, path: Path, commit: str, holder: str) -> str | None:
    """Why a stale task's worktree must stay: `commit` (its detached HEAD, or the commit it was last on
    when its branch was deleted) has commits on no branch, tag or remote, and removing the worktree
    removes the only name they have (its HEAD and reflog). `holder` says which, in the reason."""
    try:
        lost = int(git.run("rev-list", "--count", commit, "--not", "--branches", "--tags", "--remotes"))
    except GcGitFailed as failed:
        return failed.detail
    if not lost:
        return None
    return f"{holder} has {lost} commit(s) on no branch, tag or remote (to remove only this worktree: git worktree remove --force {path})"
