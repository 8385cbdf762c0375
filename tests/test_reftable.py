"""Repositories that keep their refs in reftable (`git init --ref-format=reftable`, git >= 2.45): a night runs on
them as on the files backend, asking git where the by-hand readers would find no ref files.

The nights skip where this git makes no reftable repository (git < 2.45); the ref-storage classification runs
on any git."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.scripted import call
from tests.conftest import GIT_ENV, SAMPLE_FILES, git, make_repo
from tests.test_night import FIX, overnight, report_json, worktree


def _reftable_repo(path: Path) -> Path:
    made = subprocess.run(
        ["git", "init", "-q", "-b", "main", "--ref-format=reftable", str(path)],
        env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"this git makes no reftable repository: {(made.stderr.strip().splitlines() or [''])[0][:120]}")
    for name, content in SAMPLE_FILES.items():
        (path / name).write_text(content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The sample repository (greet() misspells 'hello'), its refs in reftable."""
    return _reftable_repo(tmp_path / "repo")


class TestRefStorageNamed:
    def test_a_config_naming_reftable_is_reftable(self):
        """`extensions.refStorage = reftable`, however git lets it be written, names reftable."""
        from orchestrator.ref_storage import ref_storage_named

        for config in (
            "[core]\n\trepositoryformatversion = 1\n[extensions]\n\trefStorage = reftable\n",
            "[Extensions]\nREFSTORAGE=\"reftable\" ; git 2.45\n",
            "[extensions] refstorage = reftable\n",
        ):
            assert ref_storage_named(config) == "reftable", config

    def test_a_config_naming_no_reftable_is_files(self):
        """No `extensions.refStorage`, one naming files, or the key under another section: the files backend."""
        from orchestrator.ref_storage import ref_storage_named

        for config in (
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n",
            "[extensions]\n\trefStorage = files\n",
            "[core]\n\trefStorage = reftable\n[extensions]\n\tobjectFormat = sha256\n",
            "",
        ):
            assert ref_storage_named(config) == "files", config

    def test_a_repository_is_told_by_its_reftable_folder_or_its_config(self, tmp_path):
        """A `reftable/` folder, or the config's extension alone, marks a repository reftable; a plain one is not."""
        from orchestrator.ref_storage import is_reftable

        by_folder, by_config, plain = (tmp_path / name for name in ("folder", "config", "plain"))
        for common in (by_folder, by_config, plain):
            common.mkdir()
            (common / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
        (by_folder / "reftable").mkdir()
        (by_config / "config").write_text("[core]\n\trepositoryformatversion = 1\n[extensions]\n\trefstorage = reftable\n")
        assert (is_reftable(by_folder), is_reftable(by_config), is_reftable(plain)) == (True, True, False)


class TestFilesBackendUnchanged:
    """The files backend (git < 2.45 knows no other) pays nothing for reftable, and a hostile one runs nothing."""

    def test_a_files_head_holding_the_placeholder_starts_no_git(self, tmp_path, monkeypatch):
        """`ref: refs/heads/.invalid` written into a files repository's HEAD is what that HEAD holds: read as the
        file says, no git process started (one was, for any HEAD holding those words)."""
        from orchestrator.branch_holders import head_file

        made = make_repo(tmp_path / "files", SAMPLE_FILES)
        (made / ".git" / "HEAD").write_text("ref: refs/heads/.invalid\n")
        started = _counting_git(tmp_path, monkeypatch)
        assert head_file(made / ".git") == "ref: refs/heads/.invalid"
        assert not started.exists(), started.read_text()

    def test_a_worktree_head_holding_the_placeholder_is_answered_at_once(self, tmp_path):
        """A linked worktree's HEAD holding the placeholder, its `commondir` a pipe (both the agent's to write): the
        file's words at once, nothing waiting on the pipe (git was started on it)."""
        from orchestrator.branch_holders import head_file

        made = make_repo(tmp_path / "files", SAMPLE_FILES)
        git(made, "worktree", "add", "-q", "-b", "overnight/t", str(tmp_path / "worktree"))
        admin = made / ".git" / "worktrees" / "worktree"
        (admin / "HEAD").write_text("ref: refs/heads/.invalid\n")
        (admin / "commondir").unlink()
        os.mkfifo(admin / "commondir")
        answers: list[str] = []
        asking = threading.Thread(target=lambda: answers.append(head_file(admin)), daemon=True)
        asking.start()
        asking.join(5)
        if asking.is_alive():
            os.close(os.open(admin / "commondir", os.O_WRONLY | os.O_NONBLOCK))
        assert answers == ["ref: refs/heads/.invalid"]

    def test_a_config_that_is_a_pipe_is_not_waited_on(self, tmp_path):
        """A pipe put where the config goes (`mkfifo .git/config`) is no reftable config: answered at once (the
        reading waited for ever for a writer)."""
        from orchestrator.ref_storage import is_reftable

        common = tmp_path / "git"
        common.mkdir()
        os.mkfifo(common / "config")
        answers: list[bool] = []
        asking = threading.Thread(target=lambda: answers.append(is_reftable(common)), daemon=True)
        asking.start()
        asking.join(5)
        if asking.is_alive():  # let the blocked open go, or the thread holds the pipe for the rest of the run
            os.close(os.open(common / "config", os.O_WRONLY | os.O_NONBLOCK))
        assert answers == [False]


def _counting_git(tmp_path: Path, monkeypatch) -> Path:
    """A `git` first on PATH that notes each start in the returned file, then runs the real one."""
    real = shutil.which("git")
    shims = tmp_path / "shims"
    shims.mkdir()
    started = tmp_path / "git-started"
    shim = shims / "git"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {started}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return started


class TestReadersAskGit:
    def test_head_and_branches_are_read_through_git(self, repo):
        """HEAD's commit, its branch and the branches are git's answers, not the `refs/heads/.invalid` HEAD file's."""
        import git as gitpython

        from orchestrator.branch_holders import head_file
        from orchestrator.gitdir import broken_head_ref, head_commit
        from orchestrator.ref_storage import branch_names, branch_tip, checked_out_branch

        dotgit = repo / ".git"
        assert (dotgit / "HEAD").read_text().strip() == "ref: refs/heads/.invalid"
        git(repo, "branch", "overnight/t")
        opened = gitpython.Repo(repo)
        tip = git(repo, "rev-parse", "HEAD")
        assert head_commit(dotgit, dotgit) == tip and broken_head_ref(dotgit, dotgit) is None
        assert head_file(dotgit) == "ref: refs/heads/main"
        assert (checked_out_branch(opened), branch_names(opened)) == ("main", {"main", "overnight/t"})
        assert (branch_tip(opened, "overnight/t"), branch_tip(opened, "gone")) == (tip, None)
        git(repo, "checkout", "-q", "--detach")
        assert (head_file(dotgit), checked_out_branch(opened)) == (tip, None)

    def test_a_registration_whose_folder_was_deleted_is_not_asked_about(self, repo, tmp_path, monkeypatch):
        """At each task's start the other checkouts' HEADs are asked of git; a registration whose folder was deleted
        (not pruned) holds nothing, and its HEAD is not asked (a git process for an answer thrown away)."""
        import shutil

        from orchestrator.branch_holders import also_held_elsewhere

        for name in ("ours", "deleted"):
            git(repo, "worktree", "add", "-q", "-b", f"overnight/{name}", str(tmp_path / name))
        shutil.rmtree(tmp_path / "deleted")
        common = repo / ".git"
        started = _counting_git(tmp_path, monkeypatch)
        assert also_held_elsewhere(common / "worktrees" / "ours", common, "overnight/deleted") is None
        assert "worktrees/deleted" not in started.read_text()

    def test_a_killed_commits_worktree_ref_lock_is_removed(self, repo):
        """The lock a killed git left on the worktree's own reftable stack is removed with its index.lock: every
        later commit there failed ("fatal: cannot lock references")."""
        from orchestrator.git_locks import remove_git_locks
        from orchestrator.logs import get_logger

        path = repo.parent / "worktree"
        git(repo, "worktree", "add", "-q", "-b", "overnight/t", str(path))
        lock = repo / ".git" / "worktrees" / "worktree" / "reftable" / "tables.list.lock"
        lock.touch()
        remove_git_locks(path, "t", get_logger())
        assert not lock.exists()
        git(path, "commit", "-q", "--allow-empty", "-m", "after the killed one")

    def test_git_asked_gets_overnights_own_environment(self, repo, monkeypatch):
        """An inherited `-c` setting (GIT_CONFIG_PARAMETERS: overnight started from a git hook or an alias) does not
        reach the git asked: git's answer, not "" (git refused the bogus setting, and HEAD read as nothing)."""
        import git as gitpython

        from orchestrator.branch_holders import head_file
        from orchestrator.ref_storage import checked_out_branch

        opened = gitpython.Repo(repo)
        monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.abbrev'='bogus'")
        assert (head_file(repo / ".git"), checked_out_branch(opened)) == ("ref: refs/heads/main", "main")

    def test_the_morning_diff_names_the_checked_out_branch(self, repo):
        """With `[repo] base = "HEAD"` the morning diff is against the branch checked out (it fell back to HEAD)."""
        from orchestrator.report_inputs import merge_target

        settings = SimpleNamespace(repo=SimpleNamespace(base="HEAD"), repo_path=repo)
        assert merge_target(settings) == "main"
        git(repo, "checkout", "-q", "-b", "overnight/t")
        assert merge_target(settings) == "main"  # a task's branch under review: the mainline


class TestNights:
    def test_a_night_commits_the_fix_and_the_report_names_it(self, config_file, server, repo, capsys):
        """`overnight run` works on a reftable repository (it exited 2, "has no commits yet"): the fix committed on
        the task's branch, the report names it and the diff against the checked-out branch."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["commit"]) == ("succeeded", git(repo, "rev-parse", "overnight/fix-greet"))
        assert overnight("report", "--config", str(config)) == 0
        text = capsys.readouterr().out
        assert "✔ fix-greet: succeeded" in text and "git diff main...overnight/fix-greet" in text

    def test_a_second_night_goes_on_from_the_branch_and_keeps_a_persons_edit(self, config_file, server, repo, capsys):
        """The next night reuses the worktree on the branch (it tried to make the branch again), a person's edit left
        in the worktree is kept on `overnight-kept/...`, and the report names that branch."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        first = git(repo, "rev-parse", "overnight/fix-greet")
        with (worktree(config) / "greet.py").open("a") as edited:
            edited.write("# a person's\n")
        server.enqueue(call("submit", {"summary": "already done"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/fix-greet") == first
        [kept] = git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/overnight-kept/").splitlines()
        assert "# a person's" in git(repo, "show", f"{kept}:greet.py")
        capsys.readouterr()
        assert overnight("report", "--config", str(config)) == 0
        assert f"git show {kept}" in capsys.readouterr().out

    def test_a_worktree_left_detached_is_put_back_on_its_branch(self, config_file, server, repo):
        """A person who detached the task's worktree (to check the branch out in their own) finds the next night's
        commit on the branch, the worktree back on it."""
        config = config_file()
        server.enqueue(call("submit", {"summary": "not yet"}))
        assert overnight("run", "--config", str(config)) == 1
        git(worktree(config), "checkout", "-q", "--detach")
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert git(worktree(config), "symbolic-ref", "HEAD") == "refs/heads/overnight/fix-greet"

    def test_a_worktree_deleted_by_hand_is_made_again_on_the_branch(self, config_file, server, repo):
        """A worktree folder a person deleted is added again on the task's branch, which is there (it was asked for
        anew with `-b`, which git refused: the branch exists)."""
        import shutil

        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        first = git(repo, "rev-parse", "overnight/fix-greet")
        shutil.rmtree(worktree(config))
        server.enqueue(call("submit", {"summary": "already done"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/fix-greet") == first
        assert "return 'hello'" in (worktree(config) / "greet.py").read_text()

    def test_a_killed_gits_lock_on_the_repositorys_ref_stack_does_not_stop_the_night(self, config_file, server, repo):
        """The lock a SIGKILLed git left on the main repository's reftable stack (`.git/reftable/tables.list.lock`) is
        removed before the night, as the worktree's own is: the fix is committed on the task's branch (every ref update
        failed, "cannot lock references", and the night made no branch)."""
        config = config_file()
        lock = repo / ".git" / "reftable" / "tables.list.lock"
        lock.write_bytes(b"0x000000000001-0x000000000002-0badf00d.ref\n")  # half written, as a kill leaves it
        os.utime(lock, (lock.stat().st_mtime - 3600,) * 2)  # left by last night's killed git
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert not lock.exists()


def _for_each_ref_failing_once(tmp_path: Path, monkeypatch, said: str = "fatal: reftable: unable to read the stack") -> Path:
    """A `git` first on PATH whose next listing of the branches fails (as a git timed out or refused would), while the
    returned file is there; every other command, and the listings after, run the real git."""
    real = shutil.which("git")
    shims = tmp_path / "failing-shims"
    shims.mkdir()
    armed = tmp_path / "fail-next-listing"
    shim = shims / "git"
    shim.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *for-each-ref*refs/heads/) if [ -e {armed} ]; then rm -f {armed}; '
        f"printf '%s\\n' '{said}' >&2; exit 128; fi;; esac\n"
        f'exec {real} "$@"\n'
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return armed


class TestBranchesGitCannotList:
    def test_a_failed_listing_is_no_empty_set(self, repo):
        """A repository whose branches git cannot list (its tables cut short, as a full disk leaves them: git 2.47
        dies on them) is BranchesUnknown with why: it read as a repository with no branch."""
        import git as gitpython

        from orchestrator.ref_storage import BranchesUnknown, branch_names

        opened = gitpython.Repo(repo)
        for table in (repo / ".git" / "reftable").glob("*.ref"):
            table.write_bytes(table.read_bytes()[:40])
        with pytest.raises(BranchesUnknown, match="git could not list the branches: "):
            branch_names(opened)

    def test_the_reason_is_gits_fatal_line_not_a_warning_before_it(self, repo, tmp_path, monkeypatch):
        """git's `fatal:` line is why the branches are unknown, also when a warning comes first (it named the warning)."""
        import git as gitpython

        from orchestrator.ref_storage import BranchesUnknown, branch_names

        said = "warning: ignoring broken ref refs/heads/x' 'fatal: reftable: unable to read the stack"
        _for_each_ref_failing_once(tmp_path, monkeypatch, said).touch()
        with pytest.raises(BranchesUnknown) as unknown:
            branch_names(gitpython.Repo(repo))
        assert unknown.value.reason == "git could not list the branches: fatal: reftable: unable to read the stack"

    def test_a_task_branch_git_could_not_list_is_not_deleted(self, config_file, server, repo, tmp_path, monkeypatch, capsys):
        """The task's branch holds an earlier night's work and a folder of a person's is where its worktree goes:
        git failing to list the branches is a one-line error (exit 2) naming why, the branch kept (read as "not
        there", the branch was taken as made by this night and deleted when the worktree could not be added)."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        work = git(repo, "rev-parse", "overnight/fix-greet")
        git(repo, "worktree", "remove", "--force", str(worktree(config)))
        worktree(config).mkdir()
        (worktree(config) / "notes.txt").write_text("a person's\n")
        _for_each_ref_failing_once(tmp_path, monkeypatch).touch()
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 2
        assert git(repo, "rev-parse", "overnight/fix-greet") == work
        err = capsys.readouterr().err
        assert "git could not list the branches: fatal: reftable: unable to read the stack" in err and "Traceback" not in err

    def test_the_morning_diff_names_the_mainline_when_git_cannot_list_the_branches(self, repo, tmp_path, monkeypatch):
        """A task's branch checked out for review, the branches not listed by git: the morning diff is still against
        `main` (it fell back to HEAD, the branch under review: `git diff overnight/t...overnight/t`, always empty)."""
        from orchestrator.report_inputs import merge_target

        settings = SimpleNamespace(repo=SimpleNamespace(base="HEAD"), repo_path=repo)
        git(repo, "checkout", "-q", "-b", "overnight/t")
        _for_each_ref_failing_once(tmp_path, monkeypatch).touch()
        assert merge_target(settings) == "main"


_UNREADABLE = "fatal: reftable: unable to read the stack"


def _git_failing(tmp_path: Path, monkeypatch, matching: str, said: str = _UNREADABLE) -> None:
    """A `git` first on PATH that dies as a git that cannot read the refs does (its `fatal:` line, exit 128) for each
    command whose arguments match the shell pattern `matching`; every other command runs the real git."""
    real = shutil.which("git")
    shims = tmp_path / "unreadable-shims"
    shims.mkdir()
    shim = shims / "git"
    shim.write_text(f"#!/bin/sh\ncase \"$*\" in {matching}) printf '%s\\n' '{said}' >&2; exit 128;; esac\nexec {real} \"$@\"\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")


def _tables_lost(repo: Path) -> None:
    """The repository's reftable tables gone, `tables.list` still naming them (a disk full mid-compaction, a partial
    restore): git 2.47 reads such a stack as one holding no ref at all, each question answered "none" (exit 1)."""
    for table in (repo / ".git" / "reftable").glob("*.ref"):
        table.unlink()


class TestRefsGitCannotRead:
    """A ref git cannot read (it dies with its `fatal:` line, or reads a stack it cannot load as empty) is
    RefsUnreadable, never "no such ref": read so, recovery rolled a task's branch back and a night made it anew."""

    def test_a_branch_git_dies_reading_is_no_missing_branch(self, repo, tmp_path, monkeypatch):
        """`rev-parse` dying (exit 128) on the task's branch is RefsUnreadable with git's `fatal:` line (it was None)."""
        import git as gitpython

        from orchestrator.ref_storage import RefsUnreadable, branch_tip

        git(repo, "branch", "overnight/t")
        _git_failing(tmp_path, monkeypatch, "*rev-parse*refs/heads/overnight/t*")
        with pytest.raises(RefsUnreadable) as unreadable:
            branch_tip(gitpython.Repo(repo), "overnight/t")
        assert unreadable.value.reason.endswith(f"refs/heads/overnight/t in {repo / '.git'}: {_UNREADABLE}")
        assert unreadable.value.exit_code == 2 and "\n" not in str(unreadable.value)

    def test_a_head_git_dies_reading_is_not_read_as_detached(self, repo, tmp_path, monkeypatch):
        """`symbolic-ref HEAD` dying is RefsUnreadable: the checkout was read as detached at HEAD's commit (off its
        branch: a person's, to the night) or, from the report, as on no branch."""
        import git as gitpython

        from orchestrator.branch_holders import head_file
        from orchestrator.ref_storage import RefsUnreadable, checked_out_branch

        _git_failing(tmp_path, monkeypatch, "*symbolic-ref*")
        with pytest.raises(RefsUnreadable, match=f"git could not read HEAD in .*: {_UNREADABLE}"):
            head_file(repo / ".git")
        with pytest.raises(RefsUnreadable):
            checked_out_branch(gitpython.Repo(repo))

    def test_a_stack_whose_tables_are_gone_is_no_empty_repository(self, repo):
        """Tables `tables.list` names but that are gone: git answers "none" to the branch (exit 1, nothing said) and
        lists no branch, and each reader here is RefsUnreadable, the listing BranchesUnknown (they read no branch, and
        HEAD as detached or as "")."""
        import git as gitpython

        from orchestrator.branch_holders import head_file
        from orchestrator.gitdir import head_commit
        from orchestrator.ref_storage import BranchesUnknown, RefsUnreadable, branch_names, branch_tip

        git(repo, "branch", "overnight/t")
        opened = gitpython.Repo(repo)
        _tables_lost(repo)
        dotgit = repo / ".git"
        for read in (lambda: branch_tip(opened, "overnight/t"), lambda: head_file(dotgit), lambda: head_commit(dotgit, dotgit)):
            with pytest.raises(RefsUnreadable, match=f"git could not read HEAD in {dotgit}: fatal: No such ref: HEAD"):
                read()
        with pytest.raises(BranchesUnknown, match="git could not list the branches: git could not read HEAD"):
            branch_names(opened)

    def test_a_reftable_folder_gone_is_no_empty_repository(self, repo):
        """The `reftable/` folder gone (a `git refs migrate` cut short), the config still naming reftable: the branch
        is RefsUnreadable (git answers "none", and it was read as a branch never made)."""
        import git as gitpython

        from orchestrator.ref_storage import RefsUnreadable, branch_tip

        git(repo, "branch", "overnight/t")
        opened = gitpython.Repo(repo)
        shutil.rmtree(repo / ".git" / "reftable")
        with pytest.raises(RefsUnreadable, match="git could not read HEAD in .*: it names neither a branch nor a commit"):
            branch_tip(opened, "overnight/t")

    def test_a_missing_branch_and_an_unborn_one_are_still_none(self, repo):
        """A branch never made, and HEAD on a branch with no commit yet, are None as before: only git's failures raise."""
        import git as gitpython

        from orchestrator.gitdir import head_commit
        from orchestrator.ref_storage import branch_tip

        assert branch_tip(gitpython.Repo(repo), "never-made") is None
        git(repo, "checkout", "-q", "--orphan", "unborn")
        assert head_commit(repo / ".git", repo / ".git") is None

    def test_a_night_on_refs_git_cannot_read_is_one_line_not_no_commits(self, config_file, repo, capsys):
        """`overnight run` on a repository whose tables are gone: exit 2, one line saying git could not read HEAD
        (it said the repository "has no commits yet; commit something first")."""
        config = config_file()
        _tables_lost(repo)
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 2
        err = capsys.readouterr().err
        assert "git could not read HEAD in " in err and "has no commits yet" not in err and "Traceback" not in err

    def test_recovery_rolls_nothing_back_on_a_branch_git_cannot_read(self, tmp_path, repo, monkeypatch):
        """A killed iteration's branch git cannot read: recovery stops with RefsUnreadable, the branch and its commit
        as they were, the iteration still to settle (read as "no commit", the branch was reset to the checkpoint and
        the commit on it dropped)."""
        import socket

        from orchestrator.lock import state_identity
        from orchestrator.ref_storage import RefsUnreadable
        from orchestrator.worktree import Worktree
        from runs import RunStore
        from tests.test_faults import _config, dead_pid, recover

        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        store = RunStore.open(config.store_url)
        try:
            pid = dead_pid()
            run_id = store.begin_run(config_path=str(config.source), pid=pid, host=socket.gethostname(), state_id=state_identity(config.state_dir))
            task_run = store.begin_task(run_id, name="fix-greet", branch=worktree.branch)
            store.begin_iteration(task_run, number=1, checkpoint=worktree.checkpoint(), pid=pid)
        finally:
            store.close()
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        git(worktree.path, "commit", "-qam", "made on the branch")
        made = git(repo, "rev-parse", "overnight/fix-greet")
        _git_failing(tmp_path, monkeypatch, "*rev-parse*refs/heads/overnight/fix-greet*")
        with pytest.raises(RefsUnreadable, match=_UNREADABLE):
            recover(config)
        assert git(repo, "rev-parse", "overnight/fix-greet") == made
        assert "return 'hello'" in (worktree.path / "greet.py").read_text()
        store = RunStore.open(config.store_url)
        try:
            assert [i.task_name for i in store.running_iterations()] == ["fix-greet"]
        finally:
            store.close()

    def test_the_idle_cleaning_sets_no_worktree_aside_for_refs_git_cannot_read(self, tmp_path, repo, monkeypatch):
        """A task's idle worktree whose HEAD git cannot read: recovery stops with RefsUnreadable, the worktree and a
        person's file in it where they were (the refs are the repository's fault, not the worktree's: it was set aside
        as a worktree git cannot read, and made anew)."""
        from orchestrator.ref_storage import RefsUnreadable
        from orchestrator.worktree import Worktree
        from tests.test_faults import _config, recover

        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "notes.txt").write_text("a person's\n")
        _git_failing(tmp_path, monkeypatch, "*symbolic-ref*")
        with pytest.raises(RefsUnreadable, match=_UNREADABLE):
            recover(config)
        assert (worktree.path / "notes.txt").read_text() == "a person's\n" and (worktree.path / ".git").is_file()

    def test_a_worktrees_head_is_no_missing_commit_when_the_repositorys_stack_is_lost(self, repo, tmp_path):
        """A linked worktree's HEAD, kept in its own stack, read while the repository's stack (where its branch is) is
        lost, the `reftable/` folder gone or `tables.list` emptied: RefsUnreadable (the worktree's own HEAD, readable,
        vouched for git's "none", and its commit was None: no commit checked out, the branch put back by `reset`)."""
        from orchestrator.gitdir import head_commit
        from orchestrator.ref_storage import RefsUnreadable

        for damage, lose in (("folder-gone", lambda stack: shutil.rmtree(stack)), ("list-emptied", lambda stack: (stack / "tables.list").write_text(""))):
            made = _reftable_repo(tmp_path / damage)
            git(made, "worktree", "add", "-q", "-b", "overnight/t", str(tmp_path / f"{damage}-wt"))
            common = made / ".git"
            admin = common / "worktrees" / f"{damage}-wt"
            lose(common / "reftable")
            with pytest.raises(RefsUnreadable, match=f"git could not read HEAD in {common}: it names neither"):
                head_commit(admin, common)

    def test_a_fresh_repository_with_no_commit_is_still_unborn(self, tmp_path):
        """`git init --ref-format=reftable` and nothing committed: HEAD on its unborn branch, no commit, no branch, as
        before (git answers "none", and HEAD is there)."""
        import git as gitpython

        from orchestrator.branch_holders import head_file
        from orchestrator.gitdir import head_commit
        from orchestrator.ref_storage import branch_names, branch_tip, checked_out_branch

        fresh = tmp_path / "fresh"
        if subprocess.run(["git", "init", "-q", "-b", "main", "--ref-format=reftable", str(fresh)], capture_output=True).returncode:
            pytest.skip("this git makes no reftable repository")
        opened, dotgit = gitpython.Repo(fresh), fresh / ".git"
        assert head_file(dotgit) == "ref: refs/heads/main" and head_commit(dotgit, dotgit) is None
        assert branch_names(opened) == set() and branch_tip(opened, "main") is None and checked_out_branch(opened) == "main"

    def test_another_worktree_being_added_does_not_stop_a_tasks_start(self, repo, tmp_path):
        """Another registration whose own stack holds no HEAD yet (`git worktree add` writes it there last: another
        night's, a person's, under way) holds no branch, as git takes it: the task's start goes on (it was
        RefsUnreadable, and the night ended); the repository's own stack unreadable is still RefsUnreadable."""
        from orchestrator.branch_holders import also_held_elsewhere
        from orchestrator.ref_storage import RefsUnreadable

        common = repo / ".git"
        git(repo, "worktree", "add", "-q", "-b", "overnight/t", str(tmp_path / "task"))
        git(repo, "worktree", "add", "-q", "-b", "other", str(tmp_path / "being-added"))
        # What `git worktree add` leaves until its last step (strace): the placeholder HEAD, an empty `reftable/` folder.
        for made in (common / "worktrees" / "being-added" / "reftable").iterdir():
            made.unlink()
        assert also_held_elsewhere(common / "worktrees" / "task", common, "overnight/t") is None
        _tables_lost(repo)
        with pytest.raises(RefsUnreadable):
            also_held_elsewhere(common / "worktrees" / "task", common, "overnight/t")
