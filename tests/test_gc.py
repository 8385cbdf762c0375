"""`overnight gc` on real git repositories: stale task worktrees and branches go, unsaved work stays."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import Config, load_config
from orchestrator.gc import collect_garbage
from orchestrator.worktree import Worktree
from tests.conftest import GIT_ENV, git, make_repo, write_config

CURRENT = {"name": "current", "prompt": "p", "check": "true"}


@pytest.fixture
def settings(tmp_path: Path, repo: Path) -> Config:
    """A config whose only task is `current`, for the `repo` fixture."""
    path = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])
    return load_config(path)


def task_worktree(settings: Config, name: str, *, commit: bool = False) -> Worktree:
    """The task's worktree as a night makes it, optionally with one commit of agent work."""
    tree = Worktree.ensure(settings.repo_path, settings.state_dir, name, "HEAD")
    if commit:
        (tree.path / f"{name}.txt").write_text("agent work\n")
        tree.commit(f"{name} iteration 1")
    return tree


def odd_numbers(indent: int) -> str:
    """A function whose `return` line is indented by `indent` spaces: where it stands is the program
    (4: after the loop; 8: inside it, after the first number; 12: inside the `if`)."""
    return "def odd(xs):\n    for x in list(xs):\n        if x % 2 == 0:\n            xs.remove(x)\n" + " " * indent + "return xs\n"


def overnight(*args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "NO_COLOR": "1"},
    )


