#!/usr/bin/env bash
# The prepared GPU check: agentbolt-torch's policy server and update on CUDA in bf16 with a small
# random model, a few GRPO steps end to end through the gateway (synchronous and max_staleness=1),
# then the same steps with vLLM generating when vLLM is installed (else a "vllm: not run" line
# says what could not run), printing tokens/s and s/step. Sized for one H100 and the machine's own Python (3.11+ with torch,
# transformers and peft); it fetches nothing.
#
#   scripts/gpu_check.sh                  # on the GPU machine, from the repository root
#   scripts/gpu_check.sh --wheels DIR     # first install missing Python packages from a local wheel folder
#   PYTHON=python3.12 scripts/gpu_check.sh
#
# What it does, in order (each step fails loudly and says what to do):
#   1. checks the Python (>= 3.11) and that torch sees a CUDA device;
#   2. lists the Python packages agentbolt needs that this Python lacks (scripts/gpu_check.py
#      --missing) and installs them from --wheels DIR (pip --no-index), or stops naming them and the
#      command that builds such a folder on a machine with PyPI;
#   3. makes the workspace importable without network: pip install --no-deps --no-build-isolation -e
#      packages/core -e packages/algo-torch when hatchling is there, else PYTHONPATH;
#   4. runs scripts/gpu_check.py --device cuda (prints lines starting "gpu_check:", ends "gpu_check: ok").
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
WHEELS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done

fail() { printf '\ngpu_check.sh: FAILED: %s\n\n' "$*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || fail "no '$PY' on PATH (set PYTHON=/path/to/python3.12)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || fail "$("$PY" -V 2>&1) is too old: agentbolt needs Python 3.11 or newer (set PYTHON=...)"
"$PY" -c 'import torch' 2>/dev/null || fail "'$PY' cannot import torch: this check uses the machine's own CUDA torch"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  fail "torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device (torch.cuda.is_available() is False).
This check needs a GPU; run it on the device machine. The same code runs on CPU with:
    python scripts/gpu_check.py --device cpu --quick"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

missing="$("$PY" scripts/gpu_check.py --missing)"
if [ -n "$missing" ]; then
  if [ -z "$WHEELS" ]; then
    fail "'$PY' lacks these Python packages: $(echo $missing)
Build a wheel folder on a machine with PyPI (same Python minor version and platform), carry it, and rerun:
    pip download --only-binary=:all: --python-version $("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') --platform manylinux2014_x86_64 -d shared/wheels $(echo $missing)
    scripts/gpu_check.sh --wheels shared/wheels"
  fi
  echo "gpu_check.sh: installing from $WHEELS (no network): $(echo $missing)"
  # shellcheck disable=SC2086
  "$PY" -m pip install --no-index --find-links "$WHEELS" $missing \
    || fail "pip could not install $(echo $missing) from $WHEELS (missing wheels or their dependencies?)"
fi

if "$PY" -c 'import hatchling' 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps --no-build-isolation --no-index -e packages/core -e packages/algo-torch \
    || fail "pip install -e of packages/core and packages/algo-torch failed (see above)"
else
  echo "gpu_check.sh: hatchling is not installed: using the workspace through PYTHONPATH instead of pip install -e"
  export PYTHONPATH="$PWD/packages/core/src:$PWD/packages/algo-torch/src${PYTHONPATH:+:$PYTHONPATH}"
fi

exec "$PY" scripts/gpu_check.py --device cuda
