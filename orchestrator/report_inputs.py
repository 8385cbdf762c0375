"""What `overnight report`'s text needs beyond the run store: the branch the morning diff compares against,
whether a run recorded as running has lost its process, and the clock its times are shown on."""

from __future__ import annotations

from datetime import timezone, tzinfo


def report_zone(settings: object, *, said: bool = True) -> tzinfo | None:
    """The clock `[night] deadline` is read on (night_state._on_the_schedules_clock): `[schedule] timezone` when it names a
    zone, else None, this host's (TZ honoured). A report in UTC read "ended 05:00 UTC" beside "deadline = 06:00".

    A timezone no zone database knows is ConfigError (exit 2), as `run` and `serve` refuse it: the host's clock in its
    place read as the zone asked for. A TZ the C library cannot read is UTC, the clock it falls back to, named so and
    said once on stderr: glibc names that clock by TZ's first letters (TZ=Not/AZone read `06:00 Not`). Not said where
    `said` is False: `overnight run`'s step summary, whose night said it already (`deadline_read_in_utc`)."""
    from orchestrator.cancel import unreadable_tz
    from orchestrator.logs import get_logger

    if settings.schedule.timezone != "local":  # type: ignore[attr-defined]
        from orchestrator.crontab import schedule_timezone

        return schedule_timezone(settings)  # type: ignore[arg-type]
    unreadable = unreadable_tz()
    if unreadable is None:
        return None
    why = (
        "TZ names no zone this host knows, nor is it a POSIX rule with an offset under a day: times are in UTC, "
        "the clock the C library falls back to"
    )
    if said:
        get_logger().warning("report_times_in_utc", tz=unreadable, why=why)
    return timezone.utc


def process_gone(run: object, began: object) -> bool:
    """A run recorded as running whose process, on this host, no longer exists. `began`: the run's start
    on this host's clock (a shared PostgreSQL store writes the database's, which may be minutes off)."""
    import socket

    from orchestrator.process_liveness import pid_alive

    return run.status == "running" and run.host == socket.gethostname() and not pid_alive(run.pid, began)  # type: ignore[attr-defined]


# Branches overnight makes (a task's, a kept copy's): never what a task's work is merged into.
_OWN_BRANCHES = ("overnight/", "overnight-kept/")


def merge_target(settings: object) -> str:
    """What the morning diff compares against: `[repo] base`, or the branch checked out there."""
    base = settings.repo.base  # type: ignore[attr-defined]
    if base != "HEAD":
        return base
    try:
        import git

        from orchestrator.ref_storage import checked_out_branch

        repo = git.Repo(settings.repo_path)  # type: ignore[attr-defined]
        checked_out = checked_out_branch(repo)
    except Exception:  # repo moved: the plain name still works in git diff
        return "HEAD"
    if checked_out is None:  # detached HEAD
        return "HEAD"
    # A task's branch checked out there for review: `git diff overnight/x...overnight/x` is empty.
    return _mainline(repo) if checked_out.startswith(_OWN_BRANCHES) else checked_out


def _mainline(repo: object) -> str:
    """The branch the tasks' work goes into when the checkout is on one of overnight's: the remote's
    default branch, else `main` or `master`, else HEAD."""
    try:
        remote_default = repo.git.symbolic_ref("--short", "-q", "refs/remotes/origin/HEAD")  # type: ignore[attr-defined]
    except Exception:  # no remote, or it names no default branch
        remote_default = ""
    if remote_default and not remote_default.removeprefix("origin/").startswith(_OWN_BRANCHES):
        return remote_default
    from orchestrator.ref_storage import has_branch

    # Each asked by name: a listing of every branch that git failed read as "neither is there".
    return next((name for name in ("main", "master") if has_branch(repo, name)), "HEAD")


def branches_in(settings: object, target: str, branches: list[str]) -> frozenset[str]:
    """Those of `branches` whose every commit `target` already holds: a task that succeeded with no change (its check
    passed as it was) on a branch with no earlier night's work, or one already merged. Their review line showed an
    empty diff under "To review and merge". A branch git cannot tell about (deleted, the repository moved) is not one.
    One git process for them all: one a branch (`git merge-base --is-ancestor`) was 50 gits and 160 ms for 50 tasks."""
    if not branches:
        return frozenset()
    try:
        import git

        listed = git.Repo(settings.repo_path).git.for_each_ref(  # type: ignore[attr-defined]
            f"--merged={target}", "--format=%(refname)", *(f"refs/heads/{branch}" for branch in branches)
        )
    except Exception:  # no git, a target git cannot read, the repository moved: every line stays
        return frozenset()
    held = set(listed.splitlines())
    return frozenset(branch for branch in branches if f"refs/heads/{branch}" in held)