def branches(repo: Path) -> set[str]:
    return set(git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/").split())


def worktree_paths(repo: Path) -> set[str]:
    return {line.removeprefix("worktree ") for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")}


class TestStaleTasks:
    def test_merged_stale_branch_and_worktree_are_removed(self, settings, repo):
        """A task gone from the config whose branch holds nothing beyond base loses branch and worktree."""
        old = task_worktree(settings, "old")
        result = collect_garbage(settings)
        assert result.removed_branches == ("overnight/old",)
        assert result.removed_worktrees == (old.path,)
        assert "overnight/old" not in branches(repo)
        assert not old.path.exists() and str(old.path) not in worktree_paths(repo)

    def test_branch_merged_into_base_after_work_is_removed(self, settings, repo):
        """Agent commits that the user merged into base make the branch safe to delete."""
        task_worktree(settings, "done", commit=True)
        git(repo, "merge", "-q", "--no-edit", "overnight/done")
        result = collect_garbage(settings)
        assert result.removed_branches == ("overnight/done",) and result.kept_branches == ()

    def test_unmerged_branch_is_kept_but_its_worktree_goes(self, settings, repo):
        """Unmerged, unpushed work keeps its branch (with the reason); the worktree is removed."""
        wip = task_worktree(settings, "wip", commit=True)
        tip = git(repo, "rev-parse", "overnight/wip")
        result = collect_garbage(settings)
        assert result.removed_branches == ()
        [kept] = result.kept_branches
        assert kept.branch == "overnight/wip" and "1 commit(s) not merged" in kept.reason
        assert git(repo, "rev-parse", "overnight/wip") == tip
        assert result.removed_worktrees == (wip.path,) and not wip.path.exists()

    def test_force_deletes_an_unmerged_branch(self, settings, repo):
        """With force, unmerged work is deleted too."""
        task_worktree(settings, "wip", commit=True)
        result = collect_garbage(settings, force=True)
        assert result.removed_branches == ("overnight/wip",) and result.kept_branches == ()
        assert "overnight/wip" not in branches(repo)

    def test_kept_reason_counts_only_commits_neither_merged_nor_pushed(self, settings, repo, tmp_path):
        """With one commit pushed and one more not, the kept branch's reason says 1 commit, not 2."""
        remote = tmp_path / "remote.git"
        git(tmp_path, "init", "-q", "--bare", str(remote))
        git(repo, "remote", "add", "origin", str(remote))
        half = task_worktree(settings, "half", commit=True)
        git(repo, "push", "-q", "origin", "overnight/half")
        (half.path / "more.txt").write_text("not pushed\n")
        half.commit("half iteration 2")
        [kept] = collect_garbage(settings).kept_branches
        assert kept.branch == "overnight/half" and kept.reason.startswith("1 commit(s) not merged")

    @pytest.mark.parametrize("merge", ["rebase", "squash"])
    def test_a_branch_rebased_or_squashed_into_base_is_removed(self, settings, repo, merge):
        """Each commit's change found in base (`git cherry` all "-"): rebased, or squashed from one commit, the branch is merged."""
        task_worktree(settings, "sq", commit=True)
        (repo / "user.txt").write_text("the user's own work\n")
        git(repo, "add", "user.txt")
        git(repo, "commit", "-q", "-m", "user")
        if merge == "squash":
            git(repo, "merge", "-q", "--squash", "overnight/sq")
            git(repo, "commit", "-q", "-m", "Squashed sq")
        else:
            git(repo, "cherry-pick", "overnight/sq")
        assert collect_garbage(settings).removed_branches == ("overnight/sq",)

    def test_a_branch_with_a_merge_of_its_own_is_not_taken_for_rebased(self, settings, repo):
        """Its one plain commit cherry-picked into base, the branch's merge of base (whose resolution carries work
        of its own) is skipped by `git cherry`: the branch is kept as unmerged, the merge's work on it."""
        tree = task_worktree(settings, "mixed", commit=True)
        first = git(repo, "rev-parse", "overnight/mixed")
        (repo / "user.txt").write_text("the user's own work\n")
        git(repo, "add", "user.txt")
        git(repo, "commit", "-q", "-m", "user")
        git(tree.path, "merge", "-q", "--no-commit", "main")
        (tree.path / "resolution.txt").write_text("work only in the merge\n")
        git(tree.path, "add", "resolution.txt")
        git(tree.path, "commit", "-q", "-m", "merge main, with a fix")
        git(repo, "cherry-pick", first)
        assert git(repo, "cherry", "main", "overnight/mixed").startswith("-")  # all "-": cherry sees no merge
        result = collect_garbage(settings)
        assert result.removed_branches == () and [k.branch for k in result.kept_branches] == ["overnight/mixed"]
        assert "resolution.txt" in git(repo, "ls-tree", "--name-only", "overnight/mixed")

    def test_a_commit_base_has_only_indented_otherwise_is_not_taken_for_rebased(self, settings, repo):
        """git's patch-id ignores whitespace, so `git cherry` pairs a branch commit with a base commit that indents
        the same line differently: in Python another program. The branch is kept as unmerged."""
        (repo / "odd.py").write_text(odd_numbers(4))
        git(repo, "add", "odd.py")
        git(repo, "commit", "-q", "-m", "odd numbers")
        tree = task_worktree(settings, "indent")
        (tree.path / "odd.py").write_text(odd_numbers(8))  # returns after the first number
        tree.commit("indent iteration 1")
        (repo / "odd.py").write_text(odd_numbers(12))  # returns at the first even number
        git(repo, "commit", "-q", "-am", "the user's own indent")
        assert git(repo, "cherry", "main", "overnight/indent").startswith("-")  # cherry takes them for one change
        result = collect_garbage(settings)
        assert result.removed_branches == ()
        [kept] = result.kept_branches
        assert kept.branch == "overnight/indent" and kept.reason.startswith("1 commit(s) not merged into main")

    def test_a_branch_of_several_commits_rebased_into_base_is_removed(self, settings, repo):
        """Each of the branch's commits found byte for byte in base, after a commit of the user's, makes it merged."""
        tree = task_worktree(settings, "two", commit=True)
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        tree.commit("two iteration 2")
        (repo / "user.txt").write_text("the user's own work\n")
        git(repo, "add", "user.txt")
        git(repo, "commit", "-q", "-m", "user")
        git(repo, "cherry-pick", "main..overnight/two")
        assert collect_garbage(settings).removed_branches == ("overnight/two",)

    def test_a_git_without_verbatim_patch_ids_keeps_a_rebased_branch(self, settings, repo, tmp_path, monkeypatch):
        """Where git cannot tell whitespace apart (before 2.39, `patch-id --verbatim` is an unknown option), a
        rebased branch is kept as unmerged rather than maybe lost."""
        task_worktree(settings, "sq", commit=True)
        git(repo, "cherry-pick", "overnight/sq")
        shim = tmp_path / "old-git"
        shim.mkdir()
        real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
        (shim / "git").write_text(f'#!/bin/sh\n[ "$1 $2" = "patch-id --verbatim" ] && {{ echo "error: unknown option" >&2; exit 129; }}\nexec {real} "$@"\n')
        (shim / "git").chmod(0o755)
        monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
        result = collect_garbage(settings)
        assert result.removed_branches == ()
        [kept] = result.kept_branches
        assert kept.branch == "overnight/sq" and kept.reason.startswith("1 commit(s) not merged into main")

    def test_the_advice_for_a_kept_branch_deletes_only_that_branch(self, settings, repo):
        """A kept branch's reason says how to delete that one branch, not to use --force, which deletes all kept work."""
        task_worktree(settings, "wip", commit=True)
        [kept] = collect_garbage(settings).kept_branches
        assert kept.reason == "1 commit(s) not merged into main and not pushed (to delete only this branch: git branch -D overnight/wip)"

    def test_pushed_branch_is_removed(self, settings, repo, tmp_path):
        """A branch whose tip is on a remote-tracking branch loses nothing when deleted."""
        remote = tmp_path / "remote.git"
        git(tmp_path, "init", "-q", "--bare", str(remote))
        git(repo, "remote", "add", "origin", str(remote))
        task_worktree(settings, "shipped", commit=True)
        git(repo, "push", "-q", "origin", "overnight/shipped")
        result = collect_garbage(settings)
        assert result.removed_branches == ("overnight/shipped",)
        assert "overnight/shipped" not in branches(repo)

    def test_a_detached_head_does_not_count_as_merged(self, settings, repo):
        """With base "HEAD" detached at the night's commit (checked out to try it), the unmerged branch stays."""
        task_worktree(settings, "tried", commit=True)
        tip = git(repo, "rev-parse", "overnight/tried")
        git(repo, "checkout", "-q", tip)
        [kept] = collect_garbage(settings).kept_branches
        assert kept.branch == "overnight/tried" and kept.reason.startswith("1 commit(s) not on another branch or tag and not pushed")
        assert git(repo, "rev-parse", "overnight/tried") == tip

    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_commit_two_stale_branches_share_keeps_one_of_them(self, settings, repo, dry_run):
        """Two stale branches on one unmerged commit: one is deleted, the other keeps the commit, and the dry run says so too."""
        task_worktree(settings, "first", commit=True)
        git(repo, "branch", "overnight/second", "overnight/first")
        result = collect_garbage(settings, dry_run=dry_run)
        assert result.removed_branches == ("overnight/first",)
        assert [k.branch for k in result.kept_branches] == ["overnight/second"]

    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_kept_branch_of_stray_edits_does_not_make_a_commit_safe(self, settings, repo, dry_run):
        """An overnight-kept/ branch (recovery's keep of a person's edit, on top of the task's commits) is the person's
        to delete later: the task branch whose commits only it also holds is kept as unmerged."""
        task_worktree(settings, "old", commit=True)
        git(repo, "branch", "overnight-kept/old/20260101T010101.000000Z", "overnight/old")
        result = collect_garbage(settings, dry_run=dry_run)
        assert result.removed_branches == ()
        [kept] = result.kept_branches
        assert kept.branch == "overnight/old" and kept.reason.startswith("1 commit(s) not merged into main")
        assert "overnight/old" in branches(repo)

    def test_a_commit_on_a_tag_is_safe(self, settings, repo):
        """A commit a tag holds is not lost with the branch."""
        task_worktree(settings, "tagged", commit=True)
        git(repo, "tag", "v1", "overnight/tagged")
        assert collect_garbage(settings).removed_branches == ("overnight/tagged",)

    def test_worktree_deleted_by_hand_is_pruned(self, settings, repo):
        """A worktree folder someone removed with rm is forgotten, and its branch collected."""
        import shutil

        gone = task_worktree(settings, "gone")
        shutil.rmtree(gone.path)
        result = collect_garbage(settings)
        assert result.removed_branches == ("overnight/gone",)
        assert str(gone.path) not in worktree_paths(repo)


class TestUncommittedWork:
    @pytest.mark.parametrize("change", ["untracked", "modified", "staged"])
    def test_stale_worktree_with_uncommitted_changes_is_kept(self, settings, repo, change):
        """A stale task's worktree holding changes not committed stays, with its branch and the reason."""
        bad = task_worktree(settings, "bad")
        edited = bad.path / ("user_edit.txt" if change == "untracked" else "greet.py")
        edited.write_text("the user's edit\n")
        if change == "staged":
            git(bad.path, "add", "greet.py")
        result = collect_garbage(settings)
        assert result.removed_worktrees == () and result.removed_branches == ()
        [kept] = result.kept_worktrees
        assert kept.path == bad.path and "1 uncommitted change(s)" in kept.reason and "--force" in kept.reason
        assert [(k.branch, k.reason) for k in result.kept_branches] == [("overnight/bad", f"checked out at {bad.path}")]
        assert edited.read_text() == "the user's edit\n" and "overnight/bad" in branches(repo)
        assert f"kept worktree {bad.path}: 1 uncommitted change(s) (to remove only this worktree: git worktree remove --force {bad.path})" in result.lines()

    @pytest.mark.parametrize("ignore", ["dirty", "all"])
    def test_an_edit_inside_a_submodule_is_uncommitted_work(self, settings, repo, tmp_path, ignore):
        """An edit inside a submodule keeps the stale worktree, even where .gitmodules tells git status to ignore it."""
        library = make_repo(tmp_path / "library", {"lib.py": "x = 1\n"})
        git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/lib")
        git(repo, "config", "-f", ".gitmodules", "submodule.vendor/lib.ignore", ignore)
        git(repo, "add", ".gitmodules")
        git(repo, "commit", "-q", "-m", "vendor lib")
        old = task_worktree(settings, "old")
        git(old.path, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
        (old.path / "vendor" / "lib" / "lib.py").write_text("x = 2\n")
        result = collect_garbage(settings)
        assert result.removed_worktrees == () and [k.path for k in result.kept_worktrees] == [old.path]
        assert (old.path / "vendor" / "lib" / "lib.py").read_text() == "x = 2\n"

    @pytest.mark.parametrize("edit", ["modified", "deleted"])
    @pytest.mark.parametrize("hide", ["--skip-worktree", "--assume-unchanged"])
    def test_an_edit_hidden_from_git_status_is_uncommitted_work(self, settings, repo, tmp_path, hide, edit):
        """A file a person hid from `git status` (skip-worktree, assume-unchanged) and then changed or deleted
        keeps the stale worktree, with the reason, as any other uncommitted change does."""
        old = task_worktree(settings, "old")
        git(old.path, "update-index", hide, "greet.py")
        hidden = old.path / "greet.py"
        if edit == "deleted":
            hidden.unlink()
        else:
            hidden.write_text("def greet():\n    return 'hello, my local edit'\n")
        assert git(old.path, "status", "--porcelain") == ""  # what gc relied on
        done = overnight("gc", "--config", str(tmp_path / "overnight.toml"))
        assert done.returncode == 0, done.stderr
        assert f"kept worktree {old.path}: 1 uncommitted change(s)" in done.stdout
        assert "overnight/old" in branches(repo) and hidden.exists() == (edit == "modified")

    @pytest.mark.parametrize("hide", ["--skip-worktree", "--assume-unchanged"])
    def test_a_hidden_file_left_as_committed_is_no_change(self, settings, repo, hide):
        """A file hidden from `git status` but as the index has it holds no work: the worktree goes."""
        old = task_worktree(settings, "old")
        git(old.path, "update-index", hide, "greet.py")
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == ()

    def test_the_files_a_sparse_checkout_leaves_out_are_no_change(self, settings, repo):
        """A sparse checkout hides the files it leaves out (skip-worktree): absent on purpose, they are no deletion."""
        old = task_worktree(settings, "old")
        git(old.path, "sparse-checkout", "set", "--no-cone", "/greet.py")
        assert not (old.path / "check_greet.py").exists()
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == ()

    def test_force_removes_a_worktree_with_uncommitted_changes(self, settings, repo):
        """With force, the stale worktree goes even with changes in it, and its branch too."""
        bad = task_worktree(settings, "bad")
        (bad.path / "user_edit.txt").write_text("x\n")
        result = collect_garbage(settings, force=True)
        assert result.removed_worktrees == (bad.path,) and result.removed_branches == ("overnight/bad",)
        assert not bad.path.exists()

    def test_kept_build_caches_are_not_uncommitted_work(self, tmp_path, repo):
        """What `[repo] keep` names (a cache rollbacks keep, even untracked) does not keep a stale worktree."""
        path = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])
        path.write_text(path.read_text().replace("[repo]\n", '[repo]\nkeep = [".cache"]\n'))
        settings = load_config(path)
        old = task_worktree(settings, "old")
        (old.path / ".cache").mkdir()
        (old.path / ".cache" / "blob").write_text("cached\n")
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == ()

    def test_keep_patterns_mean_what_they_mean_to_a_rollback(self, tmp_path, repo):
        """`[repo] keep` patterns as `git clean -e` takes them: "/build" at the top, "node_modules" at any depth; a build/ deeper down is work."""
        path = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])
        path.write_text(path.read_text().replace("[repo]\n", '[repo]\nkeep = ["/build", "node_modules"]\n'))
        settings = load_config(path)
        old = task_worktree(settings, "old")
        for cached in ("build/o.bin", "web/node_modules/x/i.js", "node_modules/y.js"):
            (old.path / cached).parent.mkdir(parents=True, exist_ok=True)
            (old.path / cached).write_text("cache\n")
        (old.path / "src" / "build").mkdir(parents=True)
        (old.path / "src" / "build" / "mine.py").write_text("work\n")
        [kept] = collect_garbage(settings, dry_run=True).kept_worktrees
        assert kept.reason.startswith("1 uncommitted change(s)")
        (old.path / "src" / "build" / "mine.py").unlink()
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == ()

    def test_ignored_files_are_not_uncommitted_work(self, settings, repo):
        """Files the repository ignores (build output) do not keep a stale worktree."""
        old = task_worktree(settings, "old")
        (old.path / "greet.pyc").write_bytes(b"\0")
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == ()


