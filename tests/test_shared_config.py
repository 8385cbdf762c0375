"""The repository's config, which the user's checkout shares, put back as it was after the agent's commands.
(orchestrator/shared_config.py; the commands themselves are in test_confinement.py)"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.shared_config import kept_config


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
