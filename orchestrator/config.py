"""overnight.toml: one typed section per component, validated once.

Every error becomes a `ConfigError` whose one-line message names the key,
because a cron job's only reader is a person at breakfast. This module reads the file; the whole config's record is
config_record.py's, each section's is its own module's (`[model]`: model_section.py, `[[task]]`: task_section.py).
"""

from __future__ import annotations

import codecs
import stat
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config_errors import first_error, first_nul, key_name
from orchestrator.config_record import Config
from orchestrator.errors import ConfigError
from orchestrator.files import looked_up
from orchestrator.guards_section import GuardsConfig
from orchestrator.model_section import ModelConfig
from orchestrator.night_section import NightConfig
from orchestrator.schedule_section import ScheduleConfig
from orchestrator.store_section import StoreConfig
from orchestrator.task_section import TaskConfig

# The records the rest of the code names, importable from here with the load.
__all__ = [
    "Config", "GuardsConfig", "ModelConfig", "NightConfig", "ScheduleConfig", "StoreConfig", "TaskConfig", "load_config", "parse_config",
]


def load_config(path: Path | str, *, require_tasks: bool = True) -> Config:
    """Read and validate `path`; raise ConfigError with one line naming the key."""
    source = Path(path)
    found = looked_up(source, ConfigError, "config file")
    if found is not None and not stat.S_ISREG(found.st_mode) and not stat.S_ISDIR(found.st_mode):
        raise ConfigError(f"config file {source} is not a regular file (a pipe or a device would be read forever)")
    try:
        # utf-8-sig: Windows editors start a UTF-8 file with a byte-order mark, which TOML does not allow.
        raw = tomllib.loads(source.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        # Relative, the bare default said nothing of where it was looked for (`report` run from another folder).
        raise ConfigError(
            f"config file not found: {source.absolute()} (create one with `overnight init`, or name yours with --config)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {source}: {_not_utf8(exc)}") from None
    except OSError as exc:  # strerror: "Is a directory", not "[Errno 21] ...: '<the path again>'"
        raise ConfigError(f"cannot read config file {source}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib reads nested arrays and tables by recursion
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    except ValueError as exc:  # an integer past Python's 4300-digit limit for reading one
        raise ConfigError(f"{source}: not valid TOML: {str(exc).split(';')[0]}") from None
    config = parse_config(raw, source=source)
    if require_tasks and not config.task:
        raise ConfigError(f"{source}: [[task]]: no tasks defined")
    return config


# Longest first: UTF-32's little-endian mark begins with UTF-16's.
_BYTE_ORDER_MARKS = {
    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16",
}


def _not_utf8(exc: UnicodeDecodeError) -> str:
    # Windows PowerShell's `>` and Notepad's "Unicode" write UTF-16 with a byte-order mark: the codec's
    # words ("can't decode byte 0xff in position 0") did not say what to do about it.
    encoding = next((name for mark, name in _BYTE_ORDER_MARKS.items() if exc.object.startswith(mark)), None)
    if encoding is not None:
        return f"it is {encoding} (it starts with a {encoding} byte-order mark); save it as UTF-8"
    return str(exc)


def parse_config(raw: dict[str, Any], *, source: Path) -> Config:
    if "source" in raw:
        raise ConfigError(f"{source}: unknown key 'source'")
    with_nul = first_nul(raw, ())
    if with_nul is not None:
        # TOML allows "\u0000"; no path, URL, git name or command can carry it (Python refuses it in each).
        raise ConfigError(f"{source}: {key_name(with_nul)}: contains a NUL character (\\u0000), which no path, name or command can carry")
    try:
        return Config.model_validate({**raw, "source": source})
    except ValidationError as exc:
        raise ConfigError(f"{source}: {first_error(exc)}") from None