class TestBranchDeletedByHand:
    """A stale task's worktree whose branch a person deleted (`git update-ref -d`) is still the task's:
    it was skipped for good, neither removed nor named (found by a review)."""

    def test_one_with_uncommitted_changes_is_kept_and_named_and_force_removes_it(self, settings, repo, tmp_path):
        old = task_worktree(settings, "old")
        (old.path / "user_edit.txt").write_text("the user's edit\n")
        git(repo, "update-ref", "-d", "refs/heads/overnight/old")
        config = str(tmp_path / "overnight.toml")
        done = overnight("gc", "--config", config)
        assert done.returncode == 0, done.stderr
        assert f"kept worktree {old.path}: 1 uncommitted change(s) (to remove only this worktree: git worktree remove --force {old.path})" in done.stdout
        assert "branch" not in done.stdout  # no branch to remove or keep
        assert (old.path / "user_edit.txt").read_text() == "the user's edit\n"
        done = overnight("gc", "--force", "--config", config)
        assert done.returncode == 0, done.stderr
        assert f"removed worktree {old.path}" in done.stdout.splitlines()
        assert not old.path.exists() and str(old.path) not in worktree_paths(repo)
        assert "overnight/old" not in branches(repo)

    def test_one_with_no_changes_is_removed_as_the_dry_run_says(self, settings, repo):
        """Its HEAD unborn, git status shows every file as added: changes count from the commit it was last on."""
        old = task_worktree(settings, "old")
        git(repo, "update-ref", "-d", "refs/heads/overnight/old")
        would = collect_garbage(settings, dry_run=True)
        assert would.lines() == [f"would remove worktree {old.path}"]
        assert old.path.exists() and str(old.path) in worktree_paths(repo)
        result = collect_garbage(settings)
        assert result.lines() == [f"removed worktree {old.path}"]
        assert result.removed_worktrees == (old.path,) and result.kept_worktrees == () and result.kept_branches == ()
        assert not old.path.exists() and str(old.path) not in worktree_paths(repo)

    def test_one_whose_branch_was_deleted_from_inside_it_is_removed_too(self, settings, repo):
        """Deleted from inside the worktree, git logs the deletion itself last in its HEAD reflog (new id all zeros)."""
        old = task_worktree(settings, "old")
        git(old.path, "update-ref", "-d", "refs/heads/overnight/old")
        assert collect_garbage(settings).lines() == [f"removed worktree {old.path}"]
        assert not old.path.exists()

    def test_one_whose_last_commit_is_on_no_ref_is_kept_until_force(self, settings, repo):
        """The deleted branch's commits are named only by the worktree's HEAD reflog: it stays, with the reason."""
        old = task_worktree(settings, "old", commit=True)
        git(repo, "update-ref", "-d", "refs/heads/overnight/old")
        [kept] = collect_garbage(settings).kept_worktrees
        assert kept.path == old.path and kept.reason.startswith("its branch was deleted and its last commit has 1 commit(s) on no branch")
        assert old.path.exists()
        assert collect_garbage(settings, force=True).lines() == [f"removed worktree {old.path}"]
        assert not old.path.exists()


