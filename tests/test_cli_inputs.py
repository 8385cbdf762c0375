"""Bad input through the real CLI: one line on stderr naming the key, the documented exit code, nothing lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_config
from tests.test_cli import assert_one_line_error, overnight

API_BASE = "http://127.0.0.1:9/v1"


def config_with(tmp_path: Path, repo: Path, replace: tuple[str, str] = ("", ""), extra: str = "") -> Path:
    """The usual test config, with one text replacement and lines added at its end."""
    config = write_config(tmp_path / "overnight.toml", api_base=API_BASE, repo=repo, extra=extra)
    if replace[0]:
        text = config.read_text()
        assert replace[0] in text
        config.write_text(text.replace(replace[0], replace[1], 1))
    return config


class TestNulCharacters:
    @pytest.mark.parametrize(
        ("replace", "extra", "key"),
        [
            (("[repo]\npath = \"", "[repo]\npath = \"\\u0000"), "", "[repo] path"),
            (("[repo]\n", "[repo]\nbase = \"main\\u0000\"\n"), "", "[repo] base"),
            (("[repo]\n", "[repo]\nkeep = [\"build\", \"a\\u0000b\"]\n"), "", "[repo] keep"),
            (('dir = "state"', 'dir = "state\\u0000"'), "", "[state] dir"),
            (("", ""), "[store]\nurl = \"sqlite:///x\\u0000.db\"\n", "[store] url"),
            (("", ""), "[guards]\ncustom = [\"os\\u0000:X\"]\n", "[guards] custom"),
            (("check = \"", "check = \"true\\u0000"), "", "[[task]] #1 check"),
        ],
    )
    @pytest.mark.parametrize("command", ["run", "gc", "report"])
    def test_a_nul_in_any_string_is_one_line_naming_the_key(self, tmp_path, repo, replace, extra, key, command):
        """A NUL (legal in TOML) in any string of the config is refused at load, naming the key: no night, no state dir."""
        config = config_with(tmp_path, repo, replace, extra)
        assert_one_line_error(overnight(command, "--config", str(config)), 2, key, "NUL")
        assert not (tmp_path / "state").exists()