def branches_apart(settings: object, target: str, branches: list[str]) -> frozenset[str]:
    """Those of `branches` that share no commit with `target`: its history rewritten under them (a `rebase --root`, a
    `filter-repo`, a branch made anew), or cut short in a shallow clone. `git diff target...branch` compares from their
    merge base and, with none, is `fatal: no merge base`; the review line compares the two trees instead. A branch git
    cannot tell about is not one.

    One git process when every branch's first commits are `target`'s (the usual morning), three otherwise, however many
    the branches: a `git merge-base` a branch was 50 gits for 50 tasks on the morning main was rewritten."""
    if not branches:
        return frozenset()
    try:
        import git

        repo = git.Repo(settings.repo_path)  # type: ignore[attr-defined]
        refs = [f"refs/heads/{branch}" for branch in branches]
        if not repo.git.rev_list("--max-parents=0", *refs, "--not", target, "--").strip():
            return frozenset()  # every root commit of theirs is the target's: each shares at least that one
        # The branches' commits `target` lacks, each with its parents; `-` marks a commit of `target`'s they come from.
        graph = repo.git.rev_list("--boundary", "--parents", *refs, "--not", target, "--").splitlines()
        tips = repo.git.rev_parse(*refs, "--").split()[: len(refs)]
    except Exception:  # no git, a target git cannot read, the repository moved: every line stays as it was
        return frozenset()
    parents: dict[str, list[str]] = {}
    boundary: set[str] = set()
    for line in graph:
        commit, *its_parents = line.split()
        if commit.startswith("-"):
            boundary.add(commit[1:])
        else:
            parents[commit] = its_parents
    return frozenset(branch for branch, tip in zip(branches, tips) if not _reaches(tip, parents, boundary))


def _reaches(tip: str, parents: dict[str, list[str]], boundary: set[str]) -> bool:
    """Whether `tip` leads to a commit of the target's: `parents` holds the commits the target lacks, `boundary` those
    of the target's they come from (`git rev-list --boundary --parents`)."""
    if tip not in parents:
        return True  # not among the commits the target lacks: the target holds it
    seen, stack = {tip}, [tip]
    while stack:
        for parent in parents.get(stack.pop(), ()):
            if parent in boundary:
                return True
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return False


def kept_branches(settings: object, tasks: list[str]) -> list[str]:
    """The `overnight-kept/<task>/<UTC time>` branches of `tasks` there are: what a person left in a task's worktree,
    kept there before a night cleaned it (kept_edits.py). Only a log line said so: the morning found the edits gone from
    the worktree, and the report did not say where. A branch git cannot tell about is not one: the report never fails
    for them. A repository that moved says nothing; one git refuses to read (another user's: "dubious ownership", a
    corrupt packed-refs line) is a `kept_branches_unknown` warning on stderr with git's reason, as an empty list was
    read as "nothing kept" where the ref files, read by hand before, held a person's edits.

    Asked of git, which reads its refs in whatever form the repository keeps them: read by hand from ref files and
    packed-refs, a repository of git's reftable format (`git init --ref-format=reftable`) had none. One git process for
    all the tasks, every kept branch listed and those of `tasks` picked here: a task's name as a for-each-ref pattern
    would be read as a glob."""
    from orchestrator.surrogates import mend
    from orchestrator.task_branches import KEPT_BRANCH_PREFIX

    if not tasks:
        return []
    try:
        import git

        repo = git.Repo(settings.repo_path)  # type: ignore[attr-defined]
    except Exception:  # no repository there (moved, deleted): nothing to name
        return []
    try:
        listed = repo.git.for_each_ref("--format=%(refname)", f"refs/heads/{KEPT_BRANCH_PREFIX}")
    except Exception as failed:  # no git, git refusing or failing: a warning, not an empty section that means none
        from orchestrator.git_errors import git_reason
        from orchestrator.logs import get_logger

        get_logger().warning(
            "kept_branches_unknown", repo=str(settings.repo_path), reason=git_reason(failed),  # type: ignore[attr-defined]
            why="git could not list the overnight-kept/ branches: the report names none of them",
        )
        return []
    folders = {f"refs/heads/{KEPT_BRANCH_PREFIX}{task}" for task in tasks}
    # A name's byte that is not UTF-8 (git takes 0xff) comes as a lone surrogate, which strict JSON parsers refuse:
    # written as its escape (`\udcff`), as the tools show such a file name (surrogates.py). One ref a line, split on
    # "\n" alone: git takes U+2028 or U+0085 in a name, where splitlines() cut it in two.
    refs = listed.split("\n")
    return sorted(mend(ref.removeprefix("refs/heads/")) for ref in refs if ref.rpartition("/")[0] in folders)
