"""The quickstart's peak memory, before and after agentbolt-torch's memory changes, side by side.

Run:  uv run python benchmarks/quickstart_memory.py [--model smollm2] [--steps 2] [--val 8]
      [--arms before after after-async] [--rounds 1] [--record docs/runs/quickstart_memory.json]

Each arm runs ``examples/quickstart/train.py`` under ``/usr/bin/time -v`` with the malloc
settings ``./dev`` gives training processes at that revision (read from its ``dev`` script:
``MALLOC_*`` and, where installed, the ``LD_PRELOAD`` allocator) and prints the main process's
peak RSS, the wall time, s/step and where a step's time went, read from the quickstart's own output:

An arm is ``before`` or ``after`` followed by flags, joined with ``-`` (``after-gc-jemalloc``):

- ``after``: this checkout, its quickstart's defaults and this ``./dev``'s settings;
- ``before``: agentbolt_torch as of :data:`FLAT_LAYOUT_REV` (the last revision before the package was
  split into subpackages; its code is this checkout's, laid out flat) with the files of
  :data:`CHANGED` taken from ``--before-rev`` (default ``0d07096``, main before the first memory
  change) put first on ``PYTHONPATH``, that
  revision's ``examples/quickstart`` (its defaults) and that revision's ``./dev`` settings;
- ``-async``: with ``--async 1`` (asynchronous training: a serving copy of the weights generates
  while the update runs);
- ``-mbN``: with ``--micro-batch-tokens N`` (the updater's default is 2,048 padded tokens per
  forward/backward pass);
- ``-gc`` / ``-nogc``: with ``--gradient-checkpointing`` / ``--no-gradient-checkpointing``
  (:mod:`agentbolt_torch.update.recompute`: each layer's activations recomputed in the backward
  pass instead of kept);
- ``-arenaN``: with ``MALLOC_ARENA_MAX=N`` (glibc's heaps shared by all threads);
- ``-glibc``: glibc's malloc with its default settings (no ``MALLOC_*``, nothing preloaded);
- ``-jemalloc`` / ``-jemallockeep`` / ``-tcmalloc`` / ``-tcmallocdecommit``: that
  allocator preloaded instead of ``./dev``'s choice, with the settings of :data:`ALLOCATORS`;
  ``-rrN``: tcmalloc's ``TCMALLOC_RELEASE_RATE=N``.

``--update-only`` measures policy updates instead of the whole quickstart, in a fresh process
per arm (peak RSS from ``getrusage``): a random Llama with SmolLM2's shape (vocabulary 49,152,
``--hidden``, ``--layers``; SmolLM2 has 30), ``--groups`` GRPO groups of 4 responses of 64
tokens to a 200-token prompt, the updater's defaults, the policy's default autocast (bf16 where
the CPU has bf16 units, as in the quickstart), ``--updates`` updates each on a fresh thread
(as ``asyncio.to_thread`` may run the quickstart's): the part of the quickstart the change
touches, small enough for a machine whose memory is taken by other work.

Arms alternate (``--rounds``) so that contention on a shared machine hits both. A watchdog stops
an arm (and says so) when the machine's available memory falls below ``--min-available-gb``:
other work on the machine comes first. The figures go to ``--record`` as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "packages" / "algo-torch" / "src" / "agentbolt_torch"
CHANGED = (
    "update.py",
    "update_config.py",
    "update_forward.py",
    "update_batches.py",
    "engine.py",
    "policy.py",
    "attention.py",
    "update_recompute.py",
    "_kv.py",
    "update_checkpoint.py",
)
"""The files of agentbolt_torch the memory changes touched (``before`` takes them from ``--before-rev``;
one that did not exist there is left out), by their names in the flat layout."""
FLAT_LAYOUT_REV = "d582ea7c55b9dd7e3702f9cc5495c654e91597cd"
"""The last revision with agentbolt_torch's modules in one folder: the files of :data:`CHANGED`
(flat names, from revisions before it) overlay the package as of this revision."""
ALLOCATORS: dict[str, tuple[str, dict[str, str]]] = {
    "jemalloc": ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", {}),
    "jemallockeep": (
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        {"MALLOC_CONF": "background_thread:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"},
    ),
    "tcmalloc": ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", {}),
    "tcmallocdecommit": (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        {"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"},
    ),
}
"""``-jemalloc`` / ``-jemallockeep`` / ``-tcmalloc`` arms: the allocator preloaded
(Debian's ``libjemalloc2`` / ``libtcmalloc-minimal4``) and its settings, instead of glibc's malloc."""


def allocator_package(library: str) -> str:
    return "libjemalloc2" if "jemalloc" in library else "libtcmalloc-minimal4"


MICRO_BATCHES = (256, 512, 1024)
"""``after-mbN`` arms: the updater's ``micro_batch_tokens`` (default 2048)."""


def dev_environment(rev: str | None) -> dict[str, str]:
    """The allocator settings ``./dev`` exports to training processes at ``rev`` (``None``: this
    checkout): ``export NAME="${NAME:-VALUE}"`` lines, and ``LD_PRELOAD`` when that revision's
    ``./dev`` preloads an allocator that is installed here."""
    if rev is None:
        text = (REPO / "dev").read_text()
    else:
        text = subprocess.run(
            ["git", "show", f"{rev}:dev"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
    env = dict(re.findall(r'^export (MALLOC_\w+)="\$\{\1:-([^}]*)\}"', text, flags=re.MULTILINE))
    preload = re.search(r'^AGENTBOLT_ALLOCATOR_PATHS="([^"]*)"', text, flags=re.MULTILINE)
    if preload:
        found = [path for path in preload.group(1).split() if Path(path).exists()]
        if found:
            env["LD_PRELOAD"] = found[0]
    return env


def available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def before_tree(rev: str, into: Path) -> Path:
    """A copy of agentbolt_torch with the memory change's files from ``rev``, and ``rev``'s
    examples/quickstart (the ``before`` arms run its train.py, with its defaults); returns its parent."""
    target = into / "agentbolt_torch"
    target.mkdir(parents=True)
    flat = subprocess.run(
        ["git", "archive", FLAT_LAYOUT_REV, "packages/algo-torch/src/agentbolt_torch/"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(flat)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                name = Path(member.name).relative_to("packages/algo-torch/src/agentbolt_torch")
                extracted = archive.extractfile(member)
                assert extracted is not None
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                (target / name).write_bytes(extracted.read())
    for name in CHANGED:
        path = f"packages/algo-torch/src/agentbolt_torch/{name}"
        exists = subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=REPO, capture_output=True)
        if exists.returncode != 0:  # a file the change added
            (target / name).unlink(missing_ok=True)
            continue
        text = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
        (target / name).write_text(text)
    quickstart = into / "quickstart"
    quickstart.mkdir()
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "examples/quickstart/"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in listing:
        text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True)
        (quickstart / Path(path).name).write_text(text.stdout)
    return into


UPDATE_CHILD = """
import resource, sys, threading, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from agentbolt.types import Transition
from agentbolt_torch.models import tiny_tokenizer
from agentbolt_torch.policy import Policy
from agentbolt_torch.update import PolicyUpdater, UpdateConfig

hidden, layers, groups, updates, checkpointing = (int(a) for a in sys.argv[1:6])
vocab = 49152
torch.manual_seed(0)
tokenizer = tiny_tokenizer(512)
config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
    num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 192), tie_word_embeddings=True,
    pad_token_id=tokenizer.pad_token_id, max_position_embeddings=1024)
policy = Policy(LlamaForCausalLM(config), tokenizer, name="smollm2-shape")
updater = PolicyUpdater(policy, UpdateConfig(lr=1e-5, **({"gradient_checkpointing": True} if checkpointing else {})))
g = torch.Generator().manual_seed(0)
rows = []
for i in range(groups):
    prompt = torch.randint(1, vocab, (200,), generator=g).tolist()
    for k in range(4):
        response = torch.randint(1, vocab, (64,), generator=g).tolist()
        rows.append(Transition(rollout_id=f"r{i}-{k}", group_id=f"g{i}", index=0, prompt_ids=prompt,
            response_ids=response, response_logprobs=[-10.0] * 64, advantage=float(k % 2) - 0.5))
seconds = []
for _ in range(updates):  # each on a fresh thread, as asyncio.to_thread may run them
    worker = threading.Thread(target=lambda: seconds.append(updater.update(rows).seconds))
    worker.start()
    worker.join()
print(f"UPDATE peak_rss_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} update_s={min(seconds[1:] or seconds):.3f}")
"""


def run_update_arm(arm: str, args: argparse.Namespace, pythonpath: Path | None) -> dict[str, Any]:
    env = arm_environment(arm, args, pythonpath)
    command = [
        sys.executable,
        "-c",
        UPDATE_CHILD,
        *(str(v) for v in (args.hidden, args.layers, args.groups, args.updates)),
        "1" if "gc" in arm.split("-") else "0",
    ]
    return _watched(arm, args, command, env, _parse_update)


def _parse_update(output: str, result: dict[str, Any]) -> None:
    found = re.search(r"UPDATE peak_rss_kb=(\d+) update_s=([\d.]+)", output)
    if found:
        result["peak_rss_gb"] = round(int(found.group(1)) / 2**20, 2)
        result["update_s"] = float(found.group(2))


def arm_environment(arm: str, args: argparse.Namespace, pythonpath: Path | None) -> dict[str, str]:
    """The process environment of ``arm``: ./dev's allocator settings of its revision, its code first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "TCMALLOC_")) and k != "LD_PRELOAD"}
    env.update(dev_environment(args.before_rev if arm.startswith("before") else None))
    flags = arm.split("-")[1:]
    if "glibc" in flags:
        for name in [k for k in env if k.startswith("MALLOC_") or k == "LD_PRELOAD"]:
            del env[name]
    for allocator in ALLOCATORS:
        if allocator in flags:
            library, settings = ALLOCATORS[allocator]
            if not Path(library).exists():
                raise SystemExit(
                    f"arm {arm}: {library} is not installed (apt-get install {allocator_package(library)})"
                )
            for name in [k for k in env if k.startswith("MALLOC_")]:
                del env[name]  # glibc's settings; the preloaded allocator has its own
            env["LD_PRELOAD"] = library
            env.update(settings)
    release = re.search(r"-rr(\d+)", arm)
    if release:
        env["TCMALLOC_RELEASE_RATE"] = release.group(1)
    arenas = re.search(r"-arena(\d+)", arm)
    if arenas:
        env["MALLOC_ARENA_MAX"] = arenas.group(1)
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(pythonpath)
    return env


def run_arm(arm: str, args: argparse.Namespace, pythonpath: Path | None, out: Path) -> dict[str, Any]:
    env = arm_environment(arm, args, pythonpath)
    command = [
        "/usr/bin/time",
        "-v",
        sys.executable,
        str((pythonpath / "quickstart" if pythonpath else REPO / "examples" / "quickstart") / "train.py"),
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--val",
        str(args.val),
        "--no-progress",
        "--store",
        f"sqlite:///{out}/{arm}.db",
        "--out",
        str(out / arm),
        *(["--async", "1"] if "async" in arm.split("-") else []),
        *(a for f in arm.split("-") if f.startswith("mb") for a in ("--micro-batch-tokens", f[2:])),
        *(["--gradient-checkpointing"] if "gc" in arm.split("-") else []),
        *(["--no-gradient-checkpointing"] if "nogc" in arm.split("-") else []),
    ]
    return _watched(arm, args, command, env, _parse_quickstart)


def _parse_quickstart(output: str, result: dict[str, Any]) -> None:
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", output)
    step = re.search(r"over (\d+) steps \(([\d.]+) s/step", output)
    means = re.search(r"per step \(means\): rollouts ([\d.]+) s, update ([\d.]+) s", output)
    if rss is None or step is None:
        return
    result["peak_rss_gb"] = round(int(rss.group(1)) / 2**20, 2)
    result["steps"] = int(step.group(1))
    result["s_per_step"] = float(step.group(2))
    if means:
        result["rollouts_s"], result["update_s"] = float(means.group(1)), float(means.group(2))


def _watched(arm: str, args: argparse.Namespace, command: list[str], env: dict[str, str], parse: Any) -> dict[str, Any]:
    """Run ``command``, stopping it when the machine's available memory runs low; ``parse`` fills
    the result from its output."""
    if available_gb() < args.min_start_gb:
        return {"arm": arm, "exit": None, "stopped": f"not started: {available_gb():.1f} GB available"}
    started = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    stopped: list[float] = []

    def watchdog() -> None:
        while proc.poll() is None:
            if available_gb() < args.min_available_gb:
                stopped.append(available_gb())
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    threading.Thread(target=watchdog, daemon=True).start()
    output, _ = proc.communicate()
    result: dict[str, Any] = {"arm": arm, "exit": proc.returncode, "wall_s": round(time.monotonic() - started, 1)}
    if stopped:
        result["stopped"] = f"available memory fell to {stopped[0]:.1f} GB"
        return result
    if proc.returncode == 0:
        parse(output, result)
    if "peak_rss_gb" not in result:
        result["tail"] = output[-2000:]
    return result


def print_table(results: list[dict[str, Any]], argv: list[str]) -> None:
    """The arms' table (what a run prints, and ``--report`` from a record)."""
    parsed = parser().parse_args(argv)
    update_only, updates, hidden, layers, groups = (
        parsed.update_only,
        parsed.updates,
        parsed.hidden,
        parsed.layers,
        parsed.groups,
    )
    model, steps, val = parsed.model, parsed.steps, parsed.val
    if update_only:
        print(f"\n{updates} updates, vocabulary 49,152, hidden {hidden}, {layers} layers, {groups * 4} sequences:")
    else:
        print(f"\nquickstart --model {model} --steps {steps} --val {val}, main process:")
    print(
        f"{'arm':<18} {'round':>5} {'peak RSS GB':>12} {'s/step':>8} {'update s':>9} {'rollouts s':>11} {'wall s':>8}"
    )
    for r in results:
        if "peak_rss_gb" not in r:
            why = r.get("stopped", "exit {}".format(r["exit"]))
            print(f"{r['arm']:<18} {r['round']:>5} failed: {why}")
            continue
        print(
            f"{r['arm']:<18} {r['round']:>5} {r['peak_rss_gb']:>12.2f} {r.get('s_per_step', float('nan')):>8.1f} "
            f"{r.get('update_s', float('nan')):>9.2f} {r.get('rollouts_s', float('nan')):>11.1f} {r['wall_s']:>8.0f}"
        )


def arm_name(text: str) -> str:
    """An arm: ``before`` or ``after`` and its flags (see the module's docstring)."""
    base, *flags = text.split("-")
    known = {"async", "gc", "nogc", "glibc", *ALLOCATORS}
    for flag in flags:
        if flag not in known and not re.fullmatch(r"(mb|arena|rr)\d+", flag):
            raise argparse.ArgumentTypeError(f"unknown flag {flag!r} in arm {text!r}")
    if base not in ("before", "after"):
        raise argparse.ArgumentTypeError(f"an arm starts with before or after, not {base!r}")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (default) or tiny")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--val", type=int, default=8)
    p.add_argument(
        "--arms",
        nargs="+",
        default=["before", "after"],
        type=arm_name,
        help="before|after, then any of -async (--async 1), -mbN (--micro-batch-tokens N), -gc, -arenaN, "
        f"-glibc, -{' / -'.join(ALLOCATORS)} (e.g. after-gc-jemalloc)",
    )
    p.add_argument("--rounds", type=int, default=1, help="alternate the arms this many times")
    p.add_argument("--before-rev", default="0d07096", help="the revision the 'before' arms' files and ./dev come from")
    p.add_argument("--min-available-gb", type=float, default=2.0, help="stop an arm below this much available memory")
    p.add_argument("--min-start-gb", type=float, default=4.0, help="start an arm only with this much available memory")
    p.add_argument(
        "--update-only", action="store_true", help="one policy update with SmolLM2's vocabulary, not the quickstart"
    )
    p.add_argument("--hidden", type=int, default=576, help="--update-only: hidden size (SmolLM2: 576)")
    p.add_argument("--layers", type=int, default=4, help="--update-only: layers (SmolLM2: 30)")
    p.add_argument("--groups", type=int, default=8, help="--update-only: GRPO groups of 4 (the quickstart: 8)")
    p.add_argument("--updates", type=int, default=3, help="--update-only: updates, each on a fresh thread")
    p.add_argument("--record", type=Path, help="write the figures here as JSON")
    p.add_argument("--report", type=Path, help="print the table of a record (run nothing)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.report:
        record = json.loads(args.report.read_text())
        print_table(record["results"], [a for a in record["argv"] if a])
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="agentbolt-memory-") as tmp:
        base = Path(tmp)
        before = (
            before_tree(args.before_rev, base / "before") if any(a.startswith("before") for a in args.arms) else None
        )
        for round_ in range(args.rounds):
            for arm in args.arms:
                out = base / f"round{round_}"
                out.mkdir(exist_ok=True)
                print(f"running {arm} (round {round_ + 1}/{args.rounds}) ...", flush=True)
                path = before if arm.startswith("before") else None
                result = run_update_arm(arm, args, path) if args.update_only else run_arm(arm, args, path, out)
                result["round"] = round_ + 1
                print(json.dumps(result), flush=True)
                results.append(result)
    print_table(results, sys.argv[1:] if argv is None else argv)
    if args.record:
        record = {
            "benchmark": "benchmarks/quickstart_memory.py",
            "argv": sys.argv[1:] if argv is None else argv,
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip(),
            "before_rev": args.before_rev,
            "environment": {"before": dev_environment(args.before_rev), "after": dev_environment(None)},
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "results": results,
        }
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all("peak_rss_gb" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
