"""What the agent may do to git in its worktree, and what overnight's own git must still do:
work on that worktree and its branch only, never on the user's checkout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import git as gitpython
import pytest

from orchestrator.errors import QualityError, StateError
from orchestrator.scripted import call
from orchestrator.worktree import Worktree
from tests.conftest import GIT_ENV, git, make_repo, write_config
from tests.test_night import overnight, report_json
from tests.test_secrecy import json_events

USER_WORK = "def greet():\n    return 'USER UNCOMMITTED WORK'\n"


def dirty(repo: Path) -> None:
    """The user is mid-work: a change on disk, a change staged, a file git does not know yet."""
    (repo / "greet.py").write_text(USER_WORK)
    (repo / "staged.txt").write_text("staged by the user\n")
    git(repo, "add", "staged.txt")
    (repo / "user_notes.txt").write_text("mine\n")


def user_state(repo: Path) -> tuple[str, ...]:
    return (
        git(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/main", "refs/heads/feature"),
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "status", "--porcelain", "--untracked-files=all"),
        git(repo, "diff", "--cached"),
        (repo / "greet.py").read_text(),
    )


def break_link(tree: Worktree, repo: Path, how: str) -> None:
    link = tree.path / ".git"
    if how == "deleted":
        link.unlink()
    elif how == "naming the user's .git":
        link.write_text(f"gitdir: {repo / '.git'}\n")
    elif how == "a symlink to the user's .git":
        link.unlink()
        link.symlink_to(repo / ".git")
    else:  # "a new repository": `rm -rf .git && git init`
        link.unlink()
        git(tree.path, "init", "-q")


BREAKAGES = ["deleted", "naming the user's .git", "a symlink to the user's .git", "a new repository"]


class TestBrokenLink:
    """The agent deleted or rewrote its worktree's `.git` link file; git's discovery would lead to the user's checkout."""

    @pytest.mark.parametrize("how", BREAKAGES)
    def test_rollback_resets_the_worktree_not_the_users_checkout(self, repo: Path, how: str) -> None:
        """With the state dir inside the checkout, rollback still resets only the worktree, and the link comes back."""
        tree = Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
        (tree.path / "a.txt").write_text("1\n")
        checkpoint = tree.commit("overnight: fix iteration 1")  # the branch is now ahead of the user's main
        dirty(repo)
        before = user_state(repo)
        (tree.path / "greet.py").write_text("agent's\n")
        (tree.path / "junk.txt").write_text("junk\n")
        break_link(tree, repo, how)
        tree.rollback(checkpoint)
        assert user_state(repo) == before
        assert git(tree.path, "rev-parse", "--absolute-git-dir").startswith(str(repo / ".git" / "worktrees"))
        assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix" and tree.idle_state() == "clean"
        assert git(tree.path, "rev-parse", "HEAD") == checkpoint and not (tree.path / "junk.txt").exists()

    @pytest.mark.parametrize("how", BREAKAGES)
    def test_commit_lands_on_the_task_branch_not_on_the_users(self, repo: Path, how: str) -> None:
        """The agent's work is committed on overnight/<task> from the worktree's files; main and the user's index are untouched."""
        tree = Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
        start = tree.checkpoint()
        dirty(repo)
        before = user_state(repo)
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        break_link(tree, repo, how)
        made = tree.commit("overnight: fix iteration 1")
        assert user_state(repo) == before
        assert git(repo, "rev-parse", "overnight/fix") == made != start
        assert git(repo, "show", "--name-only", "--format=", made) == "greet.py"
        assert tree.idle_state() == "clean" and git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix"

    def test_git_variables_overnight_inherited_do_not_lead_its_commit_to_the_users_index(self, repo: Path, monkeypatch: Any) -> None:
        """Started from a git hook (GIT_INDEX_FILE, GIT_DIR set): the commit is made from the worktree, the user's index untouched."""
        Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
        dirty(repo)
        before = user_state(repo)
        for name, value in {"GIT_DIR": repo / ".git", "GIT_INDEX_FILE": repo / ".git" / "index", "GIT_PREFIX": "sub/"}.items():
            monkeypatch.setenv(name, str(value))
        tree = Worktree(repo / ".overnight" / "worktrees" / "fix", "overnight/fix")  # as the night opens it, with that environment
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        made = tree.commit("overnight: fix iteration 1")
        monkeypatch.undo()
        assert user_state(repo) == before
        assert git(repo, "show", "--name-only", "--format=", made) == "greet.py" and tree.idle_state() == "clean"

    def test_a_worktree_opened_again_after_the_link_was_deleted_is_found_and_repaired(self, repo: Path) -> None:
        """Recovery opens a worktree by its folder alone: the registration in the repository above it is found by its back link."""
        tree = Worktree.ensure(repo, repo / ".overnight", "fix", "HEAD")
        checkpoint = tree.checkpoint()
        dirty(repo)
        before = user_state(repo)
        (tree.path / "greet.py").write_text("agent's\n")
        (tree.path / ".git").unlink()
        Worktree(tree.path, "overnight/fix").rollback(checkpoint)
        assert user_state(repo) == before
        assert git(tree.path, "rev-parse", "HEAD") == checkpoint and tree.idle_state() == "clean"

    def test_a_worktree_opened_again_with_its_link_naming_the_users_repository(self, repo: Path, tmp_path: Path) -> None:
        """A link rewritten to name the user's `.git` leads to the repository, where the worktree's own registration is found."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        (tree.path / "a.txt").write_text("1\n")
        checkpoint = tree.commit("overnight: fix iteration 1")
        dirty(repo)
        before = user_state(repo)
        (tree.path / ".git").write_text(f"gitdir: {repo / '.git'}\n")
        Worktree(tree.path, "overnight/fix").rollback(checkpoint)
        assert user_state(repo) == before
        assert git(tree.path, "rev-parse", "HEAD") == checkpoint and tree.idle_state() == "clean"

    def test_a_worktree_whose_registration_cannot_be_found_is_refused(self, repo: Path, tmp_path: Path) -> None:
        """No link and no repository above the folder: StateError, and no git runs anywhere."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        dirty(repo)
        before = user_state(repo)
        (tree.path / ".git").unlink()
        with pytest.raises(StateError, match="no repository registers it"):
            Worktree(tree.path, "overnight/fix")
        assert user_state(repo) == before

    def test_the_next_night_finds_the_worktree_whose_link_was_deleted(self, repo: Path, tmp_path: Path) -> None:
        """ensure repairs the link of a registered worktree instead of failing to register the folder again."""
        state = tmp_path / "state"
        tree = Worktree.ensure(repo, state, "fix", "HEAD")
        (tree.path / "a.txt").write_text("1\n")
        made = tree.commit("overnight: fix iteration 1")
        (tree.path / ".git").unlink()
        again = Worktree.ensure(repo, state, "fix", "HEAD")
        assert again.checkpoint() == made and again.idle_state() == "clean"
        assert git(again.path, "rev-parse", "HEAD") == made


