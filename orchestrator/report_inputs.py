"""What `overnight report`'s text needs beyond the run store: the branch the morning diff compares against,
whether a run recorded as running has lost its process, and the clock its times are shown on."""

from __future__ import annotations

from datetime import timezone, tzinfo


def report_zone(settings: object) -> tzinfo | None:
    """The clock `[night] deadline` is read on (night_state._on_the_schedules_clock): `[schedule] timezone` when it names a
    zone, else None, this host's (TZ honoured). A report in UTC read "ended 05:00 UTC" beside "deadline = 06:00".

    A timezone no zone database knows is ConfigError (exit 2), as `run` and `serve` refuse it: the host's clock in its
    place read as the zone asked for. A TZ the C library cannot read is UTC, the clock it falls back to, named so and
    said once on stderr: glibc names that clock by TZ's first letters (TZ=Not/AZone read `06:00 Not`)."""
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

        repo = git.Repo(settings.repo_path)  # type: ignore[attr-defined]
        checked_out = repo.active_branch.name
    except Exception:  # detached HEAD, repo moved: the plain name still works in git diff
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
    heads = {head.name for head in repo.heads}  # type: ignore[attr-defined]
    return next((name for name in ("main", "master") if name in heads), "HEAD")


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
