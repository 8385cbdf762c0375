"""Whether a llama-server just started is ours and healthy, and when it is not, why, in one line with no secret in
it: its log's last error of this start, read past what earlier nights appended."""

from __future__ import annotations

import http.client
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from orchestrator.errors import Cancelled, ModelUnreachable
from orchestrator.redactor import Redactor


class PortTaken(Exception):
    """Something else answered on the chosen port, or llama-server could not bind it."""


def wait_healthy(
    process: subprocess.Popen, port: int, log_path: Path, offset: int, timeout_s: float, cancel: Any, alias: str
) -> None:
    """Until `/health` answers 200 and `/v1/models` names our alias; one line (ModelUnreachable) with the
    log's last error of this start when the server exits or stays unhealthy; PortTaken when the port was
    someone else's; Cancelled when the night is stopped meanwhile (`cancel`: its `cancelled` and `why`)."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if cancel is not None and cancel.cancelled:
            raise Cancelled(cancel.why)
        if process.poll() is not None:
            said = _this_start(log_path, offset)
            if "couldn't bind" in said or "address already in use" in said.lower():
                raise PortTaken(f"port {port} is taken: {_last_error(said)}")
            raise ModelUnreachable(
                f"llama-server exited with code {process.returncode} while starting: {_last_error(said)} (its log: {log_path})"
            )
        if _answers(url + "/health"):
            models = _read(url + "/v1/models")  # "" when it did not answer in time: asked again
            if models and (alias not in models or process.poll() is not None):
                raise PortTaken(f"another server answers on port {port}")
            if models:
                return
        if time.monotonic() > deadline:
            raise ModelUnreachable(
                f"llama-server did not become healthy within {timeout_s:g} s: "
                f"{_last_error(_this_start(log_path, offset))} (its log: {log_path})"
            )
        time.sleep(0.1)


def _read(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read(65536).decode("utf-8", errors="replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return ""


def log_size(path: Path) -> int:
    """Where the lines of the start about to be made will begin in the log (0 before its first)."""
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


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        # 503 while the model loads, refused before the socket is bound; not HTTP at all (another program).
        return False