class TestUntouched:
    def test_current_tasks_and_other_branches_are_untouched(self, settings, repo):
        """Tasks still in the config, the user's branches and non-task overnight/ refs stay exactly as they were."""
        current = task_worktree(settings, "current", commit=True)
        git(repo, "branch", "feature")
        git(repo, "branch", "overnight/team/shared")
        before = {b: git(repo, "rev-parse", b) for b in branches(repo)}
        result = collect_garbage(settings, force=True)
        assert result.removed_branches == () and result.removed_worktrees == ()
        assert {b: git(repo, "rev-parse", b) for b in branches(repo)} == before
        assert current.path.exists() and (current.path / "current.txt").exists()

    def test_branch_checked_out_in_the_user_checkout_is_kept(self, settings, repo):
        """Even with force, the branch the user has checked out for review is not deleted."""
        git(repo, "branch", "overnight/review")
        git(repo, "checkout", "-q", "overnight/review")
        result = collect_garbage(settings, force=True)
        assert [k.branch for k in result.kept_branches] == ["overnight/review"]
        assert git(repo, "branch", "--show-current") == "overnight/review"

    def test_dry_run_changes_nothing(self, settings, repo):
        """dry_run reports what would go, and every branch and worktree is still there."""
        old = task_worktree(settings, "old")
        wip = task_worktree(settings, "wip", commit=True)
        before = (branches(repo), worktree_paths(repo))
        result = collect_garbage(settings, dry_run=True)
        assert result.dry_run and result.removed_branches == ("overnight/old",)
        assert set(result.removed_worktrees) == {old.path, wip.path}
        assert [k.branch for k in result.kept_branches] == ["overnight/wip"]
        assert (branches(repo), worktree_paths(repo)) == before
        assert old.path.exists() and wip.path.exists()
        assert result.lines()[0].startswith("would remove worktree")

    def test_worktree_the_user_added_on_an_overnight_branch_is_theirs(self, settings, repo, tmp_path):
        """Even with force, a worktree outside the state dir on overnight/<name> keeps its files and branch."""
        git(repo, "branch", "overnight/review-me")
        mine = tmp_path / "myreview"
        git(repo, "worktree", "add", "-q", str(mine), "overnight/review-me")
        (mine / "notes.txt").write_text("my review notes\n")
        result = collect_garbage(settings, force=True)
        assert result.removed_worktrees == () and result.removed_branches == ()
        assert [(k.branch, k.reason) for k in result.kept_branches] == [("overnight/review-me", f"checked out at {mine}")]
        assert (mine / "notes.txt").read_text() == "my review notes\n" and str(mine) in worktree_paths(repo)
        assert "overnight/review-me" in branches(repo)

    def test_stale_task_branch_checked_out_by_the_user_elsewhere_is_left_alone(self, settings, repo, tmp_path):
        """A stale task's branch the user checked out in their own worktree: that worktree and its edits stay."""
        old = task_worktree(settings, "old", commit=True)
        git(repo, "worktree", "remove", str(old.path))
        review = tmp_path / "review"
        git(repo, "worktree", "add", "-q", str(review), "overnight/old")
        (review / "old.txt").write_text("edited by the user\n")
        result = collect_garbage(settings)
        assert result.removed_worktrees == () and result.removed_branches == ()
        assert f"kept branch overnight/old: checked out at {review}" in result.lines()
        assert (review / "old.txt").read_text() == "edited by the user\n"


