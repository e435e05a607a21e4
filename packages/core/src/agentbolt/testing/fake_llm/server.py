"""Run the fake server: in-process (:class:`FakeLLMServer`) or as a subprocess (:class:`FakeLLMProcess`).

Both listen on 127.0.0.1 only, on a random free port unless told otherwise.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, overload

import orjson
import uvicorn

from agentbolt.errors import UserError

from .app import FakeLLMApp
from .backend import FakeLLM
from .config import FakeLLMConfig
from .request_log import RecordedRequest, RequestLog

__all__ = ["HOST", "FakeLLMProcess", "FakeLLMServer", "RemoteRequestLog", "bind_socket", "uvicorn_config"]

HOST = "127.0.0.1"
"""The only address the fake server listens on."""


def bind_socket(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (``port=0``: a free port chosen by the OS)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def uvicorn_config(app: Any, **overrides: Any) -> uvicorn.Config:
    """The uvicorn settings of the fake server: lean (no access log, no lifespan, no date or
    server header, no proxy headers) and without touching the host's logging configuration."""
    options: dict[str, Any] = {
        "lifespan": "off",
        "log_config": None,
        "access_log": False,
        "proxy_headers": False,
        "server_header": False,
        "date_header": False,
        "ws": "none",
        "timeout_graceful_shutdown": 2,
        "timeout_keep_alive": 30,
        "backlog": 2048,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves the host's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class _Addresses:
    """``port``, ``url`` and ``base_url`` of a fake LLM that is running (``_port`` set)."""

    _port: int | None

    @property
    def port(self) -> int:
        """The port listened on (after start)."""
        if self._port is None:
            raise UserError(f"the {type(self).__name__} is not running; use it as a context manager or call start()")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the OpenAI client's ``base_url``."""
        return f"{self.url}/v1"


class FakeLLMServer(_Addresses):
    """The fake server in this process: ``async with`` runs it on the current event loop,
    ``with`` runs it on a background thread (for sync code and sync clients).

    Example::

        async with FakeLLMServer(FakeLLM(default_reply="hi")) as server:
            client = AsyncOpenAI(base_url=server.base_url, api_key="x")
            ...
        assert server.requests[0].body["model"] == "fake-model"

    Do not call a sync client against a server started with ``async with`` on the same loop
    (it would block the loop it needs); use ``with`` for that.
    """

    def __init__(self, backend: FakeLLM | None = None, *, port: int = 0) -> None:
        self.backend = backend if backend is not None else FakeLLM()
        """The backend answering the requests."""
        self.app = FakeLLMApp(self.backend)
        """The ASGI application being served."""
        self._want_port = port
        self._port: int | None = None
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_thread: asyncio.Event | None = None

    # -- addresses ----------------------------------------------------------------------------

    @property
    def requests(self) -> RequestLog:
        """The requests received (the backend's log)."""
        return self.backend.requests

    # -- on the current event loop --------------------------------------------------------------

    async def start(self) -> None:
        """Start serving on the running event loop; returns once the port accepts requests."""
        if self._task is not None:
            raise UserError("the fake LLM server is already running")
        sock = bind_socket(self._want_port)
        self._port = sock.getsockname()[1]
        self.app.closing = False
        self._server = _QuietServer(uvicorn_config(self.app))
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        try:
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # raises the startup error
                    raise RuntimeError("the fake LLM server stopped during startup")
                await asyncio.sleep(0.002)
        except BaseException:
            self._task.cancel()
            self._task = self._server = self._port = None
            sock.close()
            raise

    async def stop(self) -> None:
        """Stop serving: pending waits end at once; in-flight answers finish."""
        if self._task is None or self._server is None:
            return
        self.app.close()
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._task = None
            self._server = None

    async def __aenter__(self) -> FakeLLMServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- on a background thread ---------------------------------------------------------------

    def __enter__(self) -> FakeLLMServer:
        if self._thread is not None:
            raise UserError("the fake LLM server is already running")
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._thread_main, args=(started,), name="fake-llm-server", daemon=True)
        self._thread.start()
        try:
            started.result(timeout=30)
        except BaseException:
            self._thread.join(timeout=5)
            self._thread = None
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop_thread is not None:
            self._loop.call_soon_threadsafe(self._stop_thread.set)
        self._thread.join(timeout=30)
        self._thread = None

    def _thread_main(self, started: concurrent.futures.Future[None]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop_thread = asyncio.Event()
            try:
                await self.start()
            except BaseException as exc:
                started.set_exception(exc)
                return
            started.set_result(None)
            await self._stop_thread.wait()
            await self.stop()

        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
        self._loop = None


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] ships uvloop
        return None
    return uvloop.new_event_loop


