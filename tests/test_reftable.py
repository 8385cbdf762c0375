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