class TestDetachedAndBase:
    @pytest.mark.parametrize("dry_run", [False, True])
    def test_a_stale_task_worktree_detached_for_review_is_collected(self, settings, repo, dry_run):
        """git makes a person detach a task's worktree to check its branch out for review; once the branch
        is merged and gone, that clean worktree was never collected, nor named (found by a review)."""
        old = task_worktree(settings, "old", commit=True)
        git(old.path, "checkout", "-q", "--detach")
        git(repo, "merge", "-q", "--no-edit", "overnight/old")
        result = collect_garbage(settings, dry_run=dry_run)
        assert result.removed_worktrees == (old.path,) and result.removed_branches == ("overnight/old",)
        assert old.path.exists() is dry_run and (str(old.path) in worktree_paths(repo)) is dry_run
        if not dry_run:
            assert collect_garbage(settings).lines() == ["nothing to collect"]

    def test_a_detached_task_worktree_left_after_its_branch_is_collected_later(self, settings, repo):
        old = task_worktree(settings, "old", commit=True)
        git(old.path, "checkout", "-q", "--detach")
        git(repo, "merge", "-q", "--no-edit", "overnight/old")
        git(repo, "branch", "-q", "-D", "overnight/old")
        result = collect_garbage(settings)
        assert result.removed_worktrees == (old.path,) and not old.path.exists()
        assert str(old.path) not in worktree_paths(repo)

    def test_a_pipe_where_the_task_mark_goes_does_not_hold_gc(self, settings, repo):
        """The mark is read as HEAD is, a regular file only: read as text, a pipe there held gc for ever, waiting for a writer."""
        old = task_worktree(settings, "old")
        git(old.path, "checkout", "-q", "--detach")
        mark = Path(git(old.path, "rev-parse", "--absolute-git-dir")) / "overnight-task"
        mark.unlink()
        os.mkfifo(mark)
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "gc", "--config", str(settings.source)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30,
        )
        assert done.returncode == 0, done.stderr

    def test_a_detached_task_worktree_an_older_version_made_is_collected(self, settings, repo):
        """Made before nights marked their worktrees, detached for a review, its task since gone from the config: it
        stayed for ever, a night's warning each night, where gc had removed it before marks came."""
        old = task_worktree(settings, "old")
        (Path(git(old.path, "rev-parse", "--absolute-git-dir")) / "overnight-task").unlink()
        git(old.path, "checkout", "-q", "--detach")
        assert collect_garbage(settings).removed_worktrees == (old.path,) and not old.path.exists()

    def test_a_link_where_the_task_mark_goes_is_replaced_not_written_through(self, tmp_path, settings):
        """Marking a worktree once more must not write the task's name into the file a link there leads to."""
        tree = task_worktree(settings, "old")
        mark = Path(git(tree.path, "rev-parse", "--absolute-git-dir")) / "overnight-task"
        outside = tmp_path / "someone-elses.txt"
        outside.write_text("theirs\n")
        mark.unlink()
        mark.symlink_to(outside)
        Worktree.ensure(settings.repo_path, settings.state_dir, "old", "HEAD")
        assert outside.read_text() == "theirs\n" and not mark.is_symlink() and mark.read_text() == "old"

    def test_a_detached_worktree_whose_commit_nothing_else_keeps_stays(self, settings, repo):
        """Its HEAD is the commit's only name: removing the worktree would lose it. --force removes it."""
        old = task_worktree(settings, "old")
        git(old.path, "checkout", "-q", "--detach")
        (old.path / "loose.txt").write_text("committed on a detached HEAD\n")
        git(old.path, "add", "loose.txt")
        git(old.path, "commit", "-q", "-m", "loose")
        head = git(old.path, "rev-parse", "HEAD")
        result = collect_garbage(settings)
        [kept] = result.kept_worktrees
        assert kept.path == old.path and "detached HEAD has 1 commit(s) on no branch" in kept.reason
        assert git(old.path, "rev-parse", "HEAD") == head
        assert collect_garbage(settings, force=True).removed_worktrees == (old.path,) and not old.path.exists()

    @pytest.mark.parametrize("force", [False, True])
    def test_a_detached_worktree_in_the_middle_of_a_rebase_stays(self, settings, repo, force):
        """A rebase stopped at an `edit` step shows its worktree detached and clean; removing it lost the
        rebase under way (found by the fix-review)."""
        old = task_worktree(settings, "old", commit=True)
        (old.path / "second.txt").write_text("two\n")
        git(old.path, "add", "second.txt")
        git(old.path, "commit", "-q", "-m", "second")
        git(old.path, "-c", "sequence.editor=sed -i s/^pick/edit/", "rebase", "-q", "-i", "HEAD~1")
        assert git(old.path, "status", "--porcelain") == ""
        result = collect_garbage(settings, force=force)
        assert [(k.path, k.reason) for k in result.kept_worktrees] == [(old.path, "a rebase is in progress there (finish or abort it first)")]
        git(old.path, "rebase", "--continue")

    def test_a_detached_worktree_with_uncommitted_changes_stays(self, settings, repo):
        old = task_worktree(settings, "old")
        git(old.path, "checkout", "-q", "--detach")
        (old.path / "draft.txt").write_text("unsaved\n")
        [kept] = collect_garbage(settings).kept_worktrees
        assert kept.path == old.path and "1 uncommitted change(s)" in kept.reason
        assert (old.path / "draft.txt").read_text() == "unsaved\n"

    def test_a_detached_worktree_of_a_current_task_is_left_alone(self, settings, repo):
        tree = task_worktree(settings, "current")
        git(tree.path, "checkout", "-q", "--detach")
        assert collect_garbage(settings).lines() == ["nothing to collect"] and tree.path.exists()

    @pytest.mark.parametrize("force", [False, True])
    def test_the_branch_base_names_is_kept_even_merged(self, tmp_path, repo, force):
        """base = "overnight/merged" (tasks stacked on one another): gc deleted it once its task left the
        config, and the next run failed on a base that named nothing (found by a review)."""
        write_config(tmp_path / "first.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])
        first = load_config(tmp_path / "first.toml")
        task_worktree(first, "merged", commit=True)
        git(repo, "merge", "-q", "--no-edit", "overnight/merged")
        path = tmp_path / "overnight.toml"
        path.write_text((tmp_path / "first.toml").read_text().replace("[repo]\n", '[repo]\nbase = "overnight/merged"\n'))
        settings = load_config(path)
        result = collect_garbage(settings, force=force)
        assert result.removed_branches == ()
        assert [(k.branch, k.reason) for k in result.kept_branches] == [("overnight/merged", "it is [repo] base (overnight/merged)")]
        assert "overnight/merged" in branches(repo)


READ_ONLY_CACHE = """
import json, os, sys
from pathlib import Path
from orchestrator.config import load_config
from orchestrator.gc import collect_garbage
from orchestrator.worktree import Worktree
from tests.conftest import SAMPLE_FILES, make_repo, write_config

base = Path(sys.argv[1])
repo = make_repo(base / "repo", SAMPLE_FILES)
config = write_config(base / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[{"name": "current", "prompt": "p", "check": "true"}])
config.write_text(config.read_text().replace("[repo]\\n", '[repo]\\nkeep = [".gocache"]\\n'))
settings = load_config(config)
tree = Worktree.ensure(settings.repo_path, settings.state_dir, "go", "HEAD")
(tree.path / ".gocache" / "mod").mkdir(parents=True)
(tree.path / ".gocache" / "mod" / "x.go").write_text("package x\\n")
os.chmod(tree.path / ".gocache" / "mod", 0o555)
result = collect_garbage(settings)
print(json.dumps({"lines": result.lines(), "left": tree.path.exists()}))
"""


class TestMovedStateDir:
    @pytest.mark.parametrize("dry_run", [True, False])
    def test_worktrees_moved_with_the_state_dir_are_collected_where_they_are(self, settings, repo, tmp_path, dry_run):
        """After `mv` of the state dir, the worktrees' registrations are repaired (dry run too) and a stale task's is collected at its new folder."""
        import shutil

        old_state = settings.state_dir
        Worktree.ensure(settings.repo_path, old_state, "current", "HEAD")
        Worktree.ensure(settings.repo_path, old_state, "gone", "HEAD")
        shutil.move(old_state, tmp_path / "new-state")
        config = tmp_path / "overnight.toml"
        config.write_text(config.read_text().replace('dir = "state"', 'dir = "new-state"'))
        moved = load_config(config)
        result = collect_garbage(moved, dry_run=dry_run)
        assert result.removed_worktrees == (moved.worktrees_dir / "gone",)
        assert result.removed_branches == ("overnight/gone",) and result.kept_branches == ()
        assert (moved.worktrees_dir / "gone").exists() == dry_run
        listed = git(repo, "worktree", "list", "--porcelain")
        assert f"worktree {moved.worktrees_dir / 'current'}\n" in listed and str(old_state) not in listed

    def test_a_registration_whose_folder_is_gone_is_said_to_be(self, settings, repo, tmp_path):
        """A stale branch registered as checked out in a folder since deleted is kept, and the reason says the folder is gone."""
        import shutil

        task_worktree(settings, "old")
        git(repo, "worktree", "remove", str(settings.worktrees_dir / "old"))
        review = tmp_path / "review"
        git(repo, "worktree", "add", "-q", str(review), "overnight/old")
        shutil.rmtree(review)
        [kept] = collect_garbage(settings).kept_branches
        assert kept.reason == f"checked out at {review}, a folder that no longer exists (`git worktree prune` forgets it)"


class TestGitRefuses:
    """What git refuses for one worktree or branch keeps that one, with git's reason; gc goes on with the rest."""

    @pytest.mark.parametrize("force", [False, True])
    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_locked_worktree_is_kept_and_the_others_collected(self, settings, repo, dry_run, force):
        """A stale worktree the user locked stays with the lock's reason, dry run or not, even with force; the others go."""
        first = task_worktree(settings, "a-done")
        locked = task_worktree(settings, "b-reviewing")
        last = task_worktree(settings, "c-done")
        git(repo, "worktree", "lock", "--reason", "reviewing on my laptop", str(locked.path))
        result = collect_garbage(settings, dry_run=dry_run, force=force)
        assert result.removed_worktrees == (first.path, last.path)
        assert [(k.path, k.reason) for k in result.kept_worktrees] == [(locked.path, "locked: reviewing on my laptop")]
        assert result.removed_branches == ("overnight/a-done", "overnight/c-done")
        assert [(k.branch, k.reason) for k in result.kept_branches] == [("overnight/b-reviewing", f"checked out at {locked.path}")]
        assert locked.path.exists() and "overnight/b-reviewing" in branches(repo)
        assert last.path.exists() == dry_run

    @pytest.mark.parametrize("stderr", ["fatal:", "error:  \n", ""])
    def test_a_git_failure_that_says_nothing_still_has_a_reason(self, stderr):
        """git failing with no words after its "fatal:" still gives a reason: an empty one would count the branch or worktree as removed."""
        from orchestrator.gc_git import GcGit

        failed = GcGit(Path("."))._failed(("branch", "-D"), stderr)
        assert failed.detail and failed.detail in str(failed)

    def test_read_only_files_are_made_writable_and_the_worktree_removed(self):
        """A stale worktree holding a read-only cache (Go's module cache) is removed on the second try, made writable."""
        from tests.test_hostile_git import as_an_ordinary_user

        done = as_an_ordinary_user(READ_ONLY_CACHE)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["lines"][0].startswith("removed worktree") and "removed branch overnight/go" in report["lines"]
        assert not report["left"]

    @pytest.mark.parametrize("force", [False, True])
    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_branch_being_rebased_is_kept(self, settings, repo, dry_run, force):
        """A stale branch the user is rebasing in their checkout (stopped on a conflict) stays, named so, dry run or not."""
        old = task_worktree(settings, "old")
        (old.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        old.commit("agent fix")
        git(repo, "worktree", "remove", str(old.path))
        (repo / "greet.py").write_text("def greet():\n    return 'HELLO'\n")
        git(repo, "commit", "-qam", "user change")
        rebase = subprocess.run(["git", "rebase", "main", "overnight/old"], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True)
        assert "CONFLICT" in rebase.stdout, rebase.stderr
        result = collect_garbage(settings, dry_run=dry_run, force=force)
        assert result.removed_branches == ()
        assert [(k.branch, k.reason) for k in result.kept_branches] == [("overnight/old", f"checked out at {repo} (a rebase in progress)")]
        assert "overnight/old" in branches(repo)


class TestBadInput:
    def test_repo_path_that_is_a_file_is_one_line_and_exit_2(self, tmp_path):
        """`[repo] path` naming a file is one stderr line and exit 2, as for `overnight run`, never a traceback."""
        not_a_repo = tmp_path / "file.txt"
        not_a_repo.write_text("not a repository\n")
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=not_a_repo, tasks=[CURRENT])
        result = overnight("gc", "--config", str(config))
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [f"overnight: error: [repo] path: {not_a_repo} is not a git repository"]
        assert not_a_repo.read_text() == "not a repository\n"

    def test_a_base_that_names_no_commit_is_one_line_and_exit_2(self, tmp_path, repo):
        """A `[repo] base` renamed away since the night is the line `overnight run` gives, not the whole history "not merged"."""
        task_worktree(load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])), "done", commit=True)
        git(repo, "merge", "-q", "overnight/done")
        git(repo, "branch", "-m", "main", "trunk")
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[CURRENT])
        config.write_text(config.read_text().replace("[repo]\n", '[repo]\nbase = "main"\n'))
        result = overnight("gc", "--config", str(config))
        assert result.returncode == 2, result.stdout
        assert result.stderr.splitlines() == [f"overnight: error: [repo] base: 'main' is not a branch, tag or commit in {repo}"]
        assert "overnight/done" in branches(repo)


