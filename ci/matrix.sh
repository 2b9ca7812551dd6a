#!/usr/bin/env bash
# One cached environment per LMCache build (.matrix/lmcache-<build>/, layered over .venv),
# the suite (or --select 'PYTEST ARGS') run in each, one table: test x build.
#   ci/matrix.sh 0.5.0 0.5.1 0.5.2 0.5.3 0.5.4 0.5.5 0.5.6
#   ci/matrix.sh --select '-m connector -k report_flow' --vllm 0.34.0 0.5.6
#   ci/matrix.sh --table .matrix/results/*.xml
# Details: python -m fixtures.compat.matrix --help (fixtures/compat/matrix.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${LMCACHE_PBT_BASE_VENV:-.venv}/bin/python
exec "$PY" -m fixtures.compat.matrix "$@"
