"""The night's llama-server kept running: started on a free port that is really ours, watched, started again on
its port when it dies (the OOM killer) so that one death does not pause every later task, and stopped at the end
without waiting for a restart under way."""

from __future__ import annotations

import secrets
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from orchestrator.errors import Cancelled, ModelUnreachable
from orchestrator.llama_health import PortTaken, first_line, log_size, wait_healthy
from orchestrator.llama_process import STOP_GRACE_S, free_port, running_servers, start_server, stop_server
from orchestrator.local_model_files import LocalModelFiles

STARTUP_TIMEOUT_S = 60.0
# How often the night's server is started again after dying; how often a start looks for another port.
MAX_RESTARTS = 3
PORT_ATTEMPTS = 3
_WATCH_EVERY_S = 0.5


class ServerKeeper:
    """The night's llama-server process: started, watched, started again when it dies, stopped.

    A restart runs in the watcher's thread without the lock, so that `stop` never waits for one:
    it sets `_stopping`, which ends a start under way (as a signal does), and stops whatever
    process the keeper holds then or is handed after. The watcher outlives the server it started:
    a child started from a thread is sent SIGTERM when that thread ends (llama_process's parent-death signal), and a
    second SIGTERM makes llama-server abandon its clean stop and exit 1.
    """

    def __init__(self, files: LocalModelFiles, context: int, log_path: Path, cancel: Any, log: Any) -> None:
        self._files, self._context, self._log_path, self._cancel, self._log = files, context, log_path, cancel, log
        self._process: subprocess.Popen | None = None
        self.port = 0
        self.pid = 0  # the running server's (a restart changes it); 0 while none runs
        self.last_pid = 0  # the last one started
        self.returncode: int | None = None
        # A random name the server answers with (`--alias`): proof that the port's server is ours.
        self._alias = f"overnight-{secrets.token_hex(6)}"
        self._stopping = threading.Event()
        self._watch_over = threading.Event()  # set once the server is stopped: then the watcher may end
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    @property
    def cancelled(self) -> bool:
        """Whether a start under way must end: the night was signalled, or the server is being stopped."""
        return self._stopping.is_set() or (self._cancel is not None and self._cancel.cancelled)

    @property
    def why(self) -> str:
        return self._cancel.why if self._cancel is not None and self._cancel.cancelled else "stopping"

    def use(self, files: LocalModelFiles) -> None:
        """Start the server on `files` from now on (the model written again)."""
        self._files = files

    def start(self) -> None:
        for _ in range(PORT_ATTEMPTS):
            try:
                self._hold(self._started_on(free_port()))
                return
            except PortTaken:
                continue
        raise ModelUnreachable(f"llama-server found no free port to listen on after {PORT_ATTEMPTS} tries (its log: {self._log_path})")

    def _started_on(self, port: int) -> subprocess.Popen:
        """One start on `port`: the process, healthy; ModelUnreachable, PortTaken or Cancelled, none left running."""
        offset = log_size(self._log_path)
        process = start_server(self._files, self._context, self._log_path, port, self._alias)
        try:
            wait_healthy(process, port, self._log_path, offset, STARTUP_TIMEOUT_S, self, self._alias)
        except BaseException:
            stop_server(process)
            raise
        self.port = port
        return process

    def _hold(self, process: subprocess.Popen) -> None:
        with self._lock:
            if self._stopping.is_set():  # stopped while it started: not kept
                stop_server(process)
                raise Cancelled(self.why)
            self._process, self.pid, self.last_pid = process, process.pid, process.pid

    def watch(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="local-model-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        restarts = 0
        while not self._watch_over.wait(_WATCH_EVERY_S):
            with self._lock:
                if self._stopping.is_set() or self._process is None or self._process.poll() is None:
                    continue
                dead, self._process, self.pid = self._process, None, 0
            running_servers.discard(dead)
            self.returncode = dead.returncode
            self._log.warning(
                "local_model_died", pid=dead.pid, exit_code=dead.returncode,
                hint="killed by SIGKILL: the out-of-memory killer?" if dead.returncode == -signal.SIGKILL else "",
            )
            if restarts >= MAX_RESTARTS:
                self._log.error("local_model_not_restarted", restarts=restarts, error="restarted too often tonight")
                return
            restarts += 1
            try:
                self._hold(self._started_on(self.port))
            except Cancelled:
                return  # the night is ending
            except (ModelUnreachable, PortTaken, OSError) as exc:
                self._log.error("local_model_not_restarted", restarts=restarts, error=first_line(str(exc)) or type(exc).__name__)
                return
            self._log.warning("local_model_restarted", pid=self.pid, port=self.port, restarts=restarts)

    def stop(self) -> int | None:
        """Stop the server (and a restart under way); its exit code, or the dead one's."""
        with self._lock:  # from here the watcher starts none again
            self._stopping.set()
            process, self._process = self._process, None
        code = stop_server(process) if process is not None else None
        # Only now may the watcher end: its end sends SIGTERM to a server it started again.
        self._watch_over.set()
        if self._watcher is not None:
            self._watcher.join(timeout=STARTUP_TIMEOUT_S + STOP_GRACE_S)
        return code if process is not None else self.returncode
