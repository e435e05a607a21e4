"""Where the gateway's time goes under load: a py-spy profile of ``agentbolt gateway serve`` while
``benchmarks/gateway.py`` loads it, once per process placement, summed into a few shares.

Run:  uv run python benchmarks/gateway_profile.py [--placement shared pinned] [--seconds 20] [--record PATH]

For each placement it starts ``benchmarks/gateway.py --api chat --latency-ms 50 --concurrency 64
--arms durable --placement <one>`` (the gateway with the durable call log; see that script for
the placements), waits until the gateway has forwarded its first load (start-up done), then samples the gateway process with ``py-spy record``
(Python frames, idle threads left out) for ``--seconds``. A sample counts in a share when one of
the share's frames is on its stack: the shares are of the samples in which the gateway was doing
something (running, or in a system call, or waiting for a core inside one), so they can overlap
and need not sum to 100 %. ``shared`` shows what the gateway is charged for when it competes
with the load generator and the backend for the cores; ``pinned`` its own work.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson
from bench_record import load_average, write_record

SHARES = {
    "answer_socket_write": ("_ServerConnection.write",),
    "upstream_socket_write": ("_ClientConnection.send",),
    "span_build": ("SpanWriter._build",),
    "call_log_append": ("CallLog.append",),
    "store_batches": ("SpanWriter._loop",),
    "attempt_checks": ("AttemptCache.",),
    "request_parsing": ("_ServerConnection.data_received",),
}
"""Share -> frame names (a prefix of py-spy's ``function (file:line)``) whose presence counts a sample."""


def forwarded(port: int) -> int:
    """Calls the gateway on ``port`` has forwarded so far (0 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gateway/stats", timeout=5) as answer:
            return int(orjson.loads(answer.read())["forwarded"])
    except (OSError, ValueError, KeyError):
        return 0


def gateway_pid(parent: int, timeout_s: float = 60.0) -> tuple[int, int]:
    """The ``agentbolt gateway serve`` process the benchmark ``parent`` started, and its port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and b"gateway" in cmd and b"serve" in cmd:
                return int(proc.name), int(cmd[cmd.index(b"--port") + 1])
        time.sleep(0.2)
    raise RuntimeError("the benchmark started no gateway")


def profile(placement: str, seconds: float) -> dict[str, object]:
    bench = subprocess.Popen(
        [
            sys.executable,
            "benchmarks/gateway.py",
            "--api",
            "chat",
            "--latency-ms",
            "50",
            "--concurrency",
            "64",
            "--requests",
            "3000",
            "--repeat",
            "100",
            "--arms",
            "durable",
            "--placement",
            placement,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid, port = gateway_pid(bench.pid)
        deadline = time.monotonic() + 300
        while forwarded(port) < 3000 and time.monotonic() < deadline:  # past start-up and the first load
            time.sleep(0.5)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "raw.txt"
            spy = Path(sys.executable).with_name("py-spy")
            subprocess.run(
                [
                    *(str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200"),
                    *("--format", "raw", "--nonblocking", "--output", str(out)),
                ],
                check=True,
                capture_output=True,
            )
            stacks = out.read_text().splitlines()
            if os.environ.get("KEEP_RAW"):
                Path(os.environ["KEEP_RAW"]).write_text("\n".join(stacks))
    finally:
        bench.send_signal(signal.SIGINT)
        try:
            bench.wait(30)
        except subprocess.TimeoutExpired:
            bench.kill()
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks:
        if not line.strip():
            continue
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        total += int(n)
        for share, names in SHARES.items():
            if any(frame.startswith(names) for frame in frames):
                counts[share] += int(n)
    return {
        "samples": total,
        "shares_pct": {share: round(100 * counts[share] / max(total, 1), 1) for share in SHARES},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placement", nargs="+", choices=["shared", "pinned"], default=["shared", "pinned"])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--record", type=Path)
    args = ap.parse_args()
    load_start = load_average()
    results = {}
    for placement in args.placement:
        results[placement] = profile(placement, args.seconds)
        print(placement, orjson.dumps(results[placement]).decode(), flush=True)
    if args.record is not None:
        write_record(args.record, "benchmarks/gateway_profile.py", load_start, placements=results)


if __name__ == "__main__":
    main()
