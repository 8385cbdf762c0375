"""The agent's own commands leave the user's repository as it was: its branches, tags, stash,
remote and config, and the user's global git config. (orchestrator/confinement.py)"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.commands import run_shell
from orchestrator.confinement import Confinement
from orchestrator.records import ToolCall, ToolResult
from orchestrator.scripted import call
from orchestrator.tools import Toolbox
from orchestrator.worktree import Worktree
from tests.conftest import SAMPLE_FILES, git, make_repo, write_config
from tests.test_night import overnight, report_json


def users_repository(repo: Path) -> dict[str, str]:
    """Everything of the user's that a worktree shares: refs (stash included; the tasks' branches are
    overnight's), the stash's entries, the config."""
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)").splitlines()
    return {
        "refs": "\n".join(ref for ref in refs if not ref.startswith("refs/heads/overnight/")),
        "stash": git(repo, "stash", "list", "--format=%H %gs"),
        "config": (repo / ".git" / "config").read_text(),
        "head": git(repo, "symbolic-ref", "HEAD"),
    }


def user_with_work(repo: Path, remote: Path) -> None:
    """The user works on `feature` (so `main` is checked out nowhere), has a tag, a stash entry and a remote."""
    (repo / "second.txt").write_text("the user's second commit\n")
    git(repo, "add", "second.txt")
    git(repo, "commit", "-qm", "second")
    git(repo, "tag", "v1.0")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "greet.py").write_text("def greet():\n    return 'USER WIP'\n")
    git(repo, "stash", "push", "-q", "-m", "user wip")
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")


@pytest.fixture
def agent(repo: Path, tmp_path: Path) -> Any:
    """Runs a command as the agent's run_command does in a task's worktree."""
    user_with_work(repo, tmp_path / "remote.git")
    tree = Worktree.ensure(repo, tmp_path / "state", "fix", "main")
    toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config))

    def run(command: str) -> ToolResult:
        return toolbox.execute(ToolCall("run_command", {"command": command}))

    run.tree = tree  # type: ignore[attr-defined]
    return run


CHANGE = "echo change >> greet.py && "
# What a confused model types, and what it would have done to the user's repository.
SHARED_REF_CHANGES = {
    "commit on the user's branch": "git checkout -q main && " + CHANGE + "git commit -qam fix",
    "drop a commit from the user's branch": "git checkout -q main && git reset -q --hard HEAD~1",
    "delete the user's branch and tag": "git branch -D main; git tag -d v1.0",
    "move the user's branch and tag": CHANGE + "git commit -qam wip && git branch -f main && git tag -f v1.0",
    "new branch and tag": "git switch -c fix-typo && git tag v2.0",
    "stash and pop with nothing to stash": "git stash; cat greet.py; git stash pop",
    "stash a change": CHANGE + "git stash",
    "drop the stash": "git stash drop; git stash clear",
    "push": CHANGE + "git commit -qam fix && git push -q origin HEAD && git push -q -f origin HEAD:main",
    "note": "git notes add -m note HEAD",
    "rename the task's branch": "git branch -m fix-greeting",
    "copy over the user's branch": "git branch -C main",
    "rename the task's branch, options bundled": "git branch -fm fix-greeting",
    "copy over the user's branch, the option abbreviated": CHANGE + "git commit -qam wip && git branch --cop -f main",
    "expire the reflogs": "git reflog expire --expire=now --all",
    # Newer gits' (2.50, 2.46): refused before git runs, so on any git.
    "drop the stash's reflog": "git reflog drop refs/stash",
    "migrate the refs to another format": "git refs migrate --ref-format=reftable",
    "housekeeping": "git gc -q",
    "delete a remote-tracking branch": "git branch -d -r origin/main",
    "prune the remote-tracking branches": "git remote prune origin",
    "remove the remote": "git remote remove origin",
    "rename the remote": "git remote rename origin upstream",
    "point the user's branch elsewhere": "git symbolic-ref refs/heads/main refs/heads/overnight/fix",
    "point it elsewhere with a reason": "git symbolic-ref -m HEAD refs/heads/main refs/heads/overnight/fix",
    "prune behind -v": "git remote -v prune origin",
    "prune behind -vv": "git remote -vv prune origin",
    "rename behind --verb": "git remote --verb rename origin upstream",
    "point it elsewhere, options bundled": "git symbolic-ref -qm HEAD refs/heads/main refs/heads/overnight/fix",
    "push past the hook": CHANGE + "git commit -qam fix && git push -q --no-verify origin HEAD:refs/heads/nv",
    "push with the hooks switched off": "git -c core.hooksPath=/dev/null push -q origin HEAD:refs/heads/hp",
    "move the user's branch with the hooks switched off": "git -c CORE.HOOKSPATH=/dev/null branch -f main HEAD",
    "tag with the hooks switched off": "git --config-env=core.hooksPath=HOME tag -f v1.0",
    "commit on the user's branch past the commit hooks": "git checkout -q main && " + CHANGE + "git commit --no-verify -qam fix",
    # Aliases (given with -c or --config-env, or set in a config file first) run what they expand to.
    "stash drop by an alias": "git -c alias.x='stash drop' x",
    "stash drop by an alias from the environment": "S='stash drop' git --config-env=alias.x=S x",
    "stash drop by an alias of the repository's config": "git config alias.x 'stash drop' && git x",
    "stash drop by a global alias, the next command": "git config --global alias.x 'stash drop'; git x",
    "stash drop by an alias of an alias": "git -c alias.y='stash drop' -c alias.x=y x",
    "stash drop by a shell alias": "git -c alias.x='!git stash drop' x",
    "push past the hook by an alias": CHANGE + "git commit -qam fix && git -c alias.p='push --no-verify' p -q origin HEAD:refs/heads/nv",
    "tag with the hooks switched off by an alias": "git -c alias.t='-c core.hooksPath=/dev/null tag' t v7",
    # Settings the command gives git through the environment, or a file included.
    "tag with the hooks switched off by GIT_CONFIG_COUNT": "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=/dev/null git tag v7",
    "tag with the hooks switched off by GIT_CONFIG_PARAMETERS": "export GIT_CONFIG_PARAMETERS=\"'core.hookspath'='/dev/null'\"; git tag v7",
    "stash drop by an alias in GIT_CONFIG_PARAMETERS": "GIT_CONFIG_PARAMETERS=\"'alias.x'='stash drop'\" git x",
    # Options before the subcommand whose value is the next word (git's --shallow-file, --attr-source, --super-prefix).
    "drop the stash behind --shallow-file and its value": "git --shallow-file '' stash drop",
    "push past the hook behind --shallow-file and its value": CHANGE
    + "git commit -qam fix && git --shallow-file '' push -q --no-verify origin HEAD:refs/heads/nv",
    "tag with the hooks switched off by an included file": "printf '[core]\\n\\thooksPath = /dev/null\\n' > ../hooks-off && git -c include.path=$PWD/../hooks-off tag v7",
}


class TestSharedRefs:
    @pytest.mark.parametrize("what", SHARED_REF_CHANGES)
    def test_the_users_refs_stash_and_remote_stay_as_they_were(self, agent: Any, repo: Path, tmp_path: Path, what: str) -> None:
        before, remote_before = users_repository(repo), git(tmp_path / "remote.git", "for-each-ref")
        result = agent(SHARED_REF_CHANGES[what])
        assert users_repository(repo) == before
        assert git(tmp_path / "remote.git", "for-each-ref") == remote_before
        assert "overnight: refused" in result.output, result.output

    def test_ordinary_settings_and_aliases_work_as_before(self, agent: Any, repo: Path) -> None:
        """`-c color.ui=never`, `-C folder`, an alias of an ordinary command, and an alias named as a builtin (git runs the builtin)."""
        commands = [
            CHANGE + "git -c color.ui=never diff --stat && mkdir -p pkg && git -C pkg status --short",
            "git -c alias.st='status --short' st && git config --global alias.last 'log -1 --format=%s' && git last",
            "git -c alias.status='stash drop' status --short && git -c alias.ci='commit -q' ci -am one",
        ]
        for command in commands:
            result = agent(command)
            assert result.ok and "overnight: refused" not in result.output, (command, result.output)
        assert git(repo, "log", "--format=%s", "-1", "overnight/fix") == "one"
        assert git(repo, "stash", "list", "--format=%gs") == "On feature: user wip"

    def test_gits_own_commands_cost_no_alias_look_up(self, agent: Any) -> None:
        """Plumbing that test suites and pre-commit tools run by the hundred (rev-list, describe, cat-file) starts no
        git of the front's to look for an alias, which git would not run in place of its own command anyway."""
        result = agent(
            "export GIT_TRACE=$PWD/../trace && git rev-list -1 HEAD >/dev/null && git describe --always >/dev/null "
            "&& git cat-file -t HEAD >/dev/null && unset GIT_TRACE && cat ../trace"
        )
        assert result.ok, result.output
        started = [line.split("built-in: ", 1)[1] for line in result.output.splitlines() if "built-in: " in line]
        assert [command.split()[1] for command in started] == ["rev-list", "describe", "cat-file"], started

    def test_the_users_credential_helper_gives_the_agent_nothing(self, agent: Any, repo: Path) -> None:
        """A token the user's helper stores (or a CI job's) is not handed to the agent's fetch or push."""
        git(repo, "config", "credential.helper", "!f() { echo username=u; echo password=stored-token-123; }; f")
        result = agent("printf 'protocol=https\\nhost=example.com\\n\\n' | git credential fill")
        assert "stored-token-123" not in result.output and not result.ok, result.output

    def test_the_stash_is_refused_before_git_applies_anything(self, agent: Any) -> None:
        """`git stash pop` applies the entry, then drops it: refused at the door, the worktree keeps no trace of it."""
        agent("git stash pop")
        assert "USER WIP" not in (agent.tree.path / "greet.py").read_text()
        assert agent("git stash list").output.endswith("On feature: user wip")

    def test_the_agents_own_git_on_its_branch_works(self, agent: Any, repo: Path) -> None:
        """Commits, amends, resets and a rebase of its own branch; looking at the user's refs."""
        commands = [
            CHANGE + "git commit -qam one && git commit -q --amend -m one-again",
            CHANGE + "git commit -qam two && git reset -q --hard HEAD~1",
            "git switch -q --detach && git switch -q overnight/fix",
            CHANGE + "git commit -qam three && git rebase -q --exec true HEAD~1",
            "git log --oneline -1 main && git stash list && git fetch -q origin && git bisect start HEAD HEAD~1 >/dev/null && git bisect reset",
            "git branch -vv && git branch -a --contains HEAD && git branch --sort -committerdate --list "
            "&& git branch --show-current",
            "git remote -v && git remote show origin >/dev/null && git symbolic-ref --short HEAD && git symbolic-ref HEAD "
            "&& git symbolic-ref -m why HEAD refs/heads/overnight/fix && git symbolic-ref -qm why HEAD refs/heads/overnight/fix",
        ]
        for command in commands:
            result = agent(command)
            assert result.ok, (command, result.output)
        assert git(repo, "log", "--format=%s", "overnight/fix", "-2") == "three\none-again"


