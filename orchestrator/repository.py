"""The user's repository, opened, and its `[repo] base` checked: each refusal a ConfigError naming the key."""

from __future__ import annotations

from pathlib import Path

from orchestrator.checkout import checkout_around, git_folder_around
from orchestrator.errors import ConfigError
from orchestrator.git_errors import git_said
from orchestrator.gitdir import OBJECT_NAME, broken_head_ref, head_commit
from orchestrator.printable import shortened

# What git says when it refuses the repository itself, whatever the name asked for.
_REPOSITORY_REFUSED = ("dubious ownership", "safe.directory", "not a git repository")
_GIT_DIED = 128  # git's exit code for a fatal error


def open_repo(path: Path):
    """The user's repository, or ConfigError naming [repo] path."""
    import git

    try:
        repo = git.Repo(path)
    except (git.NoSuchPathError, git.InvalidGitRepositoryError):
        raise ConfigError(f"[repo] path: {path} is not a git repository{_inside_one(path)}") from None
    if repo.bare:
        raise ConfigError(f"[repo] path: {path} is a bare repository; point it at a checkout (a clone) of it")
    if _head_commit(repo) is None:
        raise ConfigError(_no_commit(repo, path))
    return repo


def _no_commit(repo, path: Path) -> str:
    """Why HEAD names no commit: a branch with none yet, or a damaged ref ("has no commits yet" sent the person
    who has years of them looking for the wrong fault)."""
    broken = broken_head_ref(Path(repo.git_dir), Path(repo.common_dir))
    if broken is None:
        return f"[repo] path: {path} has no commits yet; commit something first"
    ref, held = broken
    shown = repr(shortened(held, 40)) if held else "nothing"
    return (
        f"[repo] path: {path}: its branch is a broken ref: {ref} holds {shown}, not a commit; "
        f"point it at one (`git update-ref {ref} <commit>`)"
    )


def _inside_one(path: Path) -> str:
    """", but a folder inside the one at X: ..." when `path` is a subfolder of a checkout (a monorepo's project),
    or ", but a folder inside the git folder X: ..." when it lies among git's own files."""
    git_folder = git_folder_around(path)
    if git_folder is not None:
        return f", but a folder inside the git folder {git_folder}: point [repo] path at the top of a checkout"
    top = checkout_around(path)
    return f", but a folder inside the one at {top}: point [repo] path there (a night works on the whole repository)" if top else ""


def check_base(repo, base: str) -> None:
    """ConfigError unless `[repo] base` names a commit (new task branches start there)."""
    import git

    try:
        named = repo.git.rev_parse("--verify", "--quiet", f"{base}^{{commit}}")
    except OSError as exc:  # git never started: E2BIG, a base longer than one argument can be (128 KiB on Linux)
        raise ConfigError(f"[repo] base: {shortened(base, 80)!r} cannot be given to git: {exc.strerror or exc}") from None
    except git.GitCommandError as exc:
        # --quiet: a name that is no commit fails silently; anything git says is about the repository
        # itself ("detected dubious ownership" when cron runs as another user than its owner).
        said = git_said(exc)
        # A name that is no commit exits 1; git dies with 128 when it cannot read the repository or its settings
        # at all (a broken .git/config, `GIT_CONFIG_COUNT=8x`), which read as "[repo] base: 'HEAD' is not a commit".
        if exc.status == _GIT_DIED or any(marker in said for marker in _REPOSITORY_REFUSED):
            reason = said.removeprefix("fatal:").removeprefix("error:").strip() or f"git exited {exc.status}"
            if "dubious ownership" in reason:
                reason += " (run overnight as the repository's owner, or add it to git's safe.directory)"
            raise ConfigError(f"[repo] path: git refuses {repo.working_tree_dir}: {reason}") from None
        if said:  # about the name: a tree or blob (HEAD^{tree}, a tag of a tree), not a commit
            reason = said.removeprefix("error:").strip().removeprefix(f"{base}^{{commit}}:").strip()
            raise ConfigError(f"[repo] base: {base!r} is not a commit in {repo.working_tree_dir}: {reason}") from None
        raise ConfigError(f"[repo] base: {base!r} is not a branch, tag or commit in {repo.working_tree_dir}") from None
    if not OBJECT_NAME.fullmatch(named.strip()):
        # `^HEAD` passes --verify as a negated commit ("^<sha>"), which `git worktree add` then refuses
        # once the night has begun: a crashed run in a state dir made for nothing.
        raise ConfigError(f"[repo] base: {base!r} is not a branch, tag or commit in {repo.working_tree_dir} (git reads it as {named.strip()!r})")


def _head_commit(repo) -> str | None:
    """The HEAD commit of a git.Repo's checkout (see head_commit)."""
    return head_commit(Path(repo.git_dir), Path(repo.common_dir))
