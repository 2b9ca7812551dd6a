#!/usr/bin/env bash
# The GPU CI job: install the CUDA build, check the driver, run every GPU-marked
# property (markers gpu, tp4) with the `ci` profile, keep the Hypothesis database
# and the repro files as artifacts.
#   ci/gpu-job.sh [extra pytest args...]
# Env: VENV (default .venv-gpu), ARTIFACTS (default gpu-artifacts), GPU_MARKERS
# (default "gpu or tp4"), GPU_PYTHON (an interpreter that already has everything:
# no install then), GPU_SHARE=1 (tp4 tests on fewer than 4 GPUs, ranks sharing).
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_SCRIPT=ci/gpu-job.sh
. ci/gpu-env.sh
gpu_check_driver
if [ -n "${GPU_PYTHON:-}" ]; then
  PY=$GPU_PYTHON
else
  export VENV=${VENV:-.venv-gpu}
  TORCH_BUILD=cuda ci/setup.sh || gpu_die "ci/setup.sh (CUDA build) failed"
  PY=$VENV/bin/python
fi
gpu_check_python
ARTIFACTS=${ARTIFACTS:-gpu-artifacts}
mkdir -p "$ARTIFACTS"
export LMCACHE_PBT_DB="$PWD/$ARTIFACTS/hypothesis-db"
export LMCACHE_PBT_REPRO_DIR="$PWD/$ARTIFACTS/repros"
share=()
if [ "$GPUS" -lt 4 ] && [ "${GPU_SHARE:-0}" = 1 ]; then share=(--gpu-share); fi
# one xdist worker per GPU: each worker's server and ranks use every GPU (rank R on cuda:R)
workers=$(( GPUS < 4 ? GPUS : 4 ))
set -x
"$PY" -m pytest -n "$workers" -m "${GPU_MARKERS:-gpu or tp4}" --hypothesis-profile ci "${share[@]}" \
  -rs --junitxml "$ARTIFACTS/junit.xml" "$@" 2>&1 | tee "$ARTIFACTS/pytest.log"
rc=${PIPESTATUS[0]}
set +x
if [ "$rc" -eq 5 ]; then gpu_say "no GPU-marked test was collected (exit 5): a failure"; exit 1; fi
gpu_say "pytest exit $rc; artifacts in $ARTIFACTS/ (junit.xml, pytest.log, hypothesis-db/, repros/)"
exit "$rc"