# What git itself runs through a shell finds git's exec path first on PATH: the git there must be the front too.
GIT_RUN_BY_GIT = {
    "rebase --exec": "git rebase -q --exec 'git stash drop' HEAD~1",
    # Git's exec path, first on their PATH, holds its builtins by their dashed names too.
    "rebase --exec, a dashed name": "git rebase -q --exec 'git-stash drop' HEAD~1",
    "bisect run, a dashed name": "git bisect start HEAD HEAD~1 >/dev/null && git bisect run git-stash drop; git bisect reset -q",
    "rebase -x, continued": "git rebase -q -x true -x 'git stash drop' HEAD~1; git rebase --continue",
    "bisect run": "git bisect start HEAD HEAD~1 >/dev/null && git bisect run git stash drop; git bisect reset -q",
    "an editor": "GIT_EDITOR='git stash drop; true' git commit -q --amend",
}


class TestGitRunByGit:
    @pytest.mark.parametrize("how", GIT_RUN_BY_GIT)
    def test_a_git_that_git_runs_meets_the_front(self, agent: Any, repo: Path, how: str) -> None:
        """`git rebase --exec 'git stash drop'` dropped the user's stash entry: the git it ran was git's own, not the front."""
        before = users_repository(repo)
        result = agent(GIT_RUN_BY_GIT[how])
        assert users_repository(repo) == before, result.output
        assert "overnight: refused: the stash is shared" in result.output, result.output

    def test_an_autostash_and_a_git_in_an_exec_line_work_as_before(self, agent: Any, repo: Path) -> None:
        """An autostash (the user's rebase.autoStash, pull --autostash) runs `git stash create` and `apply` through the front."""
        result = agent(
            "echo wip >> greet.py && git -c rebase.autoStash=true rebase -q HEAD~1 && git pull -q --rebase=false --autostash origin main "
            "&& git rebase -q --exec 'git log -1 --format=%s >/dev/null && git status --short' HEAD~1 --autostash && git diff --stat"
        )
        assert result.ok and "greet.py" in result.output and "overnight: refused" not in result.output, result.output
        assert git(repo, "stash", "list", "--format=%gs") == "On feature: user wip"

    def test_gits_dashed_programs_run_by_git_work_as_before(self, agent: Any, repo: Path) -> None:
        """A builtin's dashed name that the front lets through (git-log), git's scripts (git-submodule, which sources
        git-sh-setup) and a local clone's git-upload-pack, which git runs by that name, work in a git that git ran."""
        result = agent(
            "git rebase -q --exec 'git-log -1 --format=%s && git-submodule status && git clone -q --no-local . ../copy "
            "&& git -C ../copy log -1 --format=%s' HEAD~1"
        )
        assert result.ok and result.output.endswith("\nsecond\nsecond"), result.output

    def test_a_git_that_git_runs_in_a_folder_is_refused_saying_why(self, agent: Any) -> None:
        """`git rebase --exec 'cd sub && git add x'`, where git's GIT_DIR makes sub the top (x staged as x), is refused saying
        so and naming the project root (it said "every command starts in the project root"), as the agent's own line stages sub/x."""
        refused = agent("mkdir sub && echo x > sub/x && git rebase -q --exec 'cd sub && git add x' HEAD~1; git rebase --abort; git ls-files")
        assert "overnight: refused: git with GIT_DIR set (as git sets it for what it runs" in refused.output, refused.output
        assert "every command starts" not in refused.output, refused.output
        assert "takes the current folder, sub, for the top" in refused.output and str(agent.tree.path) in refused.output, refused.output
        assert "\nx\n" not in refused.output + "\n" and "sub/x" not in refused.output, refused.output  # nothing staged
        # The same line in the agent's own shell, where git finds the worktree's top itself, stages sub/x.
        staged = agent("cd sub && git add x && git ls-files --full-name x")
        assert staged.ok and staged.output.endswith("\nsub/x"), staged.output

    def test_the_project_root_that_refusal_names_can_be_pasted_where_its_path_has_a_space(self, repo: Path, tmp_path: Path) -> None:
        """The refusal's `cd <project root>` works as written where the root's path has a space or a `*` (`cd /a/my state/...`
        was two words, a glob)."""
        user_with_work(repo, tmp_path / "remote.git")
        tree = Worktree.ensure(repo, tmp_path / "my state [*]", "fix", "main")
        toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config))
        command = "mkdir sub && git rebase -q --exec 'cd sub && git add .' HEAD~1; git rebase --abort"
        refused = toolbox.execute(ToolCall("run_command", {"command": command})).output
        named = re.search(r"\(cd (.+) first, or git -C (.+)\), naming", refused)
        assert named, refused
        for pasted in (f"cd {named[1]} && pwd -P", f"git -C {named[2]} rev-parse --show-toplevel"):
            done = subprocess.run(["bash", "-c", pasted], cwd=tree.path / "sub", capture_output=True, text=True)
            assert done.stdout.strip() == str(tree.path.resolve()), (pasted, done.stderr)

    def test_a_write_command_git_runs_in_the_worktree_asks_git_nothing_more(self, agent: Any, repo: Path) -> None:
        """A write command that git runs in the worktree's top with GIT_DIR its own git dir (`rebase --exec 'git add -A'`)
        starts no `git rev-parse` of the front's (it started four, ~16 ms a command)."""
        # Traced from the front on (the rebase's own hooks ask git too).
        result = agent("git rebase -q --exec 'GIT_TRACE=$PWD/../trace git add -A' HEAD~1 && cat ../trace")
        assert result.ok, result.output
        started = [line.split("built-in: ", 1)[1].split()[1] for line in result.output.splitlines() if "built-in: " in line]
        assert started == ["add"], started


