"""Task worktrees on real git repositories: made once, reused, made again, made from many threads."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import git as gitpython
import pytest
import structlog

from orchestrator.cancel import CancelToken
from orchestrator.config import load_config
from orchestrator.errors import Cancelled, QualityError, StateError
from orchestrator.gc import collect_garbage
from orchestrator.lock import StateLock
from orchestrator.recovery import recover_interrupted
from orchestrator.repository import open_repo
from orchestrator.worktree import Worktree
from runs import RunStore
from tests.conftest import SAMPLE_FILES, git, make_repo, many_slow_files, smudges_running, write_config


def recovery_logs(config) -> list[dict]:
    """The events of a night's recovery in `config`'s state dir, run as `overnight run` runs it (under the lock)."""
    with StateLock(config.state_dir), structlog.testing.capture_logs() as logs:
        store = RunStore.open(config.store_url)
        try:
            recover_interrupted(store, config, structlog.get_logger())
        finally:
            store.close()
    return logs


def test_made_once_then_reused(repo: Path, tmp_path: Path) -> None:
    """The second ensure finds the worktree and its branch as the first left them."""
    state = tmp_path / "state"
    first = Worktree.ensure(repo, state, "fix", "HEAD")
    (first.path / "new.txt").write_text("work\n")
    commit = first.commit("overnight: fix iteration 1")
    again = Worktree.ensure(repo, state, "fix", "HEAD")
    assert again.path == first.path and again.checkpoint() == commit
    assert (again.path / "new.txt").read_text() == "work\n"


def test_a_worktree_moved_with_the_state_dir_is_repaired_and_reused(repo: Path, tmp_path: Path) -> None:
    """After `mv` of the state dir (`[state] dir` edited), the next night's worktree is the moved folder, registered there, its files as they were."""
    tree = Worktree.ensure(repo, tmp_path / "old-state", "fix", "HEAD")
    (tree.path / "greet.py").write_text("agent\n")
    tip = tree.commit("night 1")
    (tree.path / "REVIEW.md").write_text("my review\n")
    shutil.move(tmp_path / "old-state", tmp_path / "new-state")
    moved = Worktree.ensure(repo, tmp_path / "new-state", "fix", "HEAD")
    assert moved.path == tmp_path / "new-state" / "worktrees" / "fix" and moved.checkpoint() == tip
    assert (moved.path / "REVIEW.md").read_text() == "my review\n"
    listed = git(repo, "worktree", "list", "--porcelain")
    assert f"worktree {moved.path}\n" in listed and "old-state" not in listed


def test_a_worktree_folder_renamed_aside_is_left_as_it_is_and_the_task_made_anew(repo: Path, tmp_path: Path) -> None:
    """`mv worktrees/fix worktrees/fix.bak` (to keep it while the task starts over) is a person's folder, not the
    task's moved with the state dir: recovery and gc leave it and its registration as they are, and the next
    ensure makes `fix` again on its branch. It was repaired: ensure failed ("already checked out at .../fix.bak"),
    and recovery kept fix.bak's edits as task "fix.bak"'s and reset it."""
    config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                      tasks=[{"name": "fix", "prompt": "p", "check": "true"}]))
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    (tree.path / "new.txt").write_text("work\n")
    commit = tree.commit("overnight: fix iteration 1")
    (tree.path / "greet.py").write_text("my edit\n")
    aside = config.worktrees_dir / "fix.bak"
    tree.path.rename(aside)
    logs = recovery_logs(config)
    collect_garbage(config)
    assert ("worktree_folder_kept", "fix.bak") in [(e["event"], e.get("task")) for e in logs]
    assert git(repo, "branch", "--list", "overnight-kept/*") == ""
    assert (aside / "greet.py").read_text() == "my edit\n" and (aside / "new.txt").exists()
    again = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    assert again.path == config.worktrees_dir / "fix" and again.checkpoint() == commit
    assert (again.path / "new.txt").read_text() == "work\n" and again.idle_state() == "clean"
    assert str(aside) not in git(repo, "worktree", "list", "--porcelain")


def test_a_worktree_folder_removed_by_hand_comes_back_on_its_branch(repo: Path, tmp_path: Path) -> None:
    """rm -rf of a worktree leaves it registered; ensure prunes and re-creates it, commits kept."""
    state = tmp_path / "state"
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    (tree.path / "new.txt").write_text("work\n")
    commit = tree.commit("overnight: fix iteration 1")
    shutil.rmtree(tree.path)
    back = Worktree.ensure(repo, state, "fix", "HEAD")
    assert back.checkpoint() == commit
    assert (back.path / "new.txt").read_text() == "work\n"
    assert back.idle_state() == "clean"


def test_remaking_a_removed_worktree_forgets_no_worktree_of_the_users(repo: Path, tmp_path: Path) -> None:
    """The user's own worktree whose folder is missing tonight (a disk not mounted), with a commit
    only its detached HEAD holds, stays registered: `git worktree prune` would have forgotten it,
    and the next `git gc` would have deleted the commit."""
    usb = tmp_path / "usb" / "experiment"
    git(repo, "worktree", "add", "-q", "--detach", str(usb))
    (usb / "idea.txt").write_text("only here\n")
    git(usb, "add", "idea.txt")
    git(usb, "commit", "-q", "-m", "experiment")
    experiment = git(usb, "rev-parse", "HEAD")
    state = tmp_path / "state"
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    shutil.rmtree(tree.path)
    (usb.parent).rename(tmp_path / "unmounted")
    Worktree.ensure(repo, state, "fix", "HEAD")
    listed = git(repo, "worktree", "list", "--porcelain")
    assert f"worktree {usb}" in listed and f"HEAD {experiment}" in listed


def test_a_filter_program_not_installed_is_named_in_the_error(repo: Path, tmp_path: Path) -> None:
    """`git lfs install` written in the repository's config, git-lfs not on this machine: the checkout fails
    with git saying only "the remote end hung up unexpectedly"; the error names the missing program."""
    from orchestrator.errors import ConfigError

    (repo / ".gitattributes").write_text("*.bin filter=lfs\n")
    (repo / "a.bin").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 3\n")
    git(repo, "add", ".gitattributes", "a.bin")
    git(repo, "commit", "-q", "-m", "lfs")
    for key, value in (("required", "true"), ("process", "git-lfs-not-installed filter-process"), ("smudge", "git-lfs-not-installed smudge %f")):
        git(repo, "config", f"filter.lfs.{key}", value)
    with pytest.raises(ConfigError) as refused:
        Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    assert "git-lfs-not-installed" in str(refused.value) and "not found" in str(refused.value)