class FakeLLMProcess(_Addresses):
    """The fake server in a subprocess (``python -m agentbolt.testing.fake_llm``).

    Accepts a :class:`FakeLLM` without callables, a :class:`FakeLLMConfig`, its JSON form, or
    the path of a JSON file. ``with`` (or ``async with``) starts it and waits until it answers;
    leaving stops it. With ``workers > 1`` uvicorn runs that many processes on one socket;
    each keeps its own scripts, failure counters and request log.

    Example::

        with FakeLLMProcess(FakeLLM(default_reply="hi"), workers=2) as proc:
            client = OpenAI(base_url=proc.base_url, api_key="x")
    """

    def __init__(
        self,
        backend: FakeLLM | FakeLLMConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        workers: int = 1,
        port: int = 0,
        startup_timeout_s: float = 30.0,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise UserError(f"workers must be at least 1, got {workers}")
        self._config_path: Path | None = None
        self._config: dict[str, Any] | None = None
        if isinstance(backend, str | os.PathLike):
            self._config_path = Path(backend)
        elif isinstance(backend, FakeLLM):
            self._config = backend.to_config()
        elif isinstance(backend, FakeLLMConfig):
            self._config = FakeLLM.from_config(backend).to_config()
        else:
            self._config = FakeLLM.from_config(backend or {}).to_config()
        self.workers = workers
        self._want_port = port
        self._timeout = startup_timeout_s
        self._python = python
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None
        self._port: int | None = None

    @property
    def pid(self) -> int | None:
        """Process id of the server (the supervisor when ``workers > 1``)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Launch the server and wait until it answers ``/health``.

        Raises:
            RuntimeError: it exited or did not answer within ``startup_timeout_s`` (with its stderr).
        """
        if self._proc is not None:
            raise UserError("the fake LLM process is already running")
        self._tmp = Path(tempfile.mkdtemp(prefix="agentbolt-fake-llm-"))
        config_path = self._config_path
        if config_path is None:
            config_path = self._tmp / "config.json"
            config_path.write_bytes(orjson.dumps(self._config))
        cmd = [self._python, "-m", "agentbolt.testing.fake_llm", "--port", str(self._want_port)]
        cmd += ["--config", str(config_path), "--workers", str(self.workers)]
        env = dict(os.environ if self._env is None else self._env)
        with open(self._tmp / "stderr.log", "wb") as stderr:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + self._timeout
            self._port = self._read_port(deadline)
            self._wait_healthy(deadline)
        except BaseException:
            self.stop()
            raise

    def _read_port(self, deadline: float) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    self._fail("did not report its port in time")
                chunk = os.read(fd, 4096)
                if not chunk:
                    self._fail("exited during startup")
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode(errors="replace")
        if not line.startswith("READY "):
            self._fail(f"printed an unexpected line: {line!r}")
        return int(line.rsplit(":", 1)[1].split("/", 1)[0])

    def _wait_healthy(self, deadline: float) -> None:
        import httpx  # imported here: `import httpx` is slow and server processes never need it

        with httpx.Client(timeout=2.0) as client:
            while True:
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                assert self._proc is not None
                if self._proc.poll() is not None:
                    self._fail("exited during startup")
                if time.monotonic() > deadline:
                    self._fail("did not answer /health in time")
                time.sleep(0.02)

    def _fail(self, what: str) -> None:
        log = ""
        if self._tmp is not None and (self._tmp / "stderr.log").exists():
            log = (self._tmp / "stderr.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the fake LLM process {what}; its stderr:\n{log}")

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 10 s) and remove its temporary files."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # stray workers of this server's own process group
            if proc.stdout is not None:
                proc.stdout.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self._port = None

    @property
    def requests(self) -> RemoteRequestLog:
        """The server's request log, read over HTTP (with ``workers > 1``: whichever worker answers)."""
        return RemoteRequestLog(self.url)

    def __enter__(self) -> FakeLLMProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeLLMProcess:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


class RemoteRequestLog(Sequence[RecordedRequest]):
    """A fake server's request log read over HTTP (``GET``/``DELETE /_fake/requests``).

    Same reading interface as :class:`RequestLog`; each access fetches the current log.
    """

    def __init__(self, url: str) -> None:
        self.url = f"{url}/_fake/requests"

    def snapshot(self) -> list[RecordedRequest]:
        """The current log."""
        import httpx

        response = httpx.get(self.url, timeout=10.0)
        response.raise_for_status()
        return [RecordedRequest.from_dict(r) for r in response.json()]

    def clear(self) -> None:
        """Clear the server's log."""
        import httpx

        httpx.delete(self.url, timeout=10.0).raise_for_status()

    @overload
    def __getitem__(self, index: int) -> RecordedRequest: ...
    @overload
    def __getitem__(self, index: slice) -> list[RecordedRequest]: ...
    def __getitem__(self, index: int | slice) -> RecordedRequest | list[RecordedRequest]:
        return self.snapshot()[index]

    def __len__(self) -> int:
        return len(self.snapshot())

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self.snapshot())