def git_of_a_keg(keg: Path) -> Path:
    """A git whose exec path is `keg`/libexec, a folder of links to the real git's programs (as Homebrew's
    versioned keg is), while that folder is there; git's own exec path once it is gone (GIT_EXEC_PATH's, given one)."""
    (keg / "libexec").mkdir(parents=True)
    real = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
    for name in os.listdir(real):
        (keg / "libexec" / name).symlink_to(Path(real) / name)
    git_program = keg / "git"
    git_program.write_text(f'#!/bin/sh\n[ "$1" = --exec-path ] && [ -z "$GIT_EXEC_PATH" ] && [ -d {keg}/libexec ] && echo {keg}/libexec && exit\nexec {shutil.which("git")} "$@"\n')
    git_program.chmod(0o755)
    return git_program


@contextlib.contextmanager
def fences_for(git_program: Path, folder: Path) -> Iterator[Path]:
    """`folder` filled with the fences (the front, the folder of links) for `git_program`, and removed after."""
    from orchestrator import confinement

    folder.mkdir()
    try:
        confinement._fill(folder, shutil.which("bash"), str(git_program))
        yield folder
    finally:
        confinement._remove(folder)


class TestGitsExecPathGone:
    def test_git_finds_its_programs_after_its_exec_path_went(self, tmp_path: Path) -> None:
        """An upgrade that removes git's versioned exec path mid-night (Homebrew's cleanup of the old keg) left the
        front's folder of links leading nowhere: `git submodule`, `git fetch` over https were "not a git command"."""
        keg = tmp_path / "keg"
        with fences_for(git_of_a_keg(keg), tmp_path / "fences") as folder:
            make_repo(tmp_path / "project", {"a.txt": "a\n"})
            shutil.rmtree(keg / "libexec")
            # Run by the agent, and by a git that git ran (which has the folder of links as its exec path).
            for inherited in ({}, {"GIT_EXEC_PATH": str(folder / "exec")}):
                done = subprocess.run(
                    [str(folder / "bin" / "git"), "submodule", "status"], cwd=tmp_path / "project", env={**os.environ, **inherited},
                    capture_output=True, text=True,
                )
                assert done.returncode == 0, done.stderr