def test_a_sparse_worktree_commits_with_a_git_older_than_add_sparse(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git 2.31-2.33 has no `add --sparse`: the commit in a sparse checkout adds without it, not an error every iteration."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    git(tree.path, "sparse-checkout", "set", "--no-cone", "/*.py")
    real = shutil.which("git")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(
        f"#!/bin/sh\nfor arg; do [ \"$arg\" = --sparse ] && {{ echo \"error: unknown option \\`sparse'\" >&2; exit 129; }}; done\nexec {real} \"$@\"\n"
    )
    (shim / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")  # its git environment is taken when it is made
    (tree.path / "new.py").write_text("x = 1\n")
    commit = tree.commit("overnight: fix iteration 1")
    assert git(repo, "show", f"{commit}:new.py") == "x = 1"


def _sparse_the_git_way(repo: Path, *options: str) -> None:
    git(repo, "sparse-checkout", "set", *options)


def _sparse_by_hand(repo: Path) -> None:
    """The older way, still git's: core.sparseCheckout in the shared config (no extensions.worktreeConfig), patterns written."""
    git(repo, "config", "core.sparseCheckout", "true")
    (repo / ".git" / "info" / "sparse-checkout").write_text("/greet.py\n")
    git(repo, "read-tree", "-mu", "HEAD")


@pytest.mark.parametrize(
    "make_sparse",
    [
        lambda repo: _sparse_the_git_way(repo, "lib"),
        lambda repo: _sparse_the_git_way(repo, "--sparse-index", "lib"),
        lambda repo: _sparse_the_git_way(repo, "--no-cone", "/greet.py"),
        _sparse_by_hand,
    ],
    ids=["cone", "cone-sparse-index", "no-cone", "shared-config"],
)
def test_a_sparse_user_checkout_leaves_the_task_worktree_whole_and_keeps_its_own_patterns(
    repo: Path, tmp_path: Path, make_sparse: Callable[[Path], None]
) -> None:
    """The user's sparse checkout is not copied into a task's worktree (git >= 2.36 copied it: the check's script was
    missing there, failing the task every night), nor changed; the worktree stays whole after a rollback and a reuse."""
    for folder in ("lib", "checks"):
        (repo / folder).mkdir()
        (repo / folder / "it.py").write_text("x = 1\n")
    git(repo, "add", "lib", "checks")
    git(repo, "commit", "-q", "-m", "folders")
    make_sparse(repo)
    users = [repo / ".git" / name for name in ("config", "config.worktree", "info/sparse-checkout")]
    before = [path.read_bytes() if path.exists() else None for path in users], sorted(os.listdir(repo))
    whole = git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
    assert not (repo / "checks" / "it.py").exists()
    state = tmp_path / "state"
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    assert [name for name in whole if not (tree.path / name).is_file()] == []
    (tree.path / "check_greet.py").unlink()
    tree.rollback(tree.checkpoint())
    again = Worktree.ensure(repo, state, "fix", "HEAD")
    again.rollback(again.checkpoint())
    assert [name for name in whole if not (again.path / name).is_file()] == [] and again.idle_state() == "clean"
    assert ([path.read_bytes() if path.exists() else None for path in users], sorted(os.listdir(repo))) == before


def test_a_worktree_registered_but_never_checked_out_gets_its_files(repo: Path, tmp_path: Path) -> None:
    """A night killed between `worktree add --no-checkout` and the checkout leaves an empty worktree; the next ensure fills it."""
    state = tmp_path / "state"
    path = state / "worktrees" / "fix"
    path.parent.mkdir(parents=True)
    git(repo, "worktree", "add", "-q", "--no-checkout", "-b", "overnight/fix", str(path), "HEAD")
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    assert (tree.path / "greet.py").exists() and tree.idle_state() == "clean"


def test_a_cancel_stops_the_first_checkout_and_the_next_ensure_checks_it_out_whole(repo: Path, tmp_path: Path) -> None:
    """A night cancelled while a worktree's files are checked out (a minute on a large repository) kills the git and
    what it runs, at once: Cancelled, no index or index lock left, and the next ensure checks every file out."""
    smudges = tmp_path / "smudge.pids"
    data = many_slow_files(repo, 300, f"echo $$ >> {smudges}; sleep 0.1")  # half a minute to check out, whole
    state, cancel = tmp_path / "state", CancelToken()
    checked_out = state / "worktrees" / "fix" / "data"

    def cancel_once_under_way() -> None:
        deadline = time.monotonic() + 30
        while len(list(checked_out.iterdir()) if checked_out.is_dir() else ()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        cancelled_at.append(time.monotonic())
        cancel.cancel("SIGTERM")

    cancelled_at: list[float] = []
    canceller = threading.Thread(target=cancel_once_under_way)
    canceller.start()
    with pytest.raises(Cancelled, match="SIGTERM"):
        Worktree.ensure(repo, state, "fix", "HEAD", cancel=cancel)
    # Timed from the cancel, not from the start (a loaded machine may take its time to check out the first files);
    # what is left of the checkout takes 30 s at the least.
    assert time.monotonic() - cancelled_at[0] < 15
    canceller.join()
    assert len(list(checked_out.iterdir())) < 300
    admin = repo / ".git" / "worktrees" / "fix"
    assert not (admin / "index").exists() and not (admin / "index.lock").exists()
    assert not smudges_running(smudges)
    git(repo, "config", "--remove-section", "filter.slow")
    tree = Worktree.ensure(repo, state, "fix", "HEAD", cancel=CancelToken())
    assert sorted(os.listdir(tree.path / "data")) == sorted(os.listdir(data)) and tree.idle_state() == "clean"


def test_recovery_leaves_a_first_checkout_cut_short_to_the_nights_checkout(repo: Path, tmp_path: Path) -> None:
    """A worktree whose first checkout a cancel or a kill cut short (no index, some files written) holds nothing of
    anyone's: recovery leaves it, rather than check every file out only to clean it, uncancellable, and the night's
    ensure checks it out whole."""
    config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                      tasks=[{"name": "fix", "prompt": "p", "check": "true"}]))
    path = config.state_dir / "worktrees" / "fix"
    path.parent.mkdir(parents=True)
    git(repo, "worktree", "add", "-q", "--no-checkout", "-b", "overnight/fix", str(path), "HEAD")
    (path / "greet.py").write_text("def gr")  # cut off mid-file
    (repo / ".git" / "worktrees" / "fix" / "index.lock").write_text("")  # a killed git's
    assert [e["event"] for e in recovery_logs(config) if e.get("task") == "fix"] == ["git_lock_removed"]
    assert (path / "greet.py").read_text() == "def gr" and not (repo / ".git" / "worktrees" / "fix" / "index.lock").exists()
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    assert (tree.path / "greet.py").read_text() == SAMPLE_FILES["greet.py"] and tree.idle_state() == "clean"
    assert git(repo, "branch", "--list", "overnight-kept/*") == ""


def test_a_state_dir_inside_the_checkout_stays_out_of_git_status(repo: Path) -> None:
    """The state dir is excluded in .git/info/exclude (never a tracked file) when a worktree is made in it, and stays so."""
    state = repo / ".overnight"
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    (state / "notes.md").write_text("notes\n")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert Worktree.ensure(repo, state, "fix", "HEAD").path == tree.path
    assert Worktree.ensure(repo, state, "other", "HEAD").path != tree.path
    assert (repo / ".git" / "info" / "exclude").read_text().splitlines().count("/.overnight/") == 1
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_state_dir_inside_a_linked_checkout_stays_out_of_its_git_status(repo: Path, tmp_path: Path) -> None:
    """The user's checkout is itself a linked worktree (`git worktree add ../wt`): git reads
    info/exclude from the common dir, so that is where the state dir's line must go."""
    linked = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    state = linked / ".overnight"
    Worktree.ensure(linked, state, "fix", "HEAD")
    (state / "notes.md").write_text("notes\n")
    assert git(linked, "status", "--porcelain", "--untracked-files=all") == ""
    assert not (repo / ".git" / "worktrees" / "wt" / "info" / "exclude").exists()


def test_an_exclude_file_in_another_encoding_is_appended_to_as_it_is(repo: Path) -> None:
    """.git/info/exclude is the user's file: a line in latin-1 stays byte for byte, and ours is added once."""
    exclude = repo / ".git" / "info" / "exclude"
    exclude.parent.mkdir(exist_ok=True)
    exclude.write_bytes(b"# r\xe9sum\xe9 builds\n/build/")
    state = repo / ".overnight"
    Worktree.ensure(repo, state, "fix", "HEAD")
    Worktree.ensure(repo, state, "other", "HEAD")
    assert exclude.read_bytes() == b"# r\xe9sum\xe9 builds\n/build/\n/.overnight/\n"


def test_an_exclude_file_that_is_a_link_is_left_as_it_is(repo: Path, tmp_path: Path) -> None:
    """.git/info/exclude a symbolic link to a file outside the git dir: the state dir's line is not written through it."""
    outside = tmp_path / "shared-excludes"
    outside.write_bytes(b"*.log\n")
    exclude = repo / ".git" / "info" / "exclude"
    exclude.unlink(missing_ok=True)
    exclude.symlink_to(outside)
    tree = Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
    assert tree.idle_state() == "clean" and outside.read_bytes() == b"*.log\n" and exclude.is_symlink()


def test_two_processes_making_the_state_dir_at_once_write_its_line_once(repo: Path) -> None:
    """Two commands that make the state dir at the same moment (two `overnight gc` from two crontab lines) each read
    info/exclude without the line and appended it: it was there twice in about one try in three."""
    import multiprocessing

    from orchestrator.state_dir_exclude import exclude_state_dir

    exclude = repo / ".git" / "info" / "exclude"
    forked = multiprocessing.get_context("fork")

    def write_line(start) -> None:
        start.wait()
        exclude_state_dir(open_repo(repo), repo / ".overnight")

    for _ in range(60):
        exclude.write_bytes(b"# mine\n")
        start = forked.Barrier(2)
        writers = [forked.Process(target=write_line, args=(start,)) for _ in range(2)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(timeout=30)
        assert [writer.exitcode for writer in writers] == [0, 0]
        assert exclude.read_bytes() == b"# mine\n/.overnight/\n"


def test_a_repository_under_a_folder_name_that_is_not_utf8(tmp_path: Path) -> None:
    """Linux names are bytes; git writes the worktree's links in them, and they are read back as the file system's."""
    repo = make_repo(tmp_path / os.fsdecode(b"caf\xe9") / "repo", SAMPLE_FILES)
    state = repo.parent / "state"
    tree = Worktree.ensure(repo, state, "fix", "HEAD")
    assert Worktree.ensure(repo, state, "fix", "HEAD").path == tree.path  # found registered, from its link files
    before = tree.checkpoint()
    (tree.path / "new.txt").write_text("x\n")
    assert tree.commit("add new.txt") != before and tree.idle_state() == "clean"


def test_commits_are_unsigned_and_run_none_of_the_users_hooks(repo: Path, tmp_path: Path) -> None:
    """A user who signs every commit, with hooks after and around commits and a file-system monitor:
    the agent's commit is made, unsigned (gpg would fail or wait for a passphrase), and no hook runs unattended."""
    git(repo, "config", "commit.gpgsign", "true")
    git(repo, "config", "user.signingkey", "0000DEADBEEF0000")
    ran = tmp_path / "hooks-ran"
    for hook in ("prepare-commit-msg", "post-commit", "fsmonitor"):
        script = repo / ".git" / "hooks" / hook
        script.parent.mkdir(exist_ok=True)
        script.write_text(f"#!/bin/sh\necho {hook} >> {ran}\nexit 1\n" if hook == "fsmonitor" else f"#!/bin/sh\necho {hook} >> {ran}\n")
        script.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(repo / ".git" / "hooks" / "fsmonitor"))
    ran.unlink(missing_ok=True)  # the git calls above ran the monitor in the user's own checkout, as they should
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    before = tree.checkpoint()
    (tree.path / "new.txt").write_text("x\n")
    after = tree.commit("add new.txt")
    assert after != before and tree.idle_state() == "clean"
    assert git(repo, "log", "-1", "--format=%an %G?", after) == "overnight N"
    assert not ran.exists()


def test_checkpoint_reads_the_same_commit_git_does(repo: Path, tmp_path: Path) -> None:
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    assert tree.checkpoint() == git(tree.path, "rev-parse", "HEAD")
    (tree.path / "a.txt").write_text("a\n")
    tree.commit("one")
    git(repo, "pack-refs", "--all")  # refs moved into packed-refs are still found
    assert tree.checkpoint() == git(tree.path, "rev-parse", "HEAD")
    # HEAD through a symbolic ref to the branch, then detached: read as git reads them.
    git(tree.path, "symbolic-ref", "refs/heads/alias", "refs/heads/overnight/fix")
    git(tree.path, "symbolic-ref", "HEAD", "refs/heads/alias")
    assert tree.checkpoint() == git(tree.path, "rev-parse", "HEAD") == git(repo, "rev-parse", "overnight/fix")
    git(tree.path, "checkout", "--quiet", "--detach", "HEAD~1")
    assert tree.checkpoint() == git(tree.path, "rev-parse", "HEAD") == git(repo, "rev-parse", "overnight/fix~1")


def test_a_branch_with_no_commit_is_no_checkpoint(repo: Path, tmp_path: Path) -> None:
    """HEAD naming a branch that has no commit (the agent's `git checkout --orphan`) is a one-line StateError."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    git(tree.path, "checkout", "--quiet", "--orphan", "nothing-yet")
    with pytest.raises(StateError, match="has no commit checked out"):
        tree.checkpoint()


def test_many_threads_sharing_one_repository_all_get_their_worktree(repo: Path, tmp_path: Path) -> None:
    """`git worktree add` is not safe twice at once; ensure serialises it, so eight at once all land."""
    state = tmp_path / "state"
    shared = open_repo(repo)
    made: dict[str, Worktree] = {}
    errors: list[BaseException] = []

    def make(task: str) -> None:
        try:
            made[task] = Worktree.ensure(repo, state, task, "HEAD", repo=shared)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    listed = git(repo, "worktree", "list", "--porcelain")
    for task, tree in made.items():
        assert f"worktree {tree.path.resolve()}" in listed
        assert tree.idle_state() == "clean" and (tree.path / "greet.py").exists()
    assert len(made) == 8


def test_the_users_checkout_is_untouched(repo: Path, tmp_path: Path) -> None:
    before = git(repo, "status", "--porcelain"), git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    tree = Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
    (tree.path / "x.txt").write_text("x\n")
    tree.commit("x")
    assert (git(repo, "status", "--porcelain"), git(repo, "rev-parse", "--abbrev-ref", "HEAD")) == before


def test_commit_of_nothing_is_the_checkpoint_and_of_something_a_new_commit(repo: Path, tmp_path: Path) -> None:
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    start = tree.checkpoint()
    assert tree.commit("nothing changed") == start
    (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
    (tree.path / "new.txt").write_text("new\n")
    made = tree.commit("overnight: fix iteration 1")
    assert made != start and git(tree.path, "rev-parse", "HEAD~1") == start
    assert git(tree.path, "log", "-1", "--format=%an %s") == "overnight overnight: fix iteration 1"
    assert tree.idle_state() == "clean"


def test_commit_takes_what_the_agent_staged_itself(repo: Path, tmp_path: Path) -> None:
    """Changes the agent already staged with `git add` (so the final add stages nothing more) are committed."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    start = tree.checkpoint()
    (tree.path / "staged.txt").write_text("staged by the agent\n")
    git(tree.path, "add", "staged.txt")
    made = tree.commit("overnight: fix iteration 1")
    assert made != start and git(tree.path, "show", "--name-only", "--format=", "HEAD") == "staged.txt"
    assert tree.idle_state() == "clean"


def test_commit_of_a_file_rewritten_with_its_own_content_or_staged_back_is_no_change(repo: Path, tmp_path: Path) -> None:
    """A file written again with the same bytes, or changed, staged, then changed back, is no change: HEAD stays."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    start = tree.checkpoint()
    same = (tree.path / "greet.py").read_bytes()
    (tree.path / "greet.py").write_bytes(same)
    assert tree.commit("rewritten") == start
    (tree.path / "greet.py").write_text("changed\n")
    git(tree.path, "add", "greet.py")
    (tree.path / "greet.py").write_bytes(same)
    assert tree.commit("changed back") == start and tree.idle_state() == "clean"


def test_a_commit_that_fails_for_another_reason_is_raised(repo: Path, tmp_path: Path) -> None:
    """A branch git cannot update (a lock left by a killed git) is an error, not "no change"."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    common = Path(git(tree.path, "rev-parse", "--git-common-dir"))
    common = common if common.is_absolute() else tree.path / common
    (common / "refs" / "heads" / "overnight" / "fix.lock").write_text("")
    (tree.path / "new.txt").write_text("work\n")
    with pytest.raises(gitpython.GitCommandError):
        tree.commit("overnight: fix iteration 1")


@pytest.mark.parametrize("left_by_the_agent", ["rebase stopped half way", "another branch", "a detached HEAD"])
def test_rollback_puts_the_task_branch_back_whatever_git_the_agent_ran(repo: Path, tmp_path: Path, left_by_the_agent: str) -> None:
    """`reset --hard` alone leaves a rebase in progress and HEAD where the agent moved it; later commits would miss the branch."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    checkpoint = tree.checkpoint()
    (tree.path / "a.txt").write_text("1\n")
    git(tree.path, "add", "a.txt")
    git(tree.path, "commit", "-qm", "agent 1")
    if left_by_the_agent == "rebase stopped half way":
        subprocess.run(["git", "rebase", "-q", "-i", checkpoint], cwd=tree.path, check=True,
                       env={**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i 's/^pick/edit/'"}, capture_output=True)
    elif left_by_the_agent == "another branch":
        git(tree.path, "checkout", "-q", "-b", "elsewhere")
    else:
        git(tree.path, "checkout", "-q", "--detach", "HEAD")
    tree.rollback(checkpoint)
    assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix"
    assert git(tree.path, "rev-parse", "HEAD") == checkpoint and tree.idle_state() == "clean"
    assert "rebase" not in git(tree.path, "status")
    (tree.path / "b.txt").write_text("2\n")
    made = tree.commit("overnight: fix iteration 2")
    assert git(repo, "rev-parse", "overnight/fix") == made != checkpoint


def test_a_gitmodules_entry_left_after_a_submodule_was_vendored_in_deletes_nothing(repo: Path, tmp_path: Path) -> None:
    """A submodule turned into plain tracked files, its .gitmodules entry left behind: the rollback took the
    folder for an empty submodule and emptied it, and the next commit recorded the deletion (a review)."""
    (repo / ".gitmodules").write_text('[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = https://example.com/lib.git\n')
    (repo / "vendor" / "lib").mkdir(parents=True)
    (repo / "vendor" / "lib" / "lib.py").write_text("x = 1\n")
    git(repo, "add", ".gitmodules", "vendor")
    git(repo, "commit", "-q", "-m", "vendored lib")
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
    checkpoint = tree.checkpoint()
    (tree.path / "a.py").write_text("y = 2\n")
    tree.rollback(checkpoint)
    assert (tree.path / "vendor" / "lib" / "lib.py").read_text() == "x = 1\n"
    (tree.path / "a.py").write_text("y = 2\n")
    commit = tree.commit("overnight: fix iteration 1")
    assert git(repo, "diff", "--name-status", checkpoint, commit) == "A\ta.py"


def test_an_idle_worktree_holding_only_kept_build_output_is_left_as_it_is(repo: Path, tmp_path: Path) -> None:
    """Ignored files under a `[repo] keep` path are no change: recovery neither keeps nor cleans anything (a big
    build folder cost seconds of both, every night); ignored files a rollback removes are cleaned, nothing kept."""
    (repo / ".gitignore").write_text("build/\n__pycache__/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignore build output")
    config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                      tasks=[{"name": "fix", "prompt": "p", "check": "true"}],
                                      extra=""))
    config = config.model_copy(update={"repo": config.repo.model_copy(update={"keep": ("/build",)})})
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD", keep=("/build",))
    (tree.path / "build").mkdir()
    (tree.path / "build" / "out.o").write_text("object\n")

    def recover() -> list[str]:
        return [e["event"] for e in recovery_logs(config) if e.get("task") == "fix"]

    assert tree.idle_state() == "clean" and recover() == []
    assert (tree.path / "build" / "out.o").exists()
    (tree.path / "__pycache__").mkdir()
    (tree.path / "__pycache__" / "m.pyc").write_text("x")
    assert tree.idle_state() == "ignored" and recover() == ["worktree_cleaned"]
    assert not (tree.path / "__pycache__").exists() and (tree.path / "build" / "out.o").exists()
    assert git(repo, "branch", "--list", "overnight-kept/*") == ""


@pytest.mark.parametrize("hide", ["--skip-worktree", "--assume-unchanged"])
def test_a_persons_edit_hidden_from_git_status_in_an_idle_worktree_is_kept_by_recovery(repo: Path, tmp_path: Path, hide: str) -> None:
    """An idle worktree whose only change is a person's edit to a file they hid from `git status` is "changed": recovery
    keeps the edit on an `overnight-kept/` branch before it cleans the worktree, as it keeps any other edit."""
    config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                      tasks=[{"name": "fix", "prompt": "p", "check": "true"}], extra=""))
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    git(tree.path, "update-index", hide, "greet.py")
    (tree.path / "greet.py").write_text("my local edit\n")

    assert tree.idle_state() == "changed"
    recovery_logs(config)
    kept = git(repo, "branch", "--list", "--format=%(refname:short)", "overnight-kept/*").strip()
    assert kept and git(repo, "show", f"{kept}:greet.py") == "my local edit"


def test_large_files_the_agent_staged_or_committed_itself(repo: Path, tmp_path: Path) -> None:
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    for command in ("git add dump.bin", "git add dump.bin && git commit -qm wip"):
        checkpoint = tree.checkpoint()
        (tree.path / "dump.bin").write_bytes(os.urandom(3_000_000))
        subprocess.run(command, shell=True, cwd=tree.path, check=True, env={**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
                                                                          "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"})
        with pytest.raises(QualityError):
            tree.commit("x", onto=checkpoint, max_file_bytes=1_000_000)
        tree.rollback(checkpoint)


def test_a_tracked_large_file_moved_or_made_executable_is_no_new_weight(repo: Path, tmp_path: Path) -> None:
    (repo / "data.bin").write_bytes(os.urandom(2_000_000))
    git(repo, "add", "data.bin")
    git(repo, "commit", "-qm", "data")
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    (tree.path / "data.bin").chmod(0o755)
    os.rename(tree.path / "data.bin", tree.path / "moved.bin")
    assert tree.commit("move", onto=checkpoint, max_file_bytes=1_000_000) != checkpoint


def test_a_large_file_the_agent_committed_and_removed_again_does_not_go_with_the_branch(repo: Path, tmp_path: Path) -> None:
    """Its blob is in the agent's first commit: the branch (and what CI pushes) would carry it."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    (tree.path / "dump.bin").write_bytes(os.urandom(3_000_000))
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    subprocess.run("git add dump.bin && git commit -qm wip && git rm -q dump.bin && git commit -qm gone", shell=True, cwd=tree.path,
                   check=True, env=env)
    with pytest.raises(QualityError, match="dump.bin"):
        tree.commit("x", onto=checkpoint, max_file_bytes=1_000_000)
    tree.rollback(checkpoint)
    (tree.path / "small.txt").write_text("x\n")  # commits of the agent's with small files still stay
    subprocess.run("git add small.txt && git commit -qm small", shell=True, cwd=tree.path, check=True, env=env)
    made = tree.commit("x", onto=checkpoint, max_file_bytes=1_000_000)
    assert git(tree.path, "rev-list", "--count", f"{checkpoint}..{made}") == "1"


def test_a_tracked_file_grown_past_the_limit_is_refused_and_one_of_exactly_the_limit_is_not(repo: Path, tmp_path: Path) -> None:
    """`max_file_mb` refuses a file larger than the limit, a tracked one the agent overwrote with a dump too
    (a fixture rewritten as a 3 MB CSV); a file of exactly the limit is committed."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    (tree.path / "greet.py").write_bytes(b"x" * 3_000_000)
    with pytest.raises(QualityError, match="greet.py"):
        tree.commit("x", onto=checkpoint, max_file_bytes=1_000_000)
    tree.rollback(checkpoint)
    (tree.path / "exact.bin").write_bytes(b"y" * 1_000_000)
    assert tree.commit("x", onto=checkpoint, max_file_bytes=1_000_000) != checkpoint
    (tree.path / "over.bin").write_bytes(b"z" * 1_000_001)
    with pytest.raises(QualityError, match="over.bin"):
        tree.commit("x", max_file_bytes=1_000_000)


def test_rollback_removes_a_repository_the_agent_made_inside_the_worktree(repo: Path, tmp_path: Path) -> None:
    """`git clean -fd` skips a nested repository (`git init scratch`, a clone): it would outlive the rollback."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    git(tree.path, "init", "-q", "scratch")
    (tree.path / "scratch" / "notes.txt").write_text("the agent's\n")
    tree.rollback(checkpoint)
    assert not (tree.path / "scratch").exists() and tree.idle_state() == "clean"


@pytest.mark.parametrize("nested", ["with a commit", "with no commit yet"])
def test_a_commit_leaves_out_a_repository_the_agent_made_inside_the_worktree(repo: Path, tmp_path: Path, nested: str) -> None:
    """`git init lib` or a `git clone` into the worktree, beside real work: the commit recorded a link to the nested
    repository's commit (which exists in that folder alone) on the task's branch, or, with no commit there yet,
    failed the whole add (`does not have a commit checked out`), losing the work. Left out, as kept branches leave it."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    lib = tree.path / "li[b]"  # a name that is a glob pattern matches itself only
    git(tree.path, "init", "-q", str(lib))
    (lib / "mod.py").write_text("x = 1\n")
    if nested == "with a commit":
        git(lib, "add", "mod.py")
        git(lib, "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "the agent's own repository")
    (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
    commit = tree.commit("overnight: fix iteration 1", onto=checkpoint)
    assert git(repo, "diff", "--name-status", checkpoint, commit) == "M\tgreet.py"
    tree.rollback(commit)
    assert not lib.exists() and tree.idle_state() == "clean"


def test_commits_a_person_made_on_the_worktrees_detached_head_are_kept_on_a_branch(repo: Path, tmp_path: Path) -> None:
    """A person detached the task's worktree and committed there; putting HEAD back on the task's branch keeps
    those commits on `overnight-kept/<task>/<time>` instead of leaving them to the reflog."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    tip = tree.checkpoint()
    git(tree.path, "checkout", "-q", "--detach")
    (tree.path / "review.txt").write_text("the person's\n")
    git(tree.path, "add", "review.txt")
    git(tree.path, "-c", "user.name=p", "-c", "user.email=p@x", "commit", "-qm", "the person's commit")
    person = git(tree.path, "rev-parse", "HEAD")
    Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    [kept] = git(repo, "branch", "--list", "overnight-kept/fix/*", "--format=%(refname:short)").splitlines()
    assert git(repo, "rev-parse", kept) == person
    assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix" and git(tree.path, "rev-parse", "HEAD") == tip


def test_keeping_changes_of_a_worktree_with_none_makes_no_branch(repo: Path, tmp_path: Path) -> None:
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    assert tree.keep_changes("overnight-kept/fix/now", "kept") is None
    assert git(repo, "branch", "--list", "overnight-kept/*") == ""


@pytest.mark.parametrize("how", ["relative link", "locked, folder unmounted"])
def test_a_checkout_of_the_branch_beside_the_worktree_is_seen_however_registered(repo: Path, tmp_path: Path, how: str) -> None:
    from orchestrator.task_branches import BranchCheckedOut

    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    review = tmp_path / "review"
    git(repo, "worktree", "add", "-q", "-f", str(review), "overnight/fix")
    admin = repo / ".git" / "worktrees" / "review"
    if how == "relative link":  # as git >= 2.48 writes it with worktree.useRelativePaths
        (admin / "gitdir").write_text(os.path.relpath(review / ".git", admin) + "\n")
    else:
        git(repo, "worktree", "lock", str(review))
        review.rename(tmp_path / "elsewhere")
    with pytest.raises(BranchCheckedOut):
        tree.back_on_branch("fix")


class TestCommitBesideAKeptFolder:
    """A commit leaves out new files under `[repo] keep` paths at a cost that does not grow with their number."""

    def test_a_commit_beside_a_30000_file_kept_venv_takes_seconds_not_tens(self, repo: Path, tmp_path: Path) -> None:
        """A .venv of 30,000 new files under `keep` (a check's, not in .gitignore): the commit takes the fix and no
        file of the .venv, in well under the seconds one exclusion per file cost git (each path matched against each)."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD", keep=(".venv",))
        for i in range(30000):
            folder = tree.path / ".venv" / "lib" / f"pkg{i // 500}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"m{i}.py").write_bytes(b"")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        start = time.perf_counter()
        tree.commit("overnight: fix iteration 1")
        took = time.perf_counter() - start
        assert git(tree.path, "diff", "--name-only", "HEAD~1", "HEAD").splitlines() == ["greet.py"]
        assert took < 4.0, f"a commit beside a 30,000-file kept .venv took {took:.1f}s"

    def test_work_beside_kept_files_in_one_folder_is_committed(self, repo: Path, tmp_path: Path) -> None:
        """Kept files in a folder that also holds work (a tracked file changed, a new file outside `keep`) are
        left out one by one, the work committed; a folder of kept files alone is left out whole."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD", keep=("*.log", "/cache"))
        (tree.path / "logs").mkdir()
        (tree.path / "logs" / "run.log").write_text("kept\n")
        (tree.path / "logs" / "summary.txt").write_text("work\n")
        (tree.path / "out" / "deep").mkdir(parents=True)
        (tree.path / "out" / "deep" / "all.log").write_text("kept\n")
        (tree.path / "cache").mkdir()
        (tree.path / "cache" / "c.bin").write_text("kept\n")
        (tree.path / "greet.log").write_text("kept\n")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        tree.commit("overnight: fix iteration 1")
        committed = git(tree.path, "diff", "--name-only", "HEAD~1", "HEAD").splitlines()
        assert committed == ["greet.py", "logs/summary.txt"]
        assert (tree.path / "cache" / "c.bin").exists() and (tree.path / "out" / "deep" / "all.log").exists()


class TestIdleWorktreeWithAKeptVenv:
    """An idle worktree whose only new files lie under `[repo] keep` holds no change."""

    def test_a_kept_venv_not_in_gitignore_is_no_change_to_keep_or_clean(self, repo: Path, tmp_path: Path) -> None:
        """A check's .venv under `keep`, not named in .gitignore: recovery keeps no branch of it and cleans
        nothing (it judged the worktree changed every night: a keep commit of nothing and a rollback, seconds in
        a large project, logged as `worktree_cleaned`); a new file of a person's beside it is still kept."""
        config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                          tasks=[{"name": "fix", "prompt": "p", "check": "true"}]))
        config = config.model_copy(update={"repo": config.repo.model_copy(update={"keep": (".venv",)})})
        tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD", keep=(".venv",))
        (tree.path / ".venv" / "bin").mkdir(parents=True)
        (tree.path / ".venv" / "bin" / "python").write_text("#!/bin/sh\n")

        def recover() -> list[str]:
            return [e["event"] for e in recovery_logs(config) if e.get("task") == "fix"]

        assert tree.idle_state() == "clean" and recover() == []
        assert (tree.path / ".venv" / "bin" / "python").exists()
        (tree.path / "review.txt").write_text("a person's note\n")
        assert tree.idle_state() == "changed" and recover() == ["worktree_changes_kept", "worktree_cleaned"]
        assert not (tree.path / "review.txt").exists() and (tree.path / ".venv" / "bin" / "python").exists()


class TestKeepingAPersonsChanges:
    """Keeping an idle worktree's changes commits exactly the person's work, at a cost that grows with the files only once."""

    def test_the_kept_commit_holds_the_work_and_leaves_out_what_a_rollback_spares(self, repo: Path, tmp_path: Path) -> None:
        """The kept branch's commit, on top of HEAD, holds the changed, deleted and new files (a name with glob characters,
        a tracked file become a folder) and none under `keep`, ignored or in a nested repository; the worktree and its
        index are left as they were."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD", keep=(".venv",))
        head = git(tree.path, "rev-parse", "HEAD")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        (tree.path / "check_greet.py").unlink()
        (tree.path / "check_greet.py").mkdir()
        (tree.path / "check_greet.py" / "inside.txt").write_text("a file where a file was\n")
        (tree.path / "notes").mkdir()
        (tree.path / "notes" / "*[a].txt").write_text("glob characters, taken literally\n")
        (tree.path / "notes" / "a.txt").write_text("the other one\n")
        (tree.path / ".venv" / "bin").mkdir(parents=True)
        (tree.path / ".venv" / "bin" / "python").write_text("kept out\n")
        (tree.path / "greet.pyc").write_bytes(b"ignored")
        (tree.path / "scratch").mkdir()
        git(tree.path / "scratch", "init", "-q")
        (tree.path / "scratch" / "x.txt").write_text("a nested repository's\n")
        status = git(tree.path, "status", "--porcelain", "--untracked-files=all")

        kept = tree.keep_changes("overnight-kept/fix/now", "kept")

        assert kept is not None and git(repo, "rev-parse", "overnight-kept/fix/now") == kept
        assert git(repo, "rev-parse", f"{kept}^") == head and git(repo, "log", "--format=%s", "-1", kept) == "kept"
        assert git(repo, "ls-tree", "-r", "--name-only", kept).splitlines() == [
            ".gitignore", "check_greet.py/inside.txt", "greet.py", "notes/*[a].txt", "notes/a.txt",
        ]
        assert git(repo, "show", f"{kept}:notes/*[a].txt") == "glob characters, taken literally"
        assert git(tree.path, "status", "--porcelain", "--untracked-files=all") == status
        assert git(tree.path, "rev-parse", "HEAD") == head

    def test_a_new_file_gone_before_git_reads_it_is_passed_over(self, repo: Path, tmp_path: Path) -> None:
        """A new file deleted between git's listing and its reading (an editor's swap file) is left out, the other new
        files kept: no StateError, which stops the night."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        # The clean filter of the file read first deletes the one read last: the race, made certain.
        git(repo, "config", "filter.vanish.clean", "rm -f z.swp; cat")
        (tree.path / ".gitattributes").write_text("a.txt filter=vanish\n")
        (tree.path / "a.txt").write_text("kept\n")
        (tree.path / "z.swp").write_text("an editor's, gone in a moment\n")

        kept = tree.keep_changes("overnight-kept/fix/now", "kept")

        assert kept is not None and not (tree.path / "z.swp").exists()
        assert git(repo, "ls-tree", "-r", "--name-only", kept).splitlines() == [
            ".gitattributes", ".gitignore", "a.txt", "check_greet.py", "greet.py",
        ]

    def test_a_new_file_on_a_case_insensitive_disk_joins_the_folder_git_knows(self, repo: Path, tmp_path: Path) -> None:
        """With core.ignorecase (macOS, Windows), a new file under "lib/" where the commit has "Lib/" is kept under
        "Lib/", as `git add` files it, not in a second folder such a disk cannot tell from the first."""
        (repo / "Lib").mkdir()
        (repo / "Lib" / "old.py").write_text("old\n")
        git(repo, "add", "Lib")
        git(repo, "commit", "-q", "-m", "Lib")
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        git(repo, "config", "core.ignorecase", "true")
        (tree.path / "lib").mkdir()  # a case-insensitive disk's "Lib/", as this one cannot have it
        (tree.path / "lib" / "new.py").write_text("new\n")

        kept = tree.keep_changes("overnight-kept/fix/now", "kept")

        assert kept is not None
        assert [name for name in git(repo, "ls-tree", "-r", "--name-only", kept).splitlines() if name.lower().startswith("lib/")] == [
            "Lib/new.py", "Lib/old.py",
        ]

    @pytest.mark.parametrize("ignorecase", ["false", "true"], ids=["case-sensitive", "case-insensitive (macOS)"])
    def test_twenty_thousand_new_files_cost_git_no_time_per_pair(self, repo: Path, tmp_path: Path, ignorecase: str) -> None:
        """20,000 new files of a person's are kept whole in well under the CPU seconds `git add` spent matching each
        file against every other's pathspec (3.7 s on a 2-core machine; about 0.25 s taken one by one), on a
        case-insensitive disk too where no folder's case differs from the commit's."""
        import resource

        git(repo, "config", "core.ignorecase", ignorecase)
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        for i in range(20000):
            folder = tree.path / "notes" / f"d{i // 500}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"n{i}.txt").write_bytes(b"%d\n" % i)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        kept = tree.keep_changes("overnight-kept/fix/now", "kept")
        git_cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
        assert kept is not None and len(git(repo, "ls-tree", "-r", "--name-only", kept).splitlines()) == 20000 + len(SAMPLE_FILES)
        assert git_cpu < 1.5, f"keeping 20,000 new files took git {git_cpu:.1f}s of CPU"


class TestPassedSecretsKeptOutOfACommit:
    PASSWORD = "Db-Pass-0123456789xyz"

    def secrets(self):
        from orchestrator.passed_secrets import PassedSecrets

        return PassedSecrets({self.PASSWORD.encode(): ("DB_PASSWORD",)})

    def test_a_deleted_empty_file_is_not_put_back_for_an_empty_file_named_after_the_value(self, repo: Path, tmp_path: Path) -> None:
        """The agent deletes an empty __init__.py and its check leaves an empty cache named after the value: git pairs the two
        as a rename, yet the deletion stays in the commit (only the cache is kept out)."""
        (repo / "pkg").mkdir()
        (repo / "pkg" / "__init__.py").write_text("")
        git(repo, "add", "pkg")
        git(repo, "commit", "-q", "-m", "package")
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        checkpoint = worktree.checkpoint()
        (worktree.path / "pkg" / "__init__.py").unlink()
        (worktree.path / f"{self.PASSWORD}.cache").write_text("")
        worktree.commit("overnight: fix-greet iteration 1", onto=checkpoint, secrets=self.secrets())
        assert "pkg/__init__.py" not in git(repo, "ls-tree", "-r", "--name-only", "overnight/fix-greet").splitlines()
        assert not (worktree.path / "pkg" / "__init__.py").exists()

    def test_a_deleted_file_like_a_log_holding_the_value_is_not_put_back(self, repo: Path, tmp_path: Path) -> None:
        """The agent deletes obsolete settings and its check writes a log much like them plus the value: the log is kept
        out, and the settings stay deleted, git's rename pairing of the two notwithstanding."""
        settings = "".join(f"option_{number} = {number}\n" for number in range(40))
        (repo / "old_settings.ini").write_text(settings)
        git(repo, "add", "old_settings.ini")
        git(repo, "commit", "-q", "-m", "settings")
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        checkpoint = worktree.checkpoint()
        (worktree.path / "old_settings.ini").unlink()
        (worktree.path / "run.log").write_text(settings + f"password={self.PASSWORD}\n")
        worktree.commit("overnight: fix-greet iteration 1", onto=checkpoint, secrets=self.secrets())
        tree = git(repo, "ls-tree", "-r", "--name-only", "overnight/fix-greet").splitlines()
        assert "old_settings.ini" not in tree and "run.log" not in tree

    def test_a_file_moved_under_a_folder_named_after_the_value_and_edited_is_still_put_back(self, repo: Path, tmp_path: Path) -> None:
        """`git mv greet.py $VALUE/greet.py`, then an edit: the same file name elsewhere is a move, its source put back."""
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        checkpoint = worktree.checkpoint()
        before = (worktree.path / "greet.py").read_text()
        (worktree.path / self.PASSWORD).mkdir()
        git(worktree.path, "mv", "greet.py", f"{self.PASSWORD}/greet.py")
        with open(worktree.path / self.PASSWORD / "greet.py", "a") as moved:
            moved.write("# moved\n")
        worktree.commit("overnight: fix-greet iteration 1", onto=checkpoint, secrets=self.secrets())
        assert git(repo, "show", "overnight/fix-greet:greet.py") == before.rstrip("\n")

    @pytest.mark.parametrize("name", ["tab\there.py", "new\nline.py", os.fsdecode(b"caf\xe9.py"), "R", "C"])
    def test_a_file_of_any_name_moved_under_a_folder_named_after_the_value_is_put_back(
        self, repo: Path, tmp_path: Path, name: str
    ) -> None:
        """A tab, a newline, bytes not UTF-8, or a status letter as a moved file's name: each of git's rename entries is
        read source first, wherever it stands in the list, so every source is put back and the branch keeps the files
        where they were."""
        (repo / name).write_text("".join(f"option_{number} = {number}\n" for number in range(40)))
        git(repo, "add", "--", name)
        git(repo, "commit", "-q", "-m", "a file with an odd name")
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        checkpoint = worktree.checkpoint()
        (worktree.path / self.PASSWORD).mkdir()
        for moved in (name, "greet.py"):
            git(worktree.path, "mv", "--", moved, f"{self.PASSWORD}/{moved}")
        kept = []
        worktree.commit("overnight: fix-greet iteration 1", onto=checkpoint, secrets=self.secrets(), on_kept_out=kept.append)
        assert [out.paths for out in kept] == [tuple(sorted(f"{self.PASSWORD}/{moved}" for moved in (name, "greet.py")))]
        assert git(repo, "rev-parse", "overnight/fix-greet^{tree}") == git(repo, "rev-parse", f"{checkpoint}^{{tree}}")
        assert (worktree.path / name).exists() and not (worktree.path / self.PASSWORD).exists()

    def test_many_and_long_folded_subjects_still_commit_with_a_bounded_message(self, repo: Path, tmp_path: Path) -> None:
        """Folded commits whose subjects pass Linux's 128 KiB limit on one argument (a test log as a subject): the
        iteration still commits, listing the first hundred subjects, each cut after the redaction, and how many more."""
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        checkpoint = worktree.checkpoint()
        (worktree.path / ".env.test").write_text(f"DB_PASSWORD={self.PASSWORD}\n")
        git(worktree.path, "add", ".env.test")
        git(worktree.path, "commit", "-q", "-m", "wip")
        git(worktree.path, "rm", "-q", ".env.test")
        (tmp_path / "message").write_text(f"the log said {self.PASSWORD} " + "x" * 150_000)
        git(worktree.path, "commit", "-q", "-F", str(tmp_path / "message"))
        for number in range(150):
            git(worktree.path, "commit", "-q", "--allow-empty", "-m", f"step {number}")
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        worktree.commit("overnight: fix-greet iteration 1", onto=checkpoint, secrets=self.secrets())
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet").splitlines()
        listed = [line for line in message if line.startswith("- ")]
        assert listed[:2] == ["- wip", f"- the log said *** {'x' * 183}..."]
        assert len(listed) == 101 and listed[-1] == "- ... and 52 more"
        assert self.PASSWORD not in git(repo, "log", "-p", "--all")


def test_a_persons_edits_in_a_worktree_whose_index_was_lost_are_kept_before_the_checkout(repo: Path, tmp_path: Path) -> None:
    """A worktree checked out whole once (marked by its night) whose index a person, an agent or git deleted since is no
    first checkout cut short: recovery keeps the edits in it on a branch of their own, where the night's checkout of a
    worktree with no index (`reset --hard`) wiped them without a word."""
    config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo,
                                      tasks=[{"name": "fix", "prompt": "p", "check": "true"}]))
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")  # the morning's fix, by hand
    (tree.path / "notes.txt").write_text("to do\n")
    (repo / ".git" / "worktrees" / "fix" / "index").unlink()
    assert "worktree_changes_kept" in [e["event"] for e in recovery_logs(config) if e.get("task") == "fix"]
    [kept] = git(repo, "branch", "--list", "--format=%(refname:short)", "overnight-kept/fix/*").split()
    assert "'hello'" in git(repo, "show", f"{kept}:greet.py") and git(repo, "show", f"{kept}:notes.txt") == "to do"
    assert git(repo, "diff", "--name-only", "HEAD", kept).split() == ["greet.py", "notes.txt"]  # nothing seen as deleted
    tree = Worktree.ensure(repo, config.state_dir, "fix", "HEAD")
    assert tree.idle_state() == "clean"


def test_a_git_command_fed_stdin_is_fed_it_whole_when_it_may_be_cancelled(tmp_path: Path) -> None:
    """A command given a cancel token and stdin it reads slowly still gets every byte: communicate, called again after
    a poll's timeout, would not go on writing what was left (and refuses stdin given again: ValueError)."""
    from orchestrator.worktree_git import run_git

    git(tmp_path, "init", "-q")
    slow_reader = ("-c", "alias.count=!sleep 0.5; wc -c", "count")
    out = run_git(slow_reader, folder=tmp_path, admin=tmp_path / ".git", env={}, timeout_s=60, stdin=b"x" * 3_000_000, cancel=CancelToken())
    assert out.strip() == "3000000"


@pytest.mark.parametrize(("name", "shown"), [("a\\nb.bin", "a\\nb.bin"), ("a\nb.bin", "'a\\nb.bin'")])
def test_a_large_files_name_with_a_backslash_and_an_n_does_not_read_as_one_with_a_line_break(repo: Path, tmp_path: Path, name: str, shown: str) -> None:
    """The signal's message, which `report` and the step summary show, named both `a\\nb.bin` once its control
    characters were escaped: a name that is not printable is quoted as its repr, as an unknown tool's name is."""
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    checkpoint = tree.checkpoint()
    (tree.path / name).write_bytes(b"x" * 2_000)
    with pytest.raises(QualityError) as refused:
        tree.commit("x", onto=checkpoint, max_file_bytes=1_000)
    assert refused.value.message == f"file over 0.001 MB: {shown}"
    assert f"{shown} (2,000 bytes)" in refused.value.correction and refused.value.evidence == f"staged: {shown} (2,000 bytes)"
