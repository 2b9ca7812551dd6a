#!/usr/bin/env bash
# A few-minute GPU smoke run of the GPU-marked properties, for a machine lent
# briefly: no install (GPU_PYTHON must already have torch with CUDA, lmcache and the
# suite's pins; default .venv/bin/python or .venv-gpu/bin/python), the `smoke`
# profile (2-example budget unit), TP ranks sharing GPUs when there are fewer than 4.
#   ci/gpu-smoke.sh [extra pytest args...]        (SMOKE_TIMEOUT seconds, default 420)
# It runs, on CUDA: every single-shot property on both transfer modes (TP 1/2/4),
# the report's 128-chunk bracket case, one stateful tour, and one connector case
# when vllm is importable.
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_SCRIPT=ci/gpu-smoke.sh
. ci/gpu-env.sh
gpu_check_driver
PY=${GPU_PYTHON:-}
if [ -z "$PY" ]; then
  for c in .venv-gpu/bin/python .venv/bin/python; do [ -x "$c" ] && { PY=$c; break; }; done
fi
[ -n "$PY" ] || gpu_die "no environment: set GPU_PYTHON, or run TORCH_BUILD=cuda VENV=.venv-gpu ci/setup.sh first"
gpu_check_python
out=${ARTIFACTS:-gpu-smoke-out}
mkdir -p "$out"
export LMCACHE_PBT_REPRO_DIR="$PWD/$out/repros" LMCACHE_PBT_DB="$PWD/$out/hypothesis-db"
sel=(tests/test_hits.py tests/test_transfer.py tests/test_bit_identity.py tests/test_counters.py
     tests/test_long_prefix.py tests/test_stateful.py::test_a_fixed_tour_fires_every_rule)
if "$PY" -c "import vllm" 2>/dev/null; then
  sel+=("tests/test_connector.py::test_full_hit_at_chunk_boundaries")
  kfilter="not test_full_hit_at_chunk_boundaries or (llama-tp1 and exact and separate-groups)"
else
  gpu_say "vllm is not importable: the connector case is left out"
  kfilter="not connector"
fi
t0=$(date +%s)
timeout --signal=INT "${SMOKE_TIMEOUT:-420}" "$PY" -m pytest -n "$(( GPUS < 4 ? GPUS : 4 ))" -m "gpu or tp4" \
  --gpu-share --hypothesis-profile smoke -rs -k "$kfilter" "${sel[@]}" "$@" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
gpu_say "pytest exit $rc after $(( $(date +%s) - t0 )) s; log in $out/pytest.log"
[ "$rc" -eq 5 ] && { gpu_say "no GPU test collected (exit 5): a failure"; exit 1; }
exit "$rc"