class TestGitUpgradedInPlace:
    def test_a_program_gits_exec_path_gained_mid_night_is_found(self, tmp_path: Path) -> None:
        """A program that git upgraded in place (its exec path keeps its name) gained after the front's folder of links
        was made runs as `git foo` from the agent, a git that git ran and an alias's shell (it was "not a git command")."""
        keg = tmp_path / "keg"
        with fences_for(git_of_a_keg(keg), tmp_path / "fences") as folder:
            project = make_repo(tmp_path / "project", {"a.txt": "a\n"})
            helper = keg / "libexec" / "git-foo"  # the upgrade's new program
            helper.write_text('#!/bin/sh\necho "foo ran; its git runs with $(git --exec-path)"\n')
            helper.chmod(0o755)
            front = str(folder / "bin" / "git")
            # Run by the agent, by a git that git ran (the folder of links its exec path), and by a git alias's shell.
            for command, inherited in (([front, "foo"], {}), ([front, "foo"], {"GIT_EXEC_PATH": str(folder / "exec")}),
                                       ([front, "-c", "alias.x=!git foo", "x"], {})):
                done = subprocess.run(command, cwd=project, env={**os.environ, **inherited}, capture_output=True, text=True)
                assert done.returncode == 0, (command, inherited, done.stderr)
                # The program's own git met the front, which gives git the folder of links.
                assert done.stdout.strip() == f"foo ran; its git runs with {folder / 'exec'}", (command, inherited, done.stdout)


class TestOwnConfigCount:
    """Git reads only the command's list when it sets GIT_CONFIG_COUNT itself: overnight's settings were dropped."""

    OWN = "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=user.name GIT_CONFIG_VALUE_0=someone "

    def test_overnights_settings_win_after_a_commands_own(self, agent: Any, repo: Path) -> None:
        """The user's credential helper, commit signing and maintenance stay off with a command's own count, whose own setting is kept."""
        git(repo, "config", "credential.helper", "!f() { echo username=u; echo password=stored-token-123; }; f")
        git(repo, "config", "commit.gpgsign", "true")
        git(repo, "config", "maintenance.auto", "true")
        result = agent(
            f"printf 'protocol=https\\nhost=example.com\\n\\n' | {self.OWN}git credential fill; "
            f"{self.OWN}git config commit.gpgsign; {self.OWN}git config maintenance.auto; {self.OWN}git config core.fsmonitor; "
            f"{self.OWN}git config user.name"
        )
        assert "stored-token-123" not in result.output, result.output
        assert result.output.splitlines()[-4:] == ["false", "false", "false", "someone"], result.output

    @pytest.mark.parametrize("count", ["08", " 8", "+8"])
    def test_a_count_read_as_git_reads_it(self, agent: Any, repo: Path, count: str) -> None:
        """`GIT_CONFIG_COUNT=08` is 8 to git (strtoul, base 10): the front made git fail on it (bash read bad octal)."""
        own = " ".join(f"GIT_CONFIG_KEY_{i}=own.k{i} GIT_CONFIG_VALUE_{i}=v{i}" for i in range(8))
        result = agent(f"export {own} GIT_CONFIG_COUNT='{count}'; git config own.k7 && git config own.k0 && git tag v7")
        assert result.output.splitlines()[1:3] == ["v7", "v0"], result.output
        assert "overnight: refused" in result.output and "v7" not in git(repo, "tag"), result.output

    @pytest.mark.parametrize("count", ["8x", "0x8", "-1", "99999999999", "+"])
    def test_a_count_git_refuses_is_refused(self, agent: Any, count: str) -> None:
        """One git refuses ("bogus count", "too many entries") is refused alike, with git's kind of line, not read as 0."""
        result = agent(f"GIT_CONFIG_COUNT='{count}' git status --short")
        assert not result.ok and "fatal: " in result.output and "in GIT_CONFIG_COUNT" in result.output, result.output
        assert len(result.output.splitlines()) == 2, result.output  # the exit code's line, and git's kind of one


