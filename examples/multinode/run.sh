#!/usr/bin/env bash
# A multi-node agentbolt run on one machine, with network namespaces standing in for machines.
#
#   examples/multinode/run.sh            # needs root (ip netns); falls back to loopback addresses
#   MODE=loopback examples/multinode/run.sh
#   STEPS=2 MODEL=tiny examples/multinode/run.sh
#
# "machines" (network namespaces on a private bridge, 10.77.0.0/24; nothing else reaches them):
#   main  10.77.0.1  PostgreSQL (its own loopback only), store server, algorithm (torch-grpo +
#                    gateway + policy server), a Ray node with 0 CPUs for the driver
#   head  10.77.0.2  Ray head (0 CPUs: schedules only)
#   w1    10.77.0.3  Ray worker node: 1 CPU, resource runner_node=1 -> one runner actor
#   w2    10.77.0.4  Ray worker node: the same
# Every server that listens beyond loopback takes a bearer token: the store server
# (AGENTBOLT_STORE_TOKEN), the gateway (AGENTBOLT_GATEWAY_TOKEN), Ray (RAY_AUTH_MODE=token,
# RAY_AUTH_TOKEN). 127.0.0.1 is used only inside the main namespace (PostgreSQL <- store server,
# gateway -> policy server). The steps are those of README.md for real machines.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
BIN="$REPO/.venv/bin"
STEPS="${STEPS:-2}"
MODEL="${MODEL:-tiny}"
MODE="${MODE:-netns}"
ID="abmn$$"                       # namespace / directory prefix, unique per run
WORK="$(mktemp -d "/tmp/$ID-XXXX")"
PIDS=()                           # each server runs in its own process group (setsid): its group is ended
NAMESPACES=()