class TestNight:
    """The whole CLI, with the state dir inside the user's checkout and the user's work uncommitted."""

    def config(self, repo: Path, server: Any) -> Path:
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["edit_file", "run_command", "submit"]}
        config = write_config(repo / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night={"max_iterations": 1})
        dirty(repo)
        return config

    def test_an_agent_that_deletes_the_link_then_fixes_the_bug(self, repo: Path, server: Any) -> None:
        """The fix is committed on overnight/fix-greet; the user's main, index and files stay as they were."""
        config = self.config(repo, server)
        before = user_state(repo)
        server.enqueue(
            call("run_command", {"command": "rm .git"}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": "fixed"}),
        )
        assert overnight("run", "--config", str(config)) == 0
        assert user_state(repo) == before
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_an_agent_that_deletes_the_link_then_fails_the_check(self, repo: Path, server: Any) -> None:
        """The rollback resets the worktree only: the user's uncommitted work survives."""
        config = self.config(repo, server)
        before = user_state(repo)
        server.enqueue(call("run_command", {"command": "rm .git"}), call("submit", {"summary": "done"}))
        assert overnight("run", "--config", str(config)) == 1
        assert user_state(repo) == before
        worktree = repo / "state" / "worktrees" / "fix-greet"
        assert subprocess.run(["git", "symbolic-ref", "HEAD"], cwd=worktree, capture_output=True, text=True).stdout.strip() == "refs/heads/overnight/fix-greet"


class TestWorktreeMoved:
    def test_a_worktree_the_agent_moved_is_back_in_its_place_after_rollback_and_the_next_night(self, repo: Path, tmp_path: Path) -> None:
        """`git worktree move . ../moved` moves the folder and the registration's link with it."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        checkpoint = tree.checkpoint()
        git(tree.path, "worktree", "move", ".", "../moved")
        tree.rollback(checkpoint)
        assert tree.idle_state() == "clean" and (tree.path / "greet.py").exists()
        again = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")  # the next night
        assert again.checkpoint() == checkpoint and again.idle_state() == "clean"
        assert f"{tree.path} " in git(repo, "worktree", "list")


class TestHeadMoved:
    """The agent left HEAD off the task's branch; overnight's commit must still land on overnight/<task>."""

    @pytest.mark.parametrize("left_by_the_agent", ["the user's branch", "a detached HEAD", "rebase stopped half way"])
    def test_commit_lands_on_the_task_branch_with_the_worktree_as_it_is(self, repo: Path, tmp_path: Path, left_by_the_agent: str) -> None:
        """HEAD goes back to overnight/<task> first: the commit holds the worktree's files, its parent the branch's tip."""
        git(repo, "checkout", "-q", "-b", "feature")
        (repo / "feature.txt").write_text("the user's feature\n")
        git(repo, "add", "feature.txt")
        git(repo, "commit", "-qm", "feature")
        git(repo, "checkout", "-q", "main")
        before = user_state(repo)
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        start = tree.checkpoint()
        if left_by_the_agent == "the user's branch":
            git(tree.path, "switch", "-q", "feature")
        elif left_by_the_agent == "a detached HEAD":
            git(tree.path, "switch", "-q", "--detach")
        else:
            (tree.path / "a.txt").write_text("1\n")
            git(tree.path, "add", "a.txt")
            git(tree.path, "commit", "-qm", "agent 1")
            subprocess.run(["git", "rebase", "-q", "-i", start], cwd=tree.path, check=True, capture_output=True,
                           env={**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i 's/^pick/edit/'"})
        tip = git(repo, "rev-parse", "overnight/fix")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        made = tree.commit("overnight: fix iteration 1")
        assert user_state(repo) == before  # the user's feature branch did not move
        assert git(repo, "rev-parse", "overnight/fix") == made and git(repo, "rev-parse", f"{made}~1") == tip
        assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix" and tree.idle_state() == "clean"
        assert "rebase" not in git(tree.path, "status")
        assert "return 'hello'" in git(repo, "show", f"{made}:greet.py")

    @pytest.mark.parametrize("moved_by_the_agent", ["reset behind the checkpoint", "checkpoint amended", "branch deleted", "reset to the user's branch"])
    def test_commit_keeps_the_checkpoint_in_the_task_branch(self, repo: Path, tmp_path: Path, moved_by_the_agent: str) -> None:
        """Work committed by an earlier night stays on the branch, whatever the agent did to the branch; the
        new commit holds the worktree as the check saw it, on top of the checkpoint."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        (tree.path / "earlier.txt").write_text("an earlier night's work\n")
        start = tree.commit("overnight: fix iteration 1")
        if moved_by_the_agent == "reset behind the checkpoint":
            git(tree.path, "reset", "-q", "--hard", "HEAD~1")
        elif moved_by_the_agent == "checkpoint amended":
            git(tree.path, "commit", "-q", "--amend", "-m", "better words")
        elif moved_by_the_agent == "branch deleted":
            git(tree.path, "switch", "-q", "-c", "scratch")
            git(tree.path, "branch", "-q", "-D", "overnight/fix")
        else:
            git(tree.path, "reset", "-q", "--hard", "main")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        made = tree.commit("overnight: fix iteration 2", onto=start)
        assert git(repo, "rev-parse", "overnight/fix") == made and git(repo, "rev-parse", f"{made}~1") == start
        assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix" and tree.idle_state() == "clean"
        assert "return 'hello'" in git(repo, "show", f"{made}:greet.py")
        # What the agent's reset removed from the files is removed in the commit too: the diff says so in the morning.
        removed = moved_by_the_agent in ("reset behind the checkpoint", "reset to the user's branch")
        assert removed == ("earlier.txt" not in git(repo, "ls-tree", "--name-only", made))

    def test_commits_the_agent_made_on_the_checkpoint_stay(self, repo: Path, tmp_path: Path) -> None:
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        start = tree.checkpoint()
        (tree.path / "a.txt").write_text("1\n")
        git(tree.path, "add", "a.txt")
        git(tree.path, "commit", "-qm", "the agent's own commit")
        own = git(tree.path, "rev-parse", "HEAD")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        made = tree.commit("overnight: fix iteration 1", onto=start)
        assert git(repo, "rev-parse", f"{made}~1") == own and git(repo, "rev-parse", f"{made}~2") == start

    def test_a_night_whose_agent_resets_the_branch_keeps_the_earlier_nights_commit(self, repo: Path, server: Any, tmp_path: Path, capsys: Any) -> None:
        """Night 1 commits; night 2's agent runs `git reset --hard main` and still passes: night 1's commit stays on the branch."""
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["edit_file", "run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task])
        server.enqueue(call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"}))
        assert overnight("run", "--config", str(config)) == 0
        first = git(repo, "rev-parse", "overnight/fix-greet")
        server.enqueue(
            call("run_command", {"command": "git reset --hard main"}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": "fixed again"}),
        )
        assert overnight("run", "--config", str(config)) == 0
        subprocess.run(["git", "merge-base", "--is-ancestor", first, "overnight/fix-greet"], cwd=repo, check=True)
        # Night 2 redid what night 1 had committed: the branch is as it was, and night 2 names no commit of its own.
        assert git(repo, "rev-parse", "overnight/fix-greet") == first
        assert report_json(config, capsys)["tasks"][0]["commit"] is None


# What the agent's commands leave under way in its worktree, each after a commit of its own that changes greet.py
# (so that the user's `feature`, greet.py made 'hi' by another author, conflicts).
MINE = "sed -i s/helo/hullo/ greet.py && git commit -qam mine && "
LEFT_UNDER_WAY = {
    "merge --no-commit": "git merge -q --no-commit --no-ff other",
    "conflicted merge": MINE + "git merge -q feature",
    "conflicted cherry-pick": MINE + "git cherry-pick feature",
    "cherry-pick of two, stopped at the first": MINE + "git cherry-pick feature other",
    "conflicted revert": MINE + "sed -i s/hullo/hallo/ greet.py && git commit -qam mine2 && git revert --no-edit HEAD~1",
    "rebase stopped at a conflict": MINE + "git rebase -q feature",
    "am stopped at a conflict": MINE + "git format-patch -1 --stdout feature | git am -q -3",
    "bisect": "git bisect start",
    # `git bisect reset HEAD` checks HEAD out: refused on an index with a conflict, and with no branch to check out.
    "bisect, then a conflicted cherry-pick": "git bisect start && " + MINE + "git cherry-pick feature",
    "bisect, then the branch deleted": "git bisect start && git update-ref -d HEAD",
    # No operation behind it: `git cherry-pick --quit` cannot remove a file where it keeps a folder.
    "a sequencer file written by hand": 'touch "$(git rev-parse --git-dir)/sequencer"',
    "stash": "echo wip >> greet.py && git stash",
}
# What git keeps in a worktree's own git dir while each operation is under way.
UNDER_WAY_MARKERS = (
    "MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "sequencer", "rebase-merge", "rebase-apply", "BISECT_START", "BISECT_LOG"
)
FIX_GREET = "printf '%s\\n' 'def greet():' \"    return 'hello'\" > greet.py"


class TestOperationLeftUnderWay:
    """The agent's git left a merge, cherry-pick, revert, rebase or bisect under way (or tried `git stash`): the iteration
    rolled back over it and the one committed after it each end with an ordinary one-parent commit of overnight's, of the
    worktree's files, and nothing under way in the worktree."""

    @pytest.fixture
    def night(self, repo: Path, server: Any, tmp_path: Path) -> Path:
        other_and_feature_branches(repo, "--author", "A Person <person@example.com>")
        return self.config(repo, server, tmp_path, iterations=2)

    def config(self, repo: Path, server: Any, tmp_path: Path, iterations: int) -> Path:
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}
        night = {"max_iterations": iterations}
        return write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night=night)

    @pytest.mark.parametrize("left", list(LEFT_UNDER_WAY))
    def test_rolled_back_then_committed(self, repo: Path, server: Any, night: Path, capsys: Any, left: str) -> None:
        """Iteration 1 leaves the operation and fails its check; iteration 2 does it again, fixes greet.py and passes."""
        server.enqueue(
            call("run_command", {"command": LEFT_UNDER_WAY[left]}), call("submit", {"summary": "not yet"}),
            call("run_command", {"command": f"{LEFT_UNDER_WAY[left]}; {FIX_GREET}"}), call("submit", {"summary": "fixed"}),
        )
        assert overnight("run", "--config", str(night)) == 0
        made = git(repo, "rev-parse", "overnight/fix-greet")
        assert len(git(repo, "rev-list", "--parents", "-n1", made).split()) == 2  # the commit and its one parent
        assert git(repo, "log", "-1", "--format=%an %s", made) == "overnight overnight: fix-greet iteration 2"
        assert "return 'hello'" in git(repo, "show", f"{made}:greet.py")
        worktree = night.parent / "state" / "worktrees" / "fix-greet"
        admin = Path(git(worktree, "rev-parse", "--absolute-git-dir"))
        assert [marker for marker in UNDER_WAY_MARKERS if (admin / marker).exists()] == []
        assert git(worktree, "status", "--porcelain") == "" and git(repo, "stash", "list") == ""

    @pytest.mark.parametrize("left", ["merge --no-commit", "cherry-pick of two, stopped at the first", "bisect"])
    def test_rolled_back_alone(self, repo: Path, server: Any, night: Path, tmp_path: Path, capsys: Any, left: str) -> None:
        """The rollback leaves the worktree at its checkpoint with nothing under way, and logs what it dropped: `git reset
        --hard` alone ended a merge but left a cherry-pick's sequencer (the next iteration's own cherry-pick failed) and a bisect."""
        server.enqueue(call("run_command", {"command": LEFT_UNDER_WAY[left]}), call("submit", {"summary": "not yet"}))
        assert overnight("run", "--config", str(self.config(repo, server, tmp_path, iterations=1))) == 1
        worktree = night.parent / "state" / "worktrees" / "fix-greet"
        admin = Path(git(worktree, "rev-parse", "--absolute-git-dir"))
        assert [marker for marker in UNDER_WAY_MARKERS if (admin / marker).exists()] == []
        assert git(worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")
        assert git(worktree, "status", "--porcelain") == ""
        [dropped] = json_events(capsys.readouterr().err, "worktree_operation_dropped")
        assert (dropped["task"], dropped["before"]) == ("fix-greet", "rollback")

    def test_a_merge_dropped_from_the_commit_is_told_in_its_message_and_the_log(
        self, repo: Path, server: Any, night: Path, capsys: Any
    ) -> None:
        """The morning's reader of the branch learns which merge the agent left and that its commit has one parent."""
        server.enqueue(
            call("run_command", {"command": f"{LEFT_UNDER_WAY['merge --no-commit']} && {FIX_GREET}"}),
            call("submit", {"summary": "fixed"}),
        )
        assert overnight("run", "--config", str(night)) == 0
        other = git(repo, "rev-parse", "other")[:12]
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        assert message.startswith("overnight: fix-greet iteration 1\n\nfixed\n\n") and f"merge of {other}" in message
        [dropped] = json_events(capsys.readouterr().err, "worktree_operation_dropped")
        assert (dropped["task"], dropped["operations"], dropped["before"]) == ("fix-greet", [f"merge of {other}"], "commit")

    def test_a_bisect_left_on_an_older_commit_undoes_nothing_of_the_branch(
        self, repo: Path, server: Any, night: Path, capsys: Any
    ) -> None:
        """Night 2's agent bisects (HEAD on an older commit of the branch), fixes greet.py there and passes the check
        without `git bisect reset`: the iteration is rolled back with a note saying why, the branch keeps night 1's
        commits and files, where its commit on the branch's tip held the older commit's files and undid night 1's."""
        own_commit_then_fix = f"echo 1 > one.txt && git add one.txt && git commit -qm one && {FIX_GREET} && date > two.txt"
        server.enqueue(call("run_command", {"command": own_commit_then_fix}), call("submit", {"summary": "fixed"}))
        assert overnight("run", "--config", str(self.config(repo, server, night.parent, iterations=1))) == 0
        first = git(repo, "rev-parse", "overnight/fix-greet")
        server.enqueue(
            call("run_command", {"command": f"git bisect start HEAD main && {FIX_GREET}"}),
            call("submit", {"summary": "fixed on the bisection's commit"}),
        )
        capsys.readouterr()
        assert overnight("run", "--config", str(self.config(repo, server, night.parent, iterations=1))) == 1
        assert git(repo, "rev-parse", "overnight/fix-greet") == first
        assert {"one.txt", "two.txt"} <= set(git(repo, "ls-tree", "--name-only", first).split())
        notes = (night.parent / "state" / "notes.md").read_text()
        assert "git bisect reset" in notes
        worktree = night.parent / "state" / "worktrees" / "fix-greet"
        assert git(worktree, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix-greet"
        assert git(worktree, "status", "--porcelain") == ""
        [dropped] = json_events(capsys.readouterr().err, "worktree_operation_dropped")
        assert (dropped["operations"], dropped["before"]) == (["bisect"], "rollback")


def other_and_feature_branches(repo: Path, *feature_options: str) -> None:
    """The user's branch `other` (a new file) and `feature` (greet.py changed), both off main, main checked out again:
    what the agent's merges, picks and rebases take from."""
    git(repo, "switch", "-q", "-c", "other")
    (repo / "other.txt").write_text("the user's other work\n")
    git(repo, "add", "other.txt")
    git(repo, "commit", "-qm", "other")
    git(repo, "switch", "-q", "-c", "feature", "main")
    (repo / "greet.py").write_text("def greet():\n    return 'hi'\n")
    git(repo, "commit", "-qam", "feature", *feature_options)
    git(repo, "switch", "-q", "main")


def commit_file(folder: Path, name: str) -> None:
    """`name`, holding its name, added and committed in `folder`."""
    (folder / name).write_text(f"{name}\n")
    git(folder, "add", name)
    git(folder, "commit", "-qm", name)


# Several commits picked or reverted, stopped at a conflict, then `git reset --hard`, which leaves git's sequencer alone.
SEQUENCE_GIVEN_UP = {
    "cherry-pick": MINE + "git cherry-pick feature other; git reset -q --hard",
    "revert": MINE + "sed -i s/hullo/hallo/ greet.py && git commit -qam mine2 && git revert --no-edit HEAD~1 HEAD; "
    "git reset -q --hard",
}


class TestOperationLeftUnderWayInTheWorktree:
    """What the agent's git left under way, as the commit sees it in the worktree."""

    def worktree(self, repo: Path, tmp_path: Path) -> tuple[Worktree, Path]:
        other_and_feature_branches(repo)
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        return tree, Path(git(tree.path, "rev-parse", "--absolute-git-dir"))

    @pytest.mark.parametrize("operation", list(SEQUENCE_GIVEN_UP))
    def test_a_sequence_given_up_is_named_by_what_it_was(self, repo: Path, tmp_path: Path, operation: str) -> None:
        """The commit's message names a revert of several commits a revert, where it said cherry-pick (git keeps one
        sequencer for both; its todo's steps say which)."""
        tree, admin = self.worktree(repo, tmp_path)
        checkpoint = tree.checkpoint()
        given_up = SEQUENCE_GIVEN_UP[operation]
        subprocess.run(["sh", "-c", given_up], cwd=tree.path, env={**os.environ, **GIT_ENV}, capture_output=True)
        assert os.path.isdir(admin / "sequencer") and not os.path.lexists(admin / "REVERT_HEAD")
        (tree.path / "greet.py").write_text(FIXED_GREET)
        made = tree.commit("overnight: fix iteration 1", onto=checkpoint)
        assert f"Left under way by the agent's git and dropped: {operation}. " in git(tree.path, "log", "-1", "--format=%B", made)

    @pytest.mark.parametrize("branched", ["git switch -q -c tryfix", "git checkout -q -b tryfix"])
    def test_a_bisect_left_on_a_branch_made_at_its_older_commit_is_not_committed(
        self, repo: Path, tmp_path: Path, branched: str
    ) -> None:
        """A bisect whose older commit the agent put on a branch of its own (HEAD no longer detached) is refused and rolled
        back as the detached one is, where its commit on the task branch undid the later commit (later.txt deleted)."""
        tree = self.worktree(repo, tmp_path)[0]
        for name in ("earlier.txt", "later.txt"):
            commit_file(tree.path, name)
        self.assert_refused_then_rolled_back(tree, f"git bisect start HEAD main && {branched}")

    def test_a_bisect_of_the_agents_own_commits_left_on_an_older_one_is_not_committed(self, repo: Path, tmp_path: Path) -> None:
        """The agent bisects the commits it made this iteration and fixes greet.py on the older one: refused and rolled back,
        where the commit on the branch's tip (its own later commit) held the older one's files and undid later.txt."""
        tree = self.worktree(repo, tmp_path)[0]
        left = "echo 1 > earlier.txt && git add earlier.txt && git commit -qm earlier && echo 2 > later.txt && "
        left += "git add later.txt && git commit -qm later && git bisect start HEAD HEAD~2"
        self.assert_refused_then_rolled_back(tree, left)

    def assert_refused_then_rolled_back(self, tree: Worktree, left: str) -> None:
        """After `left` and a fix of greet.py, the commit is refused (`iteration_error`, telling the agent to end its bisect)
        and the rollback puts the worktree back on the branch, at the checkpoint, clean."""
        checkpoint = tree.checkpoint()
        subprocess.run(["sh", "-c", left], cwd=tree.path, env={**os.environ, **GIT_ENV}, capture_output=True, check=True)
        (tree.path / "greet.py").write_text(FIXED_GREET)
        with pytest.raises(QualityError) as refused:
            tree.commit("overnight: fix iteration 1", onto=checkpoint)
        assert refused.value.reason == "iteration_error" and "git bisect reset" in refused.value.correction
        tree.rollback(checkpoint)
        assert git(tree.path, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix"
        assert git(tree.path, "rev-parse", "HEAD") == checkpoint and git(tree.path, "status", "--porcelain") == ""

    def test_a_rebase_given_up_leaves_no_message_for_the_next_commit(self, repo: Path, tmp_path: Path) -> None:
        """A rebase stopped at a conflict, greet.py put back as the branch has it, so that overnight commits nothing: the
        picked commit's message git kept (MERGE_MSG, which `rebase --quit` leaves) goes, where the next `git commit`
        without -m (the agent's editor is `true`) took it for its own message."""
        tree, admin = self.worktree(repo, tmp_path)
        checkpoint = tree.checkpoint()
        given_up = MINE + "git rebase -q feature; git checkout overnight/fix -- greet.py"
        subprocess.run(["sh", "-c", given_up], cwd=tree.path, env={**os.environ, **GIT_ENV}, capture_output=True)
        assert os.path.lexists(admin / "MERGE_MSG")
        mine = git(tree.path, "rev-parse", "overnight/fix")
        assert tree.commit("overnight: fix iteration 1", onto=checkpoint) == mine  # nothing new to commit
        assert [left for left in ("MERGE_MSG", "MERGE_MODE") if os.path.lexists(admin / left)] == []
        (tree.path / "greet.py").write_text(FIXED_GREET)
        agents_commit = subprocess.run(
            ["git", "commit", "-qa"], cwd=tree.path, env={**os.environ, **GIT_ENV, "GIT_EDITOR": "true"}, capture_output=True
        )
        assert agents_commit.returncode != 0 and git(tree.path, "rev-parse", "HEAD") == mine  # no message: no commit


# What the agent may put where git keeps an operation's state, with no operation of git's behind it (run in the git dir).
PLANTED = {
    "a sequencer file": "touch sequencer",
    "a rebase-merge file": "touch rebase-merge",
    "MERGE_HEAD a folder": "mkdir MERGE_HEAD",
    "CHERRY_PICK_HEAD a folder": "mkdir CHERRY_PICK_HEAD",
    "BISECT_START a folder": "mkdir BISECT_START",
}
FIXED_GREET = "def greet():\n    return 'hello'\n"


class TestOperationMarkersPlanted:
    """The agent wrote, by hand, what git keeps in the worktree's git dir while an operation is under way: the commit and
    the rollback still end with nothing under way, and touch nothing outside the worktree."""

    def worktree(self, repo: Path, tmp_path: Path) -> tuple[Worktree, Path]:
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        return tree, Path(git(tree.path, "rev-parse", "--absolute-git-dir"))

    @pytest.mark.parametrize("planted", list(PLANTED))
    def test_commit_goes_on_with_nothing_left_under_way(self, repo: Path, tmp_path: Path, planted: str) -> None:
        """Where git refuses its quit (no rebase, a sequencer it cannot remove) or leaves the marker, the marker is removed:
        the commit is overnight's, with one parent, where it failed (and every later one with it) or kept the marker."""
        tree, admin = self.worktree(repo, tmp_path)
        checkpoint = tree.checkpoint()
        subprocess.run(["sh", "-c", PLANTED[planted]], cwd=admin, check=True)
        (tree.path / "greet.py").write_text(FIXED_GREET)
        made = tree.commit("overnight: fix iteration 1", onto=checkpoint)
        assert git(tree.path, "log", "-1", "--format=%P %an", made) == f"{checkpoint} overnight"
        assert [marker for marker in UNDER_WAY_MARKERS if os.path.lexists(admin / marker)] == []

    @pytest.mark.parametrize("planted", list(PLANTED))
    def test_rollback_goes_on_with_nothing_left_under_way(self, repo: Path, tmp_path: Path, planted: str) -> None:
        """The rollback of the same worktree succeeds, where it failed (StateError: the night's exit 4) or kept the marker."""
        tree, admin = self.worktree(repo, tmp_path)
        checkpoint = tree.checkpoint()
        subprocess.run(["sh", "-c", PLANTED[planted]], cwd=admin, check=True)
        (tree.path / "greet.py").write_text(FIXED_GREET)
        tree.rollback(checkpoint)
        assert [marker for marker in UNDER_WAY_MARKERS if os.path.lexists(admin / marker)] == []
        assert git(tree.path, "status", "--porcelain") == ""

    @pytest.mark.parametrize("marker", ["sequencer", "rebase-merge", "rebase-apply"])
    def test_a_marker_linked_to_a_folder_outside_leaves_that_folder_as_it_was(
        self, repo: Path, tmp_path: Path, marker: str
    ) -> None:
        """The link is removed, never followed: git's own quit emptied the folder it led to, then failed the rollback."""
        tree, admin = self.worktree(repo, tmp_path)
        outside = tmp_path / "the user's folder"
        (outside / "sub").mkdir(parents=True)
        (outside / "notes.txt").write_text("mine\n")
        (admin / marker).symlink_to(outside)
        tree.rollback(tree.checkpoint())
        assert sorted(path.name for path in outside.rglob("*")) == ["notes.txt", "sub"]
        assert not os.path.lexists(admin / marker)

    def test_a_pipe_that_gits_quit_waits_on_costs_the_rollback_its_time_limit_only(self, repo: Path, tmp_path: Path) -> None:
        """`git rebase --quit` reads a rebase's autostash: a pipe there held it to the time limit, and the rollback failed
        (the night's exit 4); the killed quit's marker is removed instead."""
        tree, admin = self.worktree(repo, tmp_path)
        (admin / "rebase-merge").mkdir()
        os.mkfifo(admin / "rebase-merge" / "autostash")
        tree.git_timeout_s = 3
        tree.rollback(tree.checkpoint())
        assert not os.path.lexists(admin / "rebase-merge")

    def test_a_pipe_at_merge_head_is_not_waited_on(self, repo: Path, tmp_path: Path) -> None:
        """A MERGE_HEAD the agent made a pipe (`mkfifo`) is not read: the commit goes on, where it waited for a writer
        for ever."""
        tree, admin = self.worktree(repo, tmp_path)
        os.mkfifo(admin / "MERGE_HEAD")
        (tree.path / "greet.py").write_text(FIXED_GREET)
        made: list[str] = []
        committing = threading.Thread(target=lambda: made.append(tree.commit("overnight: fix iteration 1")), daemon=True)
        committing.start()
        committing.join(timeout=30)
        waited = committing.is_alive()
        if waited:  # a writer lets the reader go, or the thread would outlive the test
            os.close(os.open(admin / "MERGE_HEAD", os.O_WRONLY | os.O_NONBLOCK))
            committing.join()
        assert not waited and made and not os.path.lexists(admin / "MERGE_HEAD")

    def test_a_pipe_at_head_costs_the_commit_gits_time_limit_only(self, repo: Path, tmp_path: Path) -> None:
        """A HEAD the agent made a pipe fails the commit once git is killed at its time limit (git waits on it too), where
        overnight's own read of HEAD then waited for a writer for ever."""
        tree, admin = self.worktree(repo, tmp_path)
        checkpoint = tree.checkpoint()
        os.unlink(admin / "HEAD")
        os.mkfifo(admin / "HEAD")
        tree.git_timeout_s = 2
        failed: list[Exception] = []

        def commit() -> None:
            try:
                tree.commit("overnight: fix iteration 1", onto=checkpoint)
            except gitpython.GitCommandError as exc:
                failed.append(exc)

        committing = threading.Thread(target=commit, daemon=True)
        committing.start()
        committing.join(timeout=30)
        waited = committing.is_alive()
        while committing.is_alive():  # a writer lets each reader go, or the thread would outlive the test
            with contextlib.suppress(OSError):
                os.close(os.open(admin / "HEAD", os.O_WRONLY | os.O_NONBLOCK))
            committing.join(timeout=1)
        assert not waited and failed

    def test_a_large_merge_head_is_read_no_further_than_its_start(self, repo: Path, tmp_path: Path) -> None:
        """A MERGE_HEAD of 64 MiB costs the commit far less memory than its size (it was read whole), the commit it
        names first still told in the message."""
        tree, admin = self.worktree(repo, tmp_path)
        named = git(repo, "rev-parse", "HEAD")
        (admin / "MERGE_HEAD").write_bytes(f"{named}\n".encode() + b"x" * (64 << 20))
        (tree.path / "greet.py").write_text(FIXED_GREET)
        tracemalloc.start()
        try:
            made = tree.commit("overnight: fix iteration 1")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20
        assert f"merge of {named[:12]}" in git(tree.path, "log", "-1", "--format=%B", made)


class TestHiddenFiles:
    """The agent hid a change from git with `git update-index --skip-worktree` or `--assume-unchanged`."""

    @pytest.mark.parametrize("index_version", ["2", "3", "4"])
    @pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged", "both"])
    def test_rollback_clears_the_bit_and_restores_the_file(self, repo: Path, tmp_path: Path, index_version: str, flag: str) -> None:
        """The bit survives `reset --hard` on its own; after rollback the file is the checkpoint's and git sees it again."""
        git(repo, "config", "index.version", index_version)  # 4: what feature.manyFiles gives large repositories
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        checkpoint = tree.checkpoint()
        original = (tree.path / "greet.py").read_text()
        for each in (["--skip-worktree", "--assume-unchanged"] if flag == "both" else [flag]):
            git(tree.path, "update-index", each, "greet.py", "check_greet.py")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        tree.rollback(checkpoint)
        assert (tree.path / "greet.py").read_text() == original
        assert git(tree.path, "ls-files", "-v", "greet.py", "check_greet.py") == "H check_greet.py\nH greet.py"
        (tree.path / "greet.py").write_text("changed\n")
        assert not tree.idle_state() == "clean" and tree.commit("overnight: fix iteration 2") != checkpoint

    @pytest.mark.parametrize("flag", ["--skip-worktree", "--assume-unchanged"])
    def test_the_commit_holds_the_change_the_check_passed_on(self, repo: Path, tmp_path: Path, flag: str) -> None:
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        start = tree.checkpoint()
        git(tree.path, "update-index", flag, "greet.py")
        (tree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        made = tree.commit("overnight: fix iteration 1", onto=start)
        assert made != start and "'hello'" in git(repo, "show", f"{made}:greet.py")
        assert git(tree.path, "ls-files", "-v", "greet.py") == "H greet.py" and tree.idle_state() == "clean"

    @pytest.mark.parametrize("index_version", ["2", "3", "4"])
    def test_the_index_is_read_as_git_reads_it(self, tmp_path: Path, index_version: str) -> None:
        """`index_may_hide_files` agrees with `git ls-files -v` (a process it saves on every commit)."""
        from orchestrator.gitdir import index_may_hide_files

        names = [f"d{i % 3}/{'n' * (i * 7 % 90)}{i}.txt" for i in range(40)] + ["/".join(["x" * 200] * 3) + ".txt"]
        repo = make_repo(tmp_path / "r", {name: f"{name}\n" for name in names})
        git(repo, "update-index", f"--index-version={index_version}")
        index = repo / ".git" / "index"
        assert not index_may_hide_files(index)
        for flag, name in [("--assume-unchanged", names[-1]), ("--skip-worktree", names[17]), ("--assume-unchanged", names[0])]:
            git(repo, "update-index", flag, name)
            assert index_may_hide_files(index)
            git(repo, "update-index", flag.replace("--", "--no-", 1), name)
            assert not index_may_hide_files(index), flag

    def test_a_night_does_not_report_success_for_a_fix_its_commit_left_out(self, repo: Path, server: Any, tmp_path: Path) -> None:
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night={"max_iterations": 1})
        command = "git update-index --assume-unchanged greet.py && sed -i s/helo/hello/ greet.py"
        server.enqueue(call("run_command", {"command": command}), call("submit", {"summary": "fixed"}))
        assert overnight("run", "--config", str(config)) == 0
        assert "'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_a_night_cannot_pass_its_check_on_a_hidden_change(self, repo: Path, server: Any, tmp_path: Path) -> None:
        """Iteration 1 hides its fix and is rolled back; iteration 2 submits nothing: the check fails, no false success."""
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["edit_file", "read_file", "run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night={"max_iterations": 2})
        server.enqueue(
            call("run_command", {"command": "git update-index --skip-worktree greet.py"}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            *[call("read_file", {"path": "nope.py"})] * 4,  # a loop: the guard stops and rolls back iteration 1
            call("submit", {"summary": "nothing to do"}),
        )
        assert overnight("run", "--config", str(config)) == 1
        assert "'helo'" in (tmp_path / "state" / "worktrees" / "fix-greet" / "greet.py").read_text()


READ_ONLY_ROLLBACK = """
import json, os, sys
from pathlib import Path
from orchestrator.worktree import Worktree
from tests.conftest import SAMPLE_FILES, make_repo

base = Path(sys.argv[1])
repo = make_repo(base / "repo", {**SAMPLE_FILES, "src/a.py": "v1\\n"})
tree = Worktree.ensure(repo, base / "state", "fix", "HEAD")
checkpoint = tree.checkpoint()
(tree.path / "junk").mkdir()
(tree.path / "junk" / "f").write_text("x\\n")
(tree.path / "src" / "a.py").write_text("agent\\n")
(tree.path / "src" / "new.py").write_text("new\\n")
for folder in ("junk", "src"):
    os.chmod(tree.path / folder, 0o555)
tree.rollback(checkpoint)
print(json.dumps({"clean": tree.idle_state() == "clean", "a.py": (tree.path / "src" / "a.py").read_text(), "junk": (tree.path / "junk").exists()}))
"""


def as_an_ordinary_user(script: str) -> subprocess.CompletedProcess[str]:
    """Run a Python `script` (given a fresh folder) as this user, or as `nobody` when the tests run as root, whom no mode stops."""
    base = Path(tempfile.mkdtemp(prefix="overnight-ro-"))  # not under pytest's folder, which nobody may not enter
    prefix: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: no ordinary user to run as")
        os.chown(base, 65534, 65534)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {**os.environ, "HOME": str(base), "PYTHONPATH": str(Path(__file__).parent.parent)}
    try:
        return subprocess.run([*prefix, sys.executable, "-c", script, str(base)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


class TestRollbackGitCannotDo:
    """The agent left files git cannot reset or remove."""

    def test_folders_made_read_only_are_made_writable_and_rolled_back(self) -> None:
        """`chmod 555` on a new folder and on a tracked one: rollback adds u+rwX and succeeds the second time."""
        done = as_an_ordinary_user(READ_ONLY_ROLLBACK)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"clean": True, "a.py": "v1\n", "junk": False}

    def test_a_rollback_that_still_fails_is_one_line_naming_the_worktree(self, repo: Path, tmp_path: Path) -> None:
        """An index lock left by a killed git of the agent's: StateError naming the worktree and git's last line."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        checkpoint = tree.checkpoint()
        (tree.path / "greet.py").write_text("agent's\n")
        (Path(git(tree.path, "rev-parse", "--absolute-git-dir")) / "index.lock").write_text("")
        with pytest.raises(StateError) as failed:
            tree.rollback(checkpoint)
        message = str(failed.value)
        assert "\n" not in message and str(tree.path) in message and "index.lock" in message

    def test_a_night_whose_rollback_fails_ends_with_exit_4_and_one_line(self, repo: Path, server: Any, tmp_path: Path, capsys: Any) -> None:
        """No traceback: the CLI prints the StateError's line and exits 4, the state dir's exit code."""
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night={"max_iterations": 1})
        server.enqueue(call("run_command", {"command": 'touch "$(git rev-parse --absolute-git-dir)/index.lock"'}), call("submit", {"summary": "done"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 4
        err = capsys.readouterr().err
        assert "cannot roll back the worktree" in err and "Traceback" not in err


class TestGitThatHangs:
    """A clean filter that never ends, which the agent turned on; overnight's own `git add` runs it."""

    def hang_on_add(self, worktree: Path) -> None:
        # In the repository's config (shared with the user's checkout), as the agent's `git config` writes it.
        git(worktree, "config", "filter.hang.clean", "sleep 30")
        (worktree / ".gitattributes").write_text("*.py filter=hang\n")
        (worktree / "greet.py").write_text("def greet():\n    return 'hello'\n")

    def test_git_is_killed_after_its_time_limit_and_the_worktree_still_rolls_back(self, repo: Path, tmp_path: Path) -> None:
        """The commit fails with GitCommandError at the limit (the filter it started killed too); the rollback then works."""
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        tree.git_timeout_s = 2
        checkpoint = tree.checkpoint()
        self.hang_on_add(tree.path)
        started = time.monotonic()
        with pytest.raises(gitpython.GitCommandError, match="timed out"):
            tree.commit("overnight: fix iteration 1")
        assert time.monotonic() - started < 20
        tree.rollback(checkpoint)
        assert tree.idle_state() == "clean" and tree.checkpoint() == checkpoint

    def test_a_night_whose_commit_hangs_ends_the_iteration_as_an_error(self, repo: Path, server: Any, tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
        """The iteration is rolled back as iteration_error and the night ends, instead of waiting on the filter."""
        monkeypatch.setattr(Worktree, "git_timeout_s", 2, raising=False)
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task], night={"max_iterations": 1})
        # The filter is the repository's (the agent's own `git config` is put back after its command); the agent turns it on.
        git(repo, "config", "filter.hang.clean", "sleep 30")
        command = "echo '*.py filter=hang' > .gitattributes && sed -i s/helo/hello/ greet.py"
        server.enqueue(call("run_command", {"command": command}), call("submit", {"summary": "fixed"}))
        started = time.monotonic()
        assert overnight("run", "--config", str(config)) == 1
        assert time.monotonic() - started < 25
        (task_report,) = report_json(config, capsys)["tasks"]
        assert [it["reason"] for it in task_report["iterations"]] == ["iteration_error"]