class TestOwnRepositories:
    def test_a_repository_the_agent_makes_or_clones_is_its_own(self, agent: Any, repo: Path) -> None:
        """A test suite's fixture repositories: tags, branches, stash and housekeeping there are nobody else's."""
        made = agent(
            "git init -q scratch && cd scratch && echo a > a && git add a && git commit -qm one && git tag v1 "
            "&& git switch -qc other && echo b >> a && git stash -q && git stash pop -q && git branch -m renamed && git gc -q"
        )
        assert made.ok, made.output
        cloned = agent(f"git clone -q {repo} cloned && cd cloned && git switch -qc mine && git tag t && git init -q --bare ../own.git "
                       "&& git push -q ../own.git mine t")
        assert cloned.ok, cloned.output
        # Pushed back into the user's repository, the clone's refs meet the same guard (receive-pack runs there).
        back = agent("cd cloned && git push -q origin mine")
        assert not back.ok and "refs/heads/mine" not in git(repo, "for-each-ref"), back.output

    def test_a_push_from_a_clone_into_a_users_repository_with_its_own_hooks_path_is_refused(self, agent: Any, repo: Path) -> None:
        """husky's core.hooksPath in the user's .git/config beats the global config's in receive-pack: the clone's
        pre-push (overnight's, through the environment) refuses a push whose destination is the user's repository."""
        (repo / ".husky" / "_").mkdir(parents=True)
        git(repo, "config", "core.hooksPath", ".husky/_")
        back = agent(f"git clone -q {repo} cloned && cd cloned && git switch -qc mine && git tag t && git push -q origin mine t")
        assert not back.ok and "refs/heads/mine" not in git(repo, "for-each-ref"), back.output

    def test_a_fixture_repositorys_own_server_hooks_run(self, agent: Any) -> None:
        """A test suite that tests a pre-receive hook in a bare fixture repository sees it run, as the check does."""
        made = agent(
            "git init -q --bare srv.git && printf '#!/bin/sh\\necho FIXTURE-HOOK >&2; exit 1\\n' > srv.git/hooks/pre-receive "
            "&& chmod +x srv.git/hooks/pre-receive && git init -q c && cd c && echo a > a && git add a && git commit -qm a "
            "&& git push -q ../srv.git HEAD:refs/heads/x"
        )
        assert not made.ok and "FIXTURE-HOOK" in made.output, made.output

    def test_a_fixture_repository_keeps_the_hooks_its_own_git_config_count_names(self, agent: Any) -> None:
        """A test suite that names its fixture's hooks through GIT_CONFIG_COUNT sees them run, as the check does."""
        made = agent(
            "git init -q c && cd c && mkdir h && printf '#!/bin/sh\\necho FIXTURE-HOOK >&2; exit 1\\n' > h/pre-commit && chmod +x h/pre-commit "
            "&& echo a > a && git add a && GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.hooksPath GIT_CONFIG_VALUE_0=$PWD/h git commit -qm a"
        )
        assert not made.ok and "FIXTURE-HOOK" in made.output, made.output

    def test_a_fetch_brings_no_tags_into_the_users_repository(self, agent: Any, repo: Path, tmp_path: Path) -> None:
        """A remote that has released (a tag the user lacks): `git fetch` works, the tag stays out of the user's refs."""
        upstream = tmp_path / "upstream"
        subprocess.run(["git", "clone", "-q", "-b", "main", str(tmp_path / "remote.git"), str(upstream)], check=True)
        git(upstream, "tag", "v9")
        git(upstream, "push", "-q", "origin", "v9")
        before = users_repository(repo)
        result = agent("git fetch -q origin && git pull -q origin main")
        assert result.ok, result.output
        assert "v9" not in git(repo, "tag")
        assert {key: value for key, value in users_repository(repo).items() if key != "refs"} == {k: v for k, v in before.items() if k != "refs"}


    @pytest.mark.parametrize(
        "fetch", ["git fetch -q --prune origin", "git -c fetch.prune=true fetch -q origin", "git pull -q -p origin main", "git fetch -q -p -- origin", "git fetch -pq origin"]
    )
    def test_a_fetch_prunes_none_of_the_users_remote_tracking_branches(self, agent: Any, repo: Path, tmp_path: Path, fetch: str) -> None:
        """The remote deleted `feature`: `origin/feature` may be the user's last name for its commits; the fetch works and keeps it."""
        git(repo, "push", "-q", "origin", "HEAD:refs/heads/feature")
        git(repo, "fetch", "-q", "origin")
        git(tmp_path / "remote.git", "branch", "-D", "feature")
        result = agent(fetch)
        assert result.ok, result.output
        assert "refs/remotes/origin/feature" in git(repo, "for-each-ref", "refs/remotes/")


# A model that thinks the shell's folder persists (`cd tests` in one command, `cd ..` in the next)
# runs git outside its worktree; with the state dir in the user's checkout (the default) git
# found the user's repository there and wrote the user's index and files.
OUTSIDE_THE_WORKTREE = {
    "the worktrees folder, add": "cd .. && git add -A",
    "the worktrees folder, reset": "cd .. && git reset -q --hard",
    "the state dir, checkout": "cd ../.. && git checkout -- .",
    "the state dir, clean": "cd ../.. && git clean -fdq",
    "the user's checkout itself": "cd ../../.. && git add -A; git reset -q --hard",
    "the user's checkout, by -C": "git -C ../../.. restore greet.py",
    "the user's checkout, by stage (add's other name)": "cd ../../.. && git stage -A",
    "another task's worktree": "cd ../other && git reset -q --hard && git clean -fdq",
    "another task's worktree, clean alone": "cd ../other && git clean -fdq",
    # In the worktree, but with the index of the user's checkout or another task's.
    "the user's index, by GIT_DIR and GIT_WORK_TREE": "echo x > new.txt && GIT_DIR=$(git rev-parse --git-common-dir) GIT_WORK_TREE=. git add new.txt",
    "the user's index, by --git-dir and --work-tree": "echo x > new.txt && git --git-dir=$(git rev-parse --git-common-dir) --work-tree=. add new.txt",
    "another task's index, by GIT_INDEX_FILE": "echo x > new.txt && GIT_INDEX_FILE=$(git rev-parse --git-common-dir)/worktrees/other/index git add new.txt",
    # GIT_DIR alone, as git sets it for what it runs, but naming another git dir than the worktree's own.
    "the user's index, by GIT_DIR alone": "echo x > new.txt && GIT_DIR=$(git rev-parse --git-common-dir) git add new.txt",
    "another task's index, by GIT_DIR alone": "echo x > new.txt && GIT_DIR=$(git rev-parse --git-common-dir)/worktrees/other git add new.txt",
    # The worktree's own git dir, whose per-worktree config names the user's checkout as its work tree.
    "the user's checkout, by a worktree config's core.worktree": "own=$(git rev-parse --absolute-git-dir) && git config extensions.worktreeConfig true "
    "&& git config --worktree core.worktree $(cd ../../.. && pwd) && GIT_DIR=$own git reset -q --hard",
}


