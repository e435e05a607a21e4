"""``python -m agentbolt.testing.fake_llm --port P --config file.json [--workers N]``.

Serves the fake OpenAI-compatible API on 127.0.0.1. Once the socket listens it prints one line,
``READY http://127.0.0.1:PORT/v1``, on stdout (``--port 0`` picks a free port); logs go to
stderr. SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson
from pydantic import ValidationError

from .app import CONFIG_ENV, FakeLLMApp
from .backend import FakeLLM
from .server import bind_socket, uvicorn_config

_DESCRIPTION = (
    "Serve the fake OpenAI-compatible API (agentbolt.testing.fake_llm) on 127.0.0.1. "
    "Prints 'READY http://127.0.0.1:PORT/v1' on stdout once listening; SIGTERM or Ctrl-C stops it."
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until terminated; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m agentbolt.testing.fake_llm", description=_DESCRIPTION)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free port; default)")
    parser.add_argument("--config", help="JSON file with the FakeLLMConfig fields (rules, failures, ...)")
    parser.add_argument("--workers", type=int, default=1, help="server processes sharing the socket (default 1)")
    parser.add_argument("--no-record", action="store_true", help="do not keep a log of requests (long benchmarks)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = orjson.loads(Path(args.config).read_bytes()) if args.config else {}
        if args.no_record:
            config["record"] = False
        backend = FakeLLM.from_config(config)
    except (OSError, orjson.JSONDecodeError, ValidationError) as exc:
        parser.error(f"bad --config: {exc}")
    if args.workers < 1:
        parser.error("--workers must be at least 1")

    sock = bind_socket(args.port)
    port = sock.getsockname()[1]
    common = {"log_level": args.log_level, "loop": "auto", "http": "auto"}
    if args.workers == 1:
        import uvicorn

        server = uvicorn.Server(uvicorn_config(FakeLLMApp(backend), **common))
        _ready(port)
        server.run(sockets=[sock])
    else:
        from uvicorn.supervisors import Multiprocess

        os.environ[CONFIG_ENV] = orjson.dumps(backend.to_config()).decode()
        config = uvicorn_config(
            "agentbolt.testing.fake_llm.app:app_from_env", factory=True, workers=args.workers, **common
        )
        _ready(port)
        Multiprocess(config, sockets=[sock]).run()
    return 0


def _ready(port: int) -> None:
    sys.stdout.write(f"READY http://127.0.0.1:{port}/v1\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