log() { printf '[multinode] %s\n' "$*" >&2; }
secret() { "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))'; }

# -- "machines" ----------------------------------------------------------------------------------
if [[ "$MODE" == netns ]] && ! { ip netns add "$ID-probe" 2>/dev/null && ip netns del "$ID-probe"; }; then
    log "ip netns is not permitted here (needs root / CAP_SYS_ADMIN): falling back to separate processes"
    log "on distinct loopback addresses (127.0.0.2-5), one machine's network stack"
    MODE=loopback
fi
if [[ "$MODE" == netns ]]; then
    MAIN_IP=10.77.0.1 HEAD_IP=10.77.0.2 W1_IP=10.77.0.3 W2_IP=10.77.0.4
else
    MAIN_IP=127.0.0.2 HEAD_IP=127.0.0.3 W1_IP=127.0.0.4 W2_IP=127.0.0.5
fi

on() {  # on MACHINE CMD...: run CMD on that "machine"
    local machine="$1"; shift
    if [[ "$MODE" == netns ]]; then ip netns exec "$ID-$machine" "$@"; else "$@"; fi
}

serve() {  # serve MACHINE LOG CMD...: run a server on that "machine" in its own process group
    local machine="$1" logfile="$2"; shift 2
    setsid bash -c "$(declare -f on); MODE=$MODE ID=$ID; on $machine \"\$@\"" _ "$@" > "$logfile" 2>&1 &
    PIDS+=($!)
}

cleanup() {
    set +e
    log "cleaning up"
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    sleep 3
    for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
    if [[ -n "${PGBIN:-}" && -d "$WORK/pg/data" ]]; then
        on main "${PG_AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m fast stop >/dev/null 2>&1
    fi
    for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

if [[ "$MODE" == netns ]]; then
    log "creating network namespaces $ID-{main,head,w1,w2} on a bridge in $ID-sw (10.77.0.0/24)"
    ip netns add "$ID-sw"; NAMESPACES+=("$ID-sw")
    ip -n "$ID-sw" link add br0 type bridge
    ip -n "$ID-sw" link set br0 up
    i=0
    for machine in main head w1 w2; do
        i=$((i + 1))
        ns="$ID-$machine"
        ip netns add "$ns"; NAMESPACES+=("$ns")
        ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$ID-sw"
        ip -n "$ID-sw" link set "p$i" master br0 up
        ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
fi

export STORE_TOKEN GATEWAY_TOKEN RAY_TOKEN
STORE_TOKEN="$(secret)" GATEWAY_TOKEN="$(secret)" RAY_TOKEN="$(secret)"
RAY_ENV=(RAY_AUTH_MODE=token "RAY_AUTH_TOKEN=$RAY_TOKEN" RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_UV_RUN_RUNTIME_ENV=0)

wait_port() {  # wait_port MACHINE HOST PORT
    for _ in $(seq 1 240); do
        if on "$1" "$BIN/python" -c "import socket,sys; socket.create_connection(('$2', $3), 1)" 2>/dev/null; then return 0; fi
        sleep 0.5
    done
    log "nothing listens on $2:$3 after 120 s"; return 1
}

# -- 1. PostgreSQL on the main machine (as the postgres user; its loopback only) -----------------
PGBIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
PG_PORT=5432   # the main namespace's own loopback; in loopback mode a free port of the shared one
[[ "$MODE" == netns ]] || PG_PORT="$("$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
PG_AS=(); [[ $EUID -ne 0 ]] || PG_AS=(runuser -u postgres --)   # PostgreSQL refuses to run as root
mkdir -p "$WORK/pg"; chmod 755 "$WORK"; [[ $EUID -ne 0 ]] || chown postgres "$WORK/pg"
log "1. PostgreSQL ($PGBIN) on main, 127.0.0.1:$PG_PORT of that machine only"
on main "${PG_AS[@]}" "$PGBIN/initdb" -D "$WORK/pg/data" -A trust -U postgres -E UTF8 >/dev/null
on main "${PG_AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w \
    -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"

# -- 2. the store server on the main machine, beyond loopback, with a token ---------------------
log "2. store server on $MAIN_IP:4747 (bearer token)"
serve main "$WORK/store.log" env AGENTBOLT_STORE_TOKEN="$STORE_TOKEN" "$BIN/agentbolt" store serve --store "$PG_URL" \
    --host "$MAIN_IP" --port 4747
wait_port main "$MAIN_IP" 4747

# -- 3. the Ray cluster: head, two worker nodes, and the algorithm machine as a 0-CPU node -------
RAY_DIR="$WORK/ray"; mkdir -p "$RAY_DIR"
log "3. Ray head on $HEAD_IP:6379 (token auth), worker nodes $W1_IP and $W2_IP (1 CPU, runner_node=1 each)"
serve head "$WORK/ray-head.log" env "${RAY_ENV[@]}" "$BIN/ray" start --head --block --node-ip-address "$HEAD_IP" \
    --port 6379 --num-cpus 0 --include-dashboard false --temp-dir "$RAY_DIR"
wait_port head "$HEAD_IP" 6379

wait_nodes() {  # wait_nodes N: until the cluster has N live nodes (a driver on the head polling)
    on head env "${RAY_ENV[@]}" "$BIN/python" - "$HEAD_IP" "$1" "$MODE" <<'PY'
import sys, time
import ray
head, want, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# on one network stack Ray cannot tell which local node is the head's: name it
node_ip = head if mode == "loopback" else None
deadline = time.monotonic() + 240
while True:
    try:
        ray.init(address=f"{head}:6379", _node_ip_address=node_ip, logging_level="ERROR", log_to_driver=False)
        break
    except ConnectionError:  # the head's node not registered yet (slow start-up on a busy machine)
        if time.monotonic() > deadline:
            raise
        time.sleep(2)
while (alive := sum(n["Alive"] for n in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"only {alive} of {want} Ray nodes joined")
    time.sleep(1)
print(f"{alive} Ray nodes")
PY
}

# nodes join one at a time (node start-up is CPU-heavy)
n=1
for w in w1 w2; do
    ip_var="${w^^}_IP"
    serve "$w" "$WORK/ray-$w.log" env "${RAY_ENV[@]}" AGENTBOLT_GATEWAY_TOKEN="$GATEWAY_TOKEN" "$BIN/ray" start \
        --block --address "$HEAD_IP:6379" --node-ip-address "${!ip_var}" --num-cpus 1 --resources '{"runner_node": 1}'
    n=$((n + 1))
    wait_nodes "$n" >/dev/null || { tail -n 20 "$WORK/ray-$w.log"; exit 1; }
done
serve main "$WORK/ray-main.log" env "${RAY_ENV[@]}" "$BIN/ray" start --block --address "$HEAD_IP:6379" \
    --node-ip-address "$MAIN_IP" --num-cpus 0
nodes="$(wait_nodes 4)" || { tail -n 20 "$WORK/ray-main.log"; exit 1; }
log "   Ray cluster up: $nodes"

# -- 4. the algorithm on the main machine: torch-grpo, runners as Ray actors on w1 and w2 --------
log "4. training: $MODEL, $STEPS steps, gateway on $MAIN_IP (bearer token), store http://$MAIN_IP:4747"
cd "$REPO"
on main env "${RAY_ENV[@]}" AGENTBOLT_STORE_TOKEN="$STORE_TOKEN" AGENTBOLT_GATEWAY_TOKEN="$GATEWAY_TOKEN" \
    "$BIN/python" "$HERE/train.py" --ray "$HEAD_IP:6379" --store "http://$MAIN_IP:4747" \
    --gateway-host "$MAIN_IP" $([[ "$MODE" == loopback ]] && echo "--node-ip $MAIN_IP") \
    --model "$MODEL" --steps "$STEPS" --out "$WORK/out" 2>&1 \
    | grep -v -e "httpx" -e "^\s*$" | tee "$WORK/train.log"
status=${PIPESTATUS[0]}

# -- 5. what ran where: attempts per worker, from the store (PostgreSQL) ------------------------
on main "$BIN/python" - "$PG_URL" <<'PY'
import asyncio, collections, sys
from agentbolt.store import open_store
from agentbolt import types as t

async def main() -> None:
    store = open_store(sys.argv[1])
    page = await store.query_rollouts(limit=10_000)
    per_worker: collections.Counter[str] = collections.Counter()
    for r in page.items:
        for a in await store.get_attempts(r.rollout_id):
            per_worker[a.worker_id or "?"] += 1
    counts = {s.value: n for s, n in (await store.count_rollouts()).items() if n}
    print(f"store: rollouts {counts}; attempts per runner worker: {dict(per_worker)}")
    await store.close()

asyncio.run(main())
PY
[[ "$status" == 0 ]] && log "done ($MODE mode)" || log "training failed with status $status"
exit "$status"