class TestOutsideTheWorktree:
    @pytest.fixture
    def state_inside(self, repo: Path) -> Any:
        """The user mid-work, the state dir in the checkout, two tasks' worktrees (the other one mid-work)."""
        (repo / "greet.py").write_text("def greet():\n    return 'USER WIP'\n")
        (repo / "notes.txt").write_text("the user's, untracked\n")
        state = repo / ".overnight"
        tree = Worktree.ensure(repo, state, "fix", "main")
        other = Worktree.ensure(repo, state, "other", "main")
        (other.path / "greet.py").write_text("the other task's work\n")
        (other.path / "new.txt").write_text("the other task's new file\n")
        toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config))
        return lambda command: toolbox.execute(ToolCall("run_command", {"command": command})), tree, other

    @pytest.mark.parametrize("where", OUTSIDE_THE_WORKTREE)
    def test_git_run_outside_the_worktree_changes_neither_the_users_checkout_nor_another_tasks(
        self, state_inside: Any, repo: Path, where: str
    ) -> None:
        run, _, other = state_inside
        before = git(repo, "status", "--porcelain"), git(other.path, "status", "--porcelain"), (repo / "greet.py").read_text()
        result = run(OUTSIDE_THE_WORKTREE[where])
        assert (git(repo, "status", "--porcelain"), git(other.path, "status", "--porcelain"), (repo / "greet.py").read_text()) == before
        assert not result.ok and ("not a git repository" in result.output or "overnight: refused" in result.output), result.output
        assert (repo / "notes.txt").exists() and (other.path / "new.txt").exists()

    def test_a_colon_above_the_worktree_does_not_let_git_climb_into_the_users_checkout(self, tmp_path: Path) -> None:
        """Git splits GIT_CEILING_DIRECTORIES on ':' with no escape: with one in a folder above, the agent's
        `rm .git; git reset --hard` in the worktree's root climbed into the user's checkout and reset the
        user's work (the hook refused the ref update only after the files were reset)."""
        repo = make_repo(tmp_path / "work:2026" / "repo", SAMPLE_FILES)
        (repo / "greet.py").write_text("def greet():\n    return 'USER WIP'\n")
        tree = Worktree.ensure(repo, repo / ".overnight", "fix", "main")
        toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config))
        result = toolbox.execute(ToolCall("run_command", {"command": "rm -f .git; git reset -q --hard"}))
        assert not result.ok and "overnight: refused" in result.output, result.output
        assert "USER WIP" in (repo / "greet.py").read_text()

    def test_the_agent_cannot_remove_or_move_a_worktree_but_may_list_them(self, state_inside: Any, repo: Path) -> None:
        """`git worktree remove --force ../other` deleted another task's worktree and its uncommitted work."""
        run, tree, other = state_inside
        for command in (f"git worktree remove --force {other.path}", f"git worktree move {other.path} moved", "git worktree add ../third",
                        f"git worktree lock {tree.path}", "git worktree prune", "git worktree repair"):
            result = run(command)
            assert not result.ok and "overnight: refused" in result.output, (command, result.output)
        assert (other.path / "new.txt").exists() and not (tree.path / "moved").exists()
        listed = run("git worktree list --porcelain")
        assert listed.ok and f"worktree {other.path}" in listed.output, listed.output
        assert not (repo / ".git" / "worktrees" / "fix" / "locked").exists()

    def test_git_in_the_worktree_and_its_folders_works_as_usual(self, state_inside: Any, repo: Path) -> None:
        """status, diff, add, commit and log, from the worktree's root and from a folder in it."""
        run, tree, _ = state_inside
        result = run(
            "mkdir -p pkg/sub && echo x > pkg/sub/x.py && echo change >> greet.py && git status --short && git diff --stat "
            "&& cd pkg/sub && git add -A && git -C ../.. add greet.py && git commit -qm agent && git log --format=%s -1"
        )
        assert result.ok and result.output.endswith("agent"), result.output
        assert git(repo, "show", "--name-only", "--format=", "overnight/fix").splitlines() == ["greet.py", "pkg/sub/x.py"]
        scratch = run("GIT_INDEX_FILE=$PWD/../scratch-index git add greet.py && GIT_INDEX_FILE=$PWD/../scratch-index git ls-files")
        assert scratch.ok and scratch.output.endswith("greet.py"), scratch.output

    def test_a_temporary_index_beside_the_worktrees_own_is_the_agents(self, state_inside: Any, repo: Path) -> None:
        """A pre-commit style tool's temporary index in the worktree's git dir (`git rev-parse --git-dir`) may be written."""
        run, tree, _ = state_inside
        result = run(
            "echo change >> greet.py && export GIT_INDEX_FILE=$(git rev-parse --absolute-git-dir)/index.pre-commit "
            "&& git read-tree HEAD && git add greet.py && git diff --cached --name-only"
        )
        assert result.ok and "overnight: refused" not in result.output and result.output.endswith("greet.py"), result.output
        assert git(tree.path, "diff", "--cached", "--name-only") == ""  # the worktree's own index is as it was


