"""The repository's config, which the user's checkout shares, put back as it was after the agent's commands.
(orchestrator/shared_config.py; the commands themselves are in test_confinement.py)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.shared_config import kept_config, restore_config_copy
from tests.conftest import git, make_repo


def test_a_copy_that_could_not_be_kept_leaves_no_old_config_for_a_later_command_to_put_back(tmp_path: Path) -> None:
    """A command whose copy of the config could not be written (the state dir's disk full) fails; the config as it
    was then stayed behind as the "before" of the next command, which put it back over the user's change since."""
    config = tmp_path / "config"
    config.write_text("[core]\n\tbare = false\n")
    with pytest.raises(OSError):
        with kept_config(config, tmp_path / "gone" / "git-config.kept"):
            pass
    users = '[core]\n\tbare = false\n[remote "upstream"]\n\turl = https://example.com/upstream.git\n'
    config.write_text(users)  # the user adds a remote in their own checkout
    with kept_config(config, None):
        pass  # an agent command that leaves the config alone
    assert config.read_text() == users


def _repo_with_a_kept_copy(folder: Path) -> tuple[Path, Path, bytes]:
    """A git repository at `folder` and the place its config's copy is kept; with the config as it is."""
    config = make_repo(folder, {"a.txt": "a\n"}) / ".git" / "config"
    return config, folder.parent / "git-config.kept", config.read_bytes()


def test_a_config_whose_path_holds_a_line_break_is_put_back(tmp_path: Path) -> None:
    """A repository folder named with a line break: the copy's path was cut at it, the config's bytes written to
    another file (the folder's name up to the break) and the config itself left as the agent changed it."""
    config, copy, before = _repo_with_a_kept_copy(tmp_path / "my\nrepo")
    with kept_config(config, copy):
        git(config.parent.parent, "config", "remote.origin.url", "https://evil.example/x.git")
        assert restore_config_copy(copy) == os.path.realpath(config)  # what the next night's recovery does
        assert config.read_bytes() == before and not (tmp_path / "my").exists()


def test_a_copy_kept_by_the_version_before_is_put_back(tmp_path: Path) -> None:
    """A night killed under the previous version (the path, a line break, the bytes) recovered by this one."""
    config, copy, before = _repo_with_a_kept_copy(tmp_path / "repo")
    copy.write_bytes(b"overnight: a copy of " + os.fsencode(os.path.realpath(config)) + b"\n" + before)
    git(config.parent.parent, "config", "remote.origin.url", "https://evil.example/x.git")
    assert restore_config_copy(copy) == os.path.realpath(config)
    assert config.read_bytes() == before and not copy.exists()


def test_a_copy_by_the_version_before_of_a_path_with_a_line_break_writes_no_other_file(tmp_path: Path) -> None:
    """The previous version's copy cannot say where its path ends: the part before the break is no config."""
    config, copy, before = _repo_with_a_kept_copy(tmp_path / "my\nrepo")
    copy.write_bytes(b"overnight: a copy of " + os.fsencode(os.path.realpath(config)) + b"\n" + before)
    assert restore_config_copy(copy) is None
    assert not (tmp_path / "my").exists() and config.read_bytes() == before and not copy.exists()


@pytest.mark.parametrize("cut", ["short of its end", "right after the path"])
def test_a_torn_copy_is_never_put_back(tmp_path: Path, cut: str) -> None:
    """A copy a power loss cut short is removed and nothing put back: not half a config, not an empty one."""
    config, copy, _ = _repo_with_a_kept_copy(tmp_path / "repo")
    with kept_config(config, copy):
        git(config.parent.parent, "config", "remote.origin.url", "https://example.com/users-own.git")
        saved = copy.read_bytes()
        path = os.fsencode(os.path.realpath(config))
        copy.write_bytes(saved[:-8] if cut == "short of its end" else saved[: saved.index(path) + len(path)])
        users = config.read_bytes()
        assert restore_config_copy(copy) is None
        assert config.read_bytes() == users and not copy.exists()
