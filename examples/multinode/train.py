"""The algorithm's side of the multi-node run: torch-grpo with its runners as Ray actors.

    python examples/multinode/train.py --ray HEAD:6379 --store http://STORE:4747 --gateway-host ADDR

Runs on the algorithm machine, which has joined the Ray cluster as a node with 0 CPUs (the
driver needs a Ray node on its machine). ``AGENTBOLT_STORE_TOKEN`` and
``AGENTBOLT_GATEWAY_TOKEN`` hold the store server's and the gateway's bearer tokens. The
``--runners`` workers (1 CPU and the custom resource ``runner_node`` each) land on the worker nodes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "quickstart"))

from math_tasks import make_tasks  # noqa: E402
from multinode_agent import gated_math_agent  # noqa: E402

from agentbolt.options import GatewayOptions, RunnerOptions  # noqa: E402
from agentbolt.trainer import Trainer  # noqa: E402
from agentbolt_torch.training.algorithm import TorchGRPO  # noqa: E402
from agentbolt_torch.training.asynchronous import add_async_argument, rollouts_in_flight  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ray", required=True, help="Ray cluster address (HEAD:6379)")
    p.add_argument("--store", required=True, help="store server URL (http://HOST:4747)")
    p.add_argument("--gateway-host", required=True, help="address of this machine the workers reach")
    p.add_argument(
        "--node-ip", help="this machine's Ray node address, where Ray cannot tell (several nodes on one machine)"
    )
    p.add_argument("--model", default="tiny", help="tiny (random, default) or smollm2")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--val", type=int, default=8)
    p.add_argument("--runners", type=int, default=2, help="Ray runner workers (one per worker node here)")
    add_async_argument(p)
    p.add_argument("--out", default="runs/multinode")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = os.environ.get("AGENTBOLT_GATEWAY_TOKEN")
    if not token:
        p.error("set AGENTBOLT_GATEWAY_TOKEN: the gateway listens beyond loopback and needs a bearer token")
    algorithm = TorchGRPO(
        args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        sampling={"max_tokens": 24},
        evaluation={"every": args.steps},
        output={"out_dir": args.out, "checkpoint_every": None},
    )
    trainer = Trainer(
        gated_math_agent,
        algorithm,
        store=args.store,
        runners=RunnerOptions(
            n=args.runners,
            concurrency=rollouts_in_flight(args.batch_size, args.group_size, args.max_staleness),
            kind="ray",
            ray_address=args.ray,
            ray_options={
                "num_cpus": 1,
                "resources": {"runner_node": 1},
                "driver_node_ip": args.node_ip,
            },
            timeout_s=300.0,
        ),
        gateway=GatewayOptions(host=args.gateway_host, token=token),
        progress=False,
    )
    result = trainer.fit(
        make_tasks(200, seed=1, prefix="train-", heldout=False),
        make_tasks(args.val, seed=2, prefix="val-", heldout=True),
        max_staleness=args.max_staleness,
    )
    summary = result.to_dict()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "result.json").write_text(json.dumps(summary, indent=2))
    print(
        f"multinode: {result.steps} steps on {args.model}, policy version {result.policy_version}, "
        f"held-out accuracy {result.accuracy_before} -> {result.accuracy_after}, {result.seconds_per_step:.1f} s/step",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