class TestSharedConfig:
    def test_two_tasks_commands_overlapping_leave_the_config_as_it_was(self, repo: Path, tmp_path: Path) -> None:
        """A changes the config and ends while B, begun after A's change, still runs: B must not keep A's change."""
        import threading

        before = (repo / ".git" / "config").read_bytes()
        trees = [Worktree.ensure(repo, tmp_path / "state", name, "HEAD") for name in ("a", "b")]
        boxes = [Toolbox(t.path, ("run_command",), check_command="true", confinement=Confinement(t.branch, t.shared_config)) for t in trees]
        results: dict[str, ToolResult] = {}

        def run(name: str, box: Toolbox, command: str) -> None:
            results[name] = box.execute(ToolCall("run_command", {"command": command}))

        first = threading.Thread(target=run, args=("a", boxes[0], "git config core.hooksPath .husky/_ && sleep 1"))
        first.start()
        time.sleep(0.5)
        second = threading.Thread(target=run, args=("b", boxes[1], "sleep 1.5"))
        second.start()
        first.join()
        second.join()
        assert (repo / ".git" / "config").read_bytes() == before
        assert "puts it back" in results["a"].output and "puts it back" not in results["b"].output

    def test_the_kept_copy_is_gone_once_the_command_ends(self, repo: Path, tmp_path: Path) -> None:
        """The config's copy is for a night killed mid-command; left after the command ended, the next night's
        recovery would put that old config back over what the user changed in it since (a remote added)."""
        from orchestrator.confinement import restore_config_copy

        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        copy = tmp_path / "state" / "git-config.kept"
        toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config, copy))
        for command in ("true", "git config agent.was here"):
            toolbox.execute(ToolCall("run_command", {"command": command}))
            assert not copy.exists(), command
        git(repo, "remote", "add", "upstream", "https://example.com/upstream.git")
        users = (repo / ".git" / "config").read_bytes()
        assert restore_config_copy(copy) is None and (repo / ".git" / "config").read_bytes() == users

    def test_a_night_killed_while_commands_overlap_gets_the_config_from_before_the_first(self, repo: Path, tmp_path: Path) -> None:
        """Task A's command changed the config and still runs when task B's begins; the night is killed. The
        copy recovery puts back is the config from before A's command, not the one B found with A's change."""
        from orchestrator.confinement import kept_config, restore_config_copy

        config, copy = repo / ".git" / "config", tmp_path / "git-config.kept"
        before = config.read_bytes()
        with kept_config(config, copy):
            git(repo, "config", "remote.origin.url", "https://evil.example/x.git")
            with kept_config(config, copy):
                assert restore_config_copy(copy) == os.path.realpath(config)  # what the next night's recovery does
                assert config.read_bytes() == before

    def test_a_config_that_is_a_link_stays_one(self, agent: Any, repo: Path, tmp_path: Path) -> None:
        config = repo / ".git" / "config"
        kept = tmp_path / "kept-config"
        kept.write_bytes(config.read_bytes())
        config.unlink()
        config.symlink_to(kept)
        before = kept.read_bytes()
        agent("git config user.email agent@example.com")
        assert config.is_symlink() and kept.read_bytes() == before


    def test_the_repositorys_config_is_put_back_and_the_model_told(self, agent: Any, repo: Path) -> None:
        before = (repo / ".git" / "config").read_bytes()
        command = "git config user.email agent@example.com && git remote set-url origin https://example.com/x.git && git config core.bare true"
        result = agent(command)
        assert (repo / ".git" / "config").read_bytes() == before
        assert result.ok and "puts it back" in result.output
        git(repo, "status")  # not a bare repository
        assert "puts it back" not in agent("git config user.email").output

    def test_a_husky_style_hooks_path_does_not_reach_the_users_checkout(self, agent: Any, repo: Path) -> None:
        agent("mkdir -p .husky/_ && git config core.hooksPath .husky/_")
        assert subprocess.run(["git", "config", "core.hooksPath"], cwd=repo, capture_output=True).returncode == 1

    def test_global_settings_go_to_a_file_of_overnights_and_the_users_are_read(
        self, repo: Path, tmp_path: Path, monkeypatch: Any
    ) -> None:
        home = tmp_path / "home"
        home.mkdir()
        (home / ".gitconfig").write_text("[alias]\n\tsee = status\n")
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
        monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
        monkeypatch.setattr("orchestrator.confinement._made", [])  # this process's folder, made again under this HOME
        tree = Worktree.ensure(repo, tmp_path / "state", "fix", "HEAD")
        toolbox = Toolbox(tree.path, ("run_command",), check_command="true", confinement=Confinement(tree.branch, tree.shared_config))
        result = toolbox.execute(ToolCall("run_command", {"command": "git config --global user.name Agent && git see --short"}))
        assert result.ok, result.output
        assert (home / ".gitconfig").read_text() == "[alias]\n\tsee = status\n"


def test_only_the_fence_folders_of_dead_processes_are_removed(tmp_path: Path) -> None:
    """Recovery removes the folders of nights killed with -9; one whose process lives (another night, on another
    repository) keeps its fences: its agent's command in flight would run with no git front and no hooks."""
    import tempfile

    from orchestrator.confinement import remove_abandoned_folders

    alive = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    folders = {}
    try:
        for name, pid in (("alive", alive.pid), ("dead", dead.pid)):
            folders[name] = Path(tempfile.mkdtemp(prefix="overnight-agent-"))
            (folders[name] / "pid").write_text(str(pid))
        removed = remove_abandoned_folders()
        assert folders["dead"] in removed and not folders["dead"].exists()
        assert folders["alive"] not in removed and (folders["alive"] / "pid").exists()
    finally:
        alive.kill()
        alive.wait()
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)