class TestInheritedGitVariables:
    def test_an_inherited_git_dir_does_not_send_gc_to_another_repository(self, settings, repo, tmp_path, monkeypatch):
        """GIT_DIR exported by a hook or a shell's dotfiles names another repository: gc collects
        the configured repository's stale task and leaves the other's `overnight/` branch alone."""
        old = task_worktree(settings, "old")
        other = make_repo(tmp_path / "other", {"o.txt": "o\n"})
        git(other, "branch", "overnight/release-notes")
        monkeypatch.setenv("GIT_DIR", str(other / ".git"))
        monkeypatch.setenv("GIT_WORK_TREE", str(other))
        result = collect_garbage(settings)
        assert result.removed_branches == ("overnight/old",) and not old.path.exists()
        monkeypatch.delenv("GIT_DIR")
        monkeypatch.delenv("GIT_WORK_TREE")
        assert "overnight/release-notes" in branches(other)

    def test_the_cli_drops_them_for_every_command(self, settings, repo, tmp_path):
        """Through `overnight gc` as a hook would start it: the same."""
        task_worktree(settings, "old")
        other = make_repo(tmp_path / "other", {"o.txt": "o\n"})
        git(other, "branch", "overnight/release-notes")
        result = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "gc", "--config", str(settings.source)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
            env={**os.environ, "NO_COLOR": "1", "GIT_DIR": str(other / ".git"), "GIT_INDEX_FILE": str(other / ".git" / "index")},
        )
        assert result.returncode == 0, result.stderr
        assert "overnight/old" not in branches(repo)
        assert "overnight/release-notes" in branches(other)



