#!/usr/bin/env bash
# Run the atheris fuzz targets, time-boxed, with the repo's seed corpora and dictionaries.
#
#   ci/fuzz.sh [SECONDS] [TARGET ...]       SECONDS per target (default: $FUZZ_SECONDS, else 60)
#   targets: chunk_hash key_codec server_requests (default: all)
#
# Per target: tests/fuzz/corpus/<target> seeds (read only) and tests/fuzz/dicts/<target>.dict;
# new inputs go to fuzz-out/<target>/corpus, crashes to fuzz-out/<target>/crash-*,
# the libFuzzer log to fuzz-out/<target>/fuzz.log. server_requests runs against
# one `lmcache server` started here (python -m fixtures.drivers.server), stopped on exit
# whatever happens (trap). Extra libFuzzer flags: FUZZ_ARGS="-seed=1 ...".
# Exit status: 0 when no target crashed or failed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n '2,12p' ci/fuzz.sh | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT=$PWD
PY=$ROOT/.venv/bin/python
SECONDS_PER=${FUZZ_SECONDS:-60}
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then SECONDS_PER=$1; shift; fi
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(chunk_hash key_codec server_requests)
OUT=$ROOT/fuzz-out
SLACK=240  # start-up (imports, the server, rank processes) and the final check, on top of SECONDS_PER

die() { echo "ci/fuzz.sh: $*" >&2; exit 2; }
[ -x "$PY" ] || die ".venv is missing: run ci/setup.sh"
[[ "$SECONDS_PER" =~ ^[0-9]+$ ]] && [ "$SECONDS_PER" -gt 0 ] || die "SECONDS must be a positive integer, got '$SECONDS_PER'"
"$PY" -c "import atheris" 2>/dev/null || die "atheris is not installed: run ci/setup.sh"
for t in "${TARGETS[@]}"; do
  [ -f "tests/fuzz/$t.py" ] && [ -d "tests/fuzz/corpus/$t" ] || die "unknown target '$t' (have: $(ls tests/fuzz/corpus | tr '\n' ' '))"
done

# ---------------------------------------------------------------------------
# The server for server_requests, and the clean-up that always runs
# ---------------------------------------------------------------------------
SERVER_RUNNER=""   # pid of `python -m fixtures.drivers.server` (it owns the lmcache server process)
SERVER_DIR=""      # its work dir (removed by the runner on SIGINT; here if it could not)
PID_FILES=()