class TestScreenPrograms:
    def test_an_editor_in_the_agents_command_fails_at_once_saying_why(self, tmp_path: Path) -> None:
        """`vim file` with no terminal would wait for keys until the command's time limit."""
        toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", command_timeout_s=60)
        started = time.monotonic()
        for editor in ("vim", "vi", "nano", "emacs -nw"):
            result = toolbox.execute(ToolCall("run_command", {"command": f"{editor} notes.txt"}))
            assert not result.ok and "needs a terminal" in result.output and "file tools" in result.output, result.output
        assert time.monotonic() - started < 10
        assert toolbox.execute(ToolCall("run_command", {"command": "echo fine | cat"})).output.endswith("fine")

    def test_commands_run_where_there_is_no_home_to_find(self, tmp_path: Path) -> None:
        """HOME unset and no passwd entry (a container under an arbitrary uid): Path.home() raised before
        the fences' folder in /tmp was even tried, and every run_command was an iteration_error (found by a
        review). In a process of its own, where the fences are made for the first time."""
        import sys

        script = f"""
import os, pwd
def no_entry(uid):
    raise KeyError(uid)
pwd.getpwuid = no_entry
os.environ.pop("HOME", None)
os.environ.pop("XDG_CACHE_HOME", None)
from pathlib import Path
from orchestrator.records import ToolCall
from orchestrator.tools import Toolbox
toolbox = Toolbox(Path({str(tmp_path)!r}), ("run_command",), check_command="true", command_timeout_s=30)
result = toolbox.execute(ToolCall("run_command", {{"command": "echo hi; vim x"}}))
print(result.output)
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "hi" in done.stdout.splitlines() and "needs a terminal" in done.stdout, done.stdout

    def test_debians_names_for_an_editor_are_refused_too(self, tmp_path: Path) -> None:
        """`editor` (Debian's alternative, vim there) and vim's builds by name ran until the time limit (found by a review)."""
        toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", command_timeout_s=60)
        started = time.monotonic()
        for editor in ("editor", "sensible-editor", "vim.basic", "vim.tiny", "rvim"):
            result = toolbox.execute(ToolCall("run_command", {"command": f"{editor} notes.txt"}))
            assert not result.ok and "needs a terminal" in result.output, result.output
        assert time.monotonic() - started < 10

    def test_the_fences_are_made_again_if_a_tmp_cleaner_removed_them(self, tmp_path: Path) -> None:
        import shutil

        from orchestrator import confinement

        toolbox = Toolbox(tmp_path, ("run_command",), check_command="true", command_timeout_s=60)
        toolbox.execute(ToolCall("run_command", {"command": "true"}))
        (folder,) = confinement._made
        subprocess.run(["chmod", "-R", "u+w", str(folder)], check=True)  # as a tmp cleaner run by its owner
        shutil.rmtree(folder)
        assert "needs a terminal" in toolbox.execute(ToolCall("run_command", {"command": "vim x"})).output

    def test_the_check_runs_with_the_users_path(self, tmp_path: Path) -> None:
        """The user's own check may run vim in ex mode (`vim -es`): its PATH is the user's."""
        assert run_shell("echo $PATH", tmp_path, 10, 1000).output.strip() == os.environ["PATH"]


def test_a_night_whose_agent_commits_on_the_users_branch_leaves_it_alone(repo: Path, server: Any, tmp_path: Path, capsys: Any) -> None:
    """The user is on `feature`; the agent checks `main` out, fixes and commits there. `main` stays; the fix
    lands on the task's branch, by overnight's commit, as the check saw it."""
    user_with_work(repo, tmp_path / "remote.git")
    before = users_repository(repo)
    task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "submit"]}
    config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task])
    server.enqueue(
        call("run_command", {"command": "git checkout main && sed -i s/helo/hello/ greet.py && git commit -qam 'fix greet'"}),
        call("submit", {"summary": "fixed"}),
    )
    assert overnight("run", "--config", str(config)) == 0
    assert users_repository(repo) == before
    assert "'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
    assert report_json(config, capsys)["tasks"][0]["outcome"] == "succeeded"


def test_fences_a_git_too_old_or_no_bash_cannot_hold_are_said_to_be_off(tmp_path: Path) -> None:
    """Git before 2.32 ignores the settings the fences give through the environment (the hooks, the
    global config), and the front and hooks are bash scripts: either way the fences are off, and said so."""
    from orchestrator.confinement import fences_missing

    old_git = tmp_path / "git"
    old_git.write_text("#!/bin/sh\necho 'git version 2.25.1'\n")
    old_git.chmod(0o755)
    assert "2.25 is older than 2.32" in fences_missing("/bin/bash", str(old_git))
    assert "no bash" in fences_missing(None, "/usr/bin/git")
    assert fences_missing("/bin/bash", shutil.which("git")) == ""  # this machine's git holds them


class TestPushesFromAClone:
    """A review's findings: the user's repository sets core.hooksPath (husky), so receive-pack there runs
    the repository's hooks, not overnight's; only the clone's pre-push hook stood between the agent and it."""

    @pytest.mark.parametrize("push", [
        "git push -q --no-verify origin HEAD:refs/heads/nv && git push -q --no-verif origin t",
        "git -c core.hooksPath=/dev/null push -q origin HEAD:refs/heads/hp",
        "git send-pack --all \"$(git remote get-url origin)\"",
    ])
    def test_a_push_into_a_husky_users_repository_is_refused(self, agent: Any, repo: Path, push: str) -> None:
        (repo / ".husky" / "_").mkdir(parents=True)
        git(repo, "config", "core.hooksPath", ".husky/_")
        before = git(repo, "for-each-ref")
        done = agent(f"git clone -q {repo} cloned && cd cloned && git switch -qc mine && git tag t && {push}")
        assert not done.ok and git(repo, "for-each-ref") == before, done.output

    def test_a_clone_still_pushes_to_a_fixture_with_no_verify(self, agent: Any) -> None:
        made = agent("git init -q --bare srv.git && git init -q c && cd c && echo a > a && git add a && git commit -qm a "
                     "&& git push -q --no-verify ../srv.git HEAD:refs/heads/x && git send-pack ../srv.git HEAD:refs/heads/y")
        assert made.ok, made.output


class TestSendPackFromAClone:
    """Review 4: send-pack's destination after `--`, or relative from a folder of the clone, reached the user's repository."""

    @pytest.mark.parametrize("push", ["git send-pack -- {repo} mine", "mkdir -p a/b && cd a/b && git send-pack {up}/repo mine"])
    def test_a_send_pack_into_the_users_repository_is_refused(self, agent: Any, repo: Path, push: str) -> None:
        (repo / ".husky" / "_").mkdir(parents=True)
        git(repo, "config", "core.hooksPath", ".husky/_")
        before = git(repo, "for-each-ref")
        up = os.path.relpath(repo.parent, agent.tree.path / "cloned")
        done = agent(f"git clone -q {repo} cloned && cd cloned && git switch -qc mine && " + push.format(repo=repo, up=up))
        assert not done.ok and git(repo, "for-each-ref") == before, done.output

    def test_a_send_pack_from_a_folder_of_a_clone_to_a_fixture_works(self, agent: Any) -> None:
        made = agent("git init -q --bare srv.git && git init -q c && cd c && echo a > a && git add a && git commit -qm a "
                     "&& mkdir s && cd s && git send-pack ../srv.git HEAD:refs/heads/y && git send-pack -- ../srv.git HEAD:refs/heads/z")
        assert made.ok, made.output
