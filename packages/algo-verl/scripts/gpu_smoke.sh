#!/usr/bin/env bash
# GPU smoke run of agentbolt-verl: two V1 training steps of Qwen2.5-0.5B-Instruct on one GPU
# with a one-call agent. For a machine with verl's docker image (verlai/verl, the tag built for
# verl 0.9.1 / vLLM 0.24 / torch 2.11 / CUDA 13), or any box with the GPU install of the README.
#
#   bash packages/algo-verl/scripts/gpu_smoke.sh            # from the repository root
#
# UNRUN: written without access to a GPU. The store server, the gateway (started without
# upstreams: the trainer points it at verl's vLLM replicas through GatewayClient) and the runners
# are agentbolt's CLI; override GATEWAY_CMD / RUNNER_CMD / AGENTBOLT_GATEWAY_CONTROL to change them.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../../.." && pwd)"
WORK="${WORK:-$(mktemp -d /tmp/agentbolt-verl-smoke.XXXX)}"
STORE_PORT="${STORE_PORT:-8200}"
GATEWAY_PORT="${GATEWAY_PORT:-8100}"
STEPS="${STEPS:-2}"
export AGENTBOLT_STORE_URL="http://127.0.0.1:${STORE_PORT}"
export AGENTBOLT_GATEWAY_URL="http://127.0.0.1:${GATEWAY_PORT}/v1"
export AGENTBOLT_GATEWAY_CONTROL="${AGENTBOLT_GATEWAY_CONTROL:-agentbolt.gateway:GatewayClient}"
export AGENTBOLT_TRAIN_TASKS="$WORK/tasks.jsonl"
GATEWAY_CMD="${GATEWAY_CMD:-agentbolt gateway serve --store $AGENTBOLT_STORE_URL --port $GATEWAY_PORT}"
RUNNER_CMD="${RUNNER_CMD:-agentbolt runner smoke_agent:agent --store $AGENTBOLT_STORE_URL --concurrency 32}"

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  # verl's image has torch/vLLM/flash-attn; add agentbolt and the V1 trainer's extras
  pip install -e "$REPO/packages/core" -e "$REPO/packages/algo-verl" "verl[vllm,fsdp]==0.9.1" \
    "transferqueue==0.1.11" cachetools openai
fi
python - <<'PY'
import torch, vllm, verl, transfer_queue  # noqa: F401
assert torch.cuda.is_available(), "no CUDA GPU"
print("torch", torch.__version__, "vllm", vllm.__version__, "verl", verl.__version__)
PY

cd "$WORK"
python "$REPO/packages/algo-verl/examples/smoke_agent.py" 64 > "$AGENTBOLT_TRAIN_TASKS"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
agentbolt store serve --store "sqlite:///$WORK/store.db" --port "$STORE_PORT" > store.log 2>&1 & pids+=($!)
$GATEWAY_CMD > gateway.log 2>&1 & pids+=($!)
PYTHONPATH="$REPO/packages/algo-verl/examples${PYTHONPATH:+:$PYTHONPATH}" $RUNNER_CMD > runner.log 2>&1 & pids+=($!)
sleep 5

python -m agentbolt_verl train "$REPO/packages/algo-verl/examples/qwen2.5-0.5b-1gpu.yaml" \
  -o "trainer.total_training_steps=$STEPS" -o "trainer.default_local_dir=$WORK/checkpoints" 2>&1 | tee train.log

# the run must have trained on agentbolt rollouts and logged our counters
grep -q "agentbolt/rollouts/rollouts" train.log
grep -q "agentbolt/advantage/rollouts" train.log
grep -q "actor/pg_loss" train.log
echo "agentbolt-verl smoke: OK ($WORK)"