cleanup() {
  if [ -n "$SERVER_RUNNER" ] && kill -0 "$SERVER_RUNNER" 2>/dev/null; then
    kill -TERM "$SERVER_RUNNER" 2>/dev/null   # KeyboardInterrupt -> LMCacheServer.close()
    for _ in $(seq 1 100); do kill -0 "$SERVER_RUNNER" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$SERVER_RUNNER" 2>/dev/null && kill -KILL "$SERVER_RUNNER" 2>/dev/null
  fi
  if [ -n "${SERVER_PID:-}" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null; sleep 2; kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  [ -n "$SERVER_DIR" ] && [ -d "$SERVER_DIR" ] && rm -rf "$SERVER_DIR"
  SERVER_PID="" SERVER_DIR=""
  # POSIX shm segments LMCache names after the creating pid, for the processes these runs started.
  for f in "${PID_FILES[@]}"; do
    [ -f "$f" ] || continue
    while read -r pid; do
      [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && rm -f /dev/shm/lmcache_kv_"$pid"_* 2>/dev/null
    done < "$f"
  done
  SERVER_RUNNER=""
}
FUZZER=""         # pid of the running target's `timeout`
on_signal() {
  if [ -n "$FUZZER" ]; then  # libFuzzer stops on SIGTERM (-handle_term); its rank processes follow it
    kill -TERM "$FUZZER" 2>/dev/null
    wait "$FUZZER" 2>/dev/null
  fi
  echo "ci/fuzz.sh: interrupted" >&2
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

start_server() {
  local info="$OUT/server_requests/server.json"
  : > "$info"
  # In a session of its own (a Ctrl-C meant for the fuzzer must not stop the server
  # under it); it stops on SIGINT/SIGTERM from cleanup, or when this script dies
  # (PR_SET_PDEATHSIG), through KeyboardInterrupt -> LMCacheServer.close().
  LMCACHE_LOG_LEVEL=${LMCACHE_FUZZ_SERVER_LOG_LEVEL:-CRITICAL} setsid "$PY" -c '
import runpy, signal, sys
from fixtures.drivers import procs
def stop(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
procs._die_with_parent()
sys.argv = ["fixtures.drivers.server", "--chunk-size", "16"]
runpy.run_module("fixtures.drivers.server", run_name="__main__")' > "$info" 2> "$OUT/server_requests/server-runner.log" &
  SERVER_RUNNER=$!
  for _ in $(seq 1 900); do
    [ -s "$info" ] && break
    kill -0 "$SERVER_RUNNER" 2>/dev/null || break
    sleep 0.2
  done
  [ -s "$info" ] || { echo "ci/fuzz.sh: the lmcache server did not start: $(tail -n 3 "$OUT/server_requests/server-runner.log")" >&2; return 1; }
  eval "$("$PY" - "$info" <<'EOF'
import json, os, shlex, sys
d = json.loads(open(sys.argv[1]).readline())
for k, v in (("LMCACHE_FUZZ_URL", d["url"]), ("LMCACHE_FUZZ_HTTP", d["http_url"]),
             ("LMCACHE_FUZZ_SERVER_PID", d["pid"]), ("SERVER_DIR", os.path.dirname(d["log"]))):
    print(f"{k}={shlex.quote(str(v))}")
EOF
)"
  SERVER_PID=$LMCACHE_FUZZ_SERVER_PID
  export LMCACHE_FUZZ_URL LMCACHE_FUZZ_HTTP LMCACHE_FUZZ_SERVER_PID
  echo "$SERVER_PID" > "$OUT/server_requests/server.pid"
  PID_FILES+=("$OUT/server_requests/server.pid")
  echo "ci/fuzz.sh: lmcache server pid $SERVER_PID at $LMCACHE_FUZZ_URL ($LMCACHE_FUZZ_HTTP)"
}

# ---------------------------------------------------------------------------
# One target
# ---------------------------------------------------------------------------
SUMMARY=()
FAILED=0

run_target() {
  local t=$1 dir="$OUT/$1" rc
  mkdir -p "$dir/corpus"
  rm -f "$dir"/fuzz.log
  if [ "$t" = server_requests ]; then
    start_server || { SUMMARY+=("$(printf '%-16s server did not start' "$t")"); FAILED=1; return; }
  fi
  export LMCACHE_FUZZ_PID_FILE="$dir/children.pids"
  PID_FILES+=("$LMCACHE_FUZZ_PID_FILE")
  echo "ci/fuzz.sh: $t for ${SECONDS_PER}s (log: ${dir#"$ROOT"/}/fuzz.log)"
  # In the background, so that a Ctrl-C / TERM reaches the trap at once (a foreground
  # `timeout` sits in its own process group and would run to the end first).
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  timeout --signal=TERM --kill-after=30 $((SECONDS_PER + SLACK)) \
    "$PY" "tests/fuzz/$t.py" -max_total_time="$SECONDS_PER" -timeout=60 -rss_limit_mb=4096 \
      -artifact_prefix="$dir/" -dict="tests/fuzz/dicts/$t.dict" -print_final_stats=1 ${FUZZ_ARGS:-} \
      "$dir/corpus" "tests/fuzz/corpus/$t" > "$dir/fuzz.log" 2>&1 &
  FUZZER=$!
  wait "$FUZZER"
  rc=$?
  FUZZER=""
  [ "$t" = server_requests ] && cleanup
  local stats crashes=() f
  stats=$("$PY" - "$dir/fuzz.log" <<'EOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
lines = [l for l in text.splitlines() if re.match(r"#\d+\s", l) and " cov: " in l]
done = [l for l in lines if re.search(r"\sDONE\s", l)]
line = (done or lines or [""])[-1]
def get(pat):
    m = re.search(pat, line)
    return m.group(1) if m else "?"
units = re.search(r"stat::number_of_executed_units:\s*(\d+)", text)
execs = units.group(1) if units else get(r"^#(\d+)")
rate, cov, ft, corp = get(r"exec/s: (\d+)"), get(r"cov: (\d+)"), get(r" ft: (\d+)"), get(r"corp: (\d+)")
note = "" if done else "  (no DONE line: last status line)"
known = re.search(r"findings stepped over [^:]*: (.*)$", text, re.M)
if known:
    note += "  known stepped over: " + known.group(1)
print(f"execs {execs:>8}  exec/s {rate:>6}  cov {cov:>5}  ft {ft:>5}  corpus {corp:>4}{note}")
EOF
)
  for f in "$dir"/crash-* "$dir"/timeout-* "$dir"/oom-* "$dir"/leak-* "$dir"/window-*; do
    [ -e "$f" ] && crashes+=("$f")
  done
  local status=ok
  [ "$rc" -ne 0 ] && status="rc=$rc"
  [ ${#crashes[@]} -gt 0 ] && status="FOUND ${#crashes[@]}"
  [ "$status" != ok ] && FAILED=1
  SUMMARY+=("$(printf '%-16s %-9s %s' "$t" "$status" "$stats")")
  local env=""
  [ "${LMCACHE_FUZZ_KNOWN:-skip}" != skip ] && env="LMCACHE_FUZZ_KNOWN=$LMCACHE_FUZZ_KNOWN "
  for f in "${crashes[@]}"; do
    if [ -d "$f" ]; then  # a server check failed: the inputs since the last passing one, in order
      echo "replay: $env.venv/bin/python tests/fuzz/$t.py ${f#"$ROOT"/}/*"
    else
      echo "replay: $env.venv/bin/python tests/fuzz/$t.py ${f#"$ROOT"/}"
    fi
  done
  if [ "$rc" -ne 0 ] && [ ${#crashes[@]} -eq 0 ]; then
    echo "ci/fuzz.sh: $t exited $rc without a crash file; last lines of ${dir#"$ROOT"/}/fuzz.log:" >&2
    grep -v "LMCache INFO\|^INFO: Instrumenting" "$dir/fuzz.log" | tail -n 5 >&2
  fi
}

mkdir -p "$OUT"
for t in "${TARGETS[@]}"; do
  mkdir -p "$OUT/$t"
  run_target "$t"
done
echo "ci/fuzz.sh: ${SECONDS_PER}s per target"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
