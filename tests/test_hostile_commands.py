"""Commands the agent runs in its worktree cannot reach past it: not the user's git, not the next iteration."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands import run_shell
from tests.conftest import git, make_repo


class TestGitInCommands:
    def test_the_agents_own_git_commit_runs_no_user_hook_no_signing_and_is_authored_by_overnight(self, tmp_path: Path):
        """`git commit` through run_command gets overnight's git settings: no hook, no gpg, overnight as author."""
        repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
        ran = tmp_path / "ran.log"
        hook = repo / ".git" / "hooks" / "post-commit"
        hook.write_text(f"#!/bin/sh\necho hook >> {ran}\n")
        hook.chmod(0o755)
        gpg = tmp_path / "gpg.sh"
        gpg.write_text(f"#!/bin/sh\necho gpg >> {ran}\nexit 1\n")
        gpg.chmod(0o755)
        git(repo, "config", "gpg.program", str(gpg))
        git(repo, "config", "commit.gpgsign", "true")
        git(repo, "config", "user.name", "The User")
        git(repo, "config", "user.email", "user@example.com")
        result = run_shell("git commit -q --allow-empty -m agent && git log -1 --format='%an <%ae> / %cn'", repo, 10, 1000)
        assert result.exit_code == 0, result.output
        assert result.output.strip() == "overnight <overnight@localhost> / overnight"
        assert not ran.exists(), ran.read_text()