class TestAPersonsOwnThingsInTheStateDir:
    """A state dir such as `~/code` also holds a person's own `worktrees/` and `transcripts/`: a night and gc touch
    only what overnight made there (found by a review: each of these was deleted, rolled back or removed)."""

    @staticmethod
    def their_worktrees(repo: Path, state: Path) -> tuple[Path, Path]:
        """A worktree of theirs on a branch of theirs, with an edit, and a clean detached one, in `state`'s worktrees/."""
        feature, experiment = state / "worktrees" / "feature-x", state / "worktrees" / "experiment"
        git(repo, "worktree", "add", "-q", "-b", "feature-x", str(feature))
        (feature / "greet.py").write_text("# my edit\n")
        git(repo, "worktree", "add", "-q", "--detach", str(experiment))
        return feature, experiment

    def test_their_worktrees_survive_a_night_and_a_gc(self, tmp_path, repo):
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        feature, experiment = self.their_worktrees(repo, tmp_path / "state")
        night = overnight("run", "--config", str(config), "--log-format", "json")
        assert night.returncode == 3, night.stderr  # the model's closed port: the night's start ran
        kept = [json.loads(line).get("task") for line in night.stderr.splitlines() if '"worktree_folder_kept"' in line]
        assert sorted(kept) == ["experiment", "feature-x"]
        done = overnight("gc", "--config", str(config))
        assert (done.returncode, done.stdout.strip()) == (0, "nothing to collect"), done.stderr
        assert (feature / "greet.py").read_text() == "# my edit\n" and git(feature, "branch", "--show-current") == "feature-x"
        assert {str(feature), str(experiment)} <= worktree_paths(repo)
        assert {branch for branch in branches(repo) if branch.startswith("overnight")} == {"overnight/fix-greet"}

    def test_their_worktree_of_a_clone_since_deleted_stays_where_it_is(self, tmp_path, repo):
        """A worktree of another repository that is gone, named as no task: it was moved to worktrees-set-aside/ and its
        `.git` link deleted, as a configured task's is to be made anew."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        clone = make_repo(tmp_path / "clone", {"a.txt": "a\n"})
        theirs = tmp_path / "state" / "worktrees" / "old-experiment"
        git(clone, "worktree", "add", "-q", "--detach", str(theirs))
        (theirs / "a.txt").write_text("my edit\n")
        shutil.rmtree(clone)
        night = overnight("run", "--config", str(config), "--log-format", "json")
        assert night.returncode == 3, night.stderr
        assert '"worktree_folder_kept"' in night.stderr and not (tmp_path / "state" / "worktrees-set-aside").exists()
        assert (theirs / "a.txt").read_text() == "my edit\n" and (theirs / ".git").is_file()

    def test_gc_leaves_their_clean_detached_worktree(self, settings, repo):
        """Detached at a commit base has, it looked like a stale task's worktree detached for a review."""
        _, experiment = self.their_worktrees(repo, settings.state_dir)
        assert collect_garbage(settings).lines() == ["nothing to collect"] and str(experiment) in worktree_paths(repo)

    def test_their_jsonl_files_survive_a_night_that_deletes_old_transcripts(self, tmp_path, repo):
        """Files not named as overnight names its transcripts stay, however old; overnight's own old one goes."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_transcripts_days": 1})
        folder = tmp_path / "state" / "transcripts"
        folder.mkdir(parents=True)
        theirs = [folder / name for name in ("meeting.jsonl", "task-run-7-standup.jsonl", "task-run-x-fix-1.jsonl")]
        ours = folder / "task-run-1-fix-greet-1.2.jsonl"
        for file in [*theirs, ours]:
            file.write_text("{}\n")
            os.utime(file, (1e9, 1e9))
        night = overnight("run", "--config", str(config))
        assert night.returncode == 3, night.stderr
        assert "transcripts_removed" in night.stderr and all(file.is_file() for file in theirs) and not ours.exists()
