"""Benchmark: examples per second per property, server start time, time to first failure per fault.

    .venv/bin/python ci/bench.py                 # everything, ~5-10 min on 2 cores
    .venv/bin/python ci/bench.py --examples 20 --only hit_accounting,long_prefix --faults none
    .venv/bin/python ci/bench.py --json docs/results/bench-$(date -u +%F).json   # a recorded result
    .venv/bin/python ci/bench.py --engine-only --examples 10   # the real-engine tier only

Measured, not asserted: the table is for people (and the issue notes). Each
property runs `--examples` generated examples (derandomized: the same ones
every run) against a warm server and warm rank processes; the first example of
each property (engine registration) is excluded from the rate. Each fault runs
its self-check (fixtures/selfchecks.py) and reports the seconds until the first
failing example and until the shrunk case.

With --json the file also records the run: its kind ("bench"), date (UTC), host (CPU model,
core count), the exact command line, the installed lmcache/vllm/torch/hypothesis versions,
the suite's git commit and the load average at its start and end. A file under docs/results/ is a recorded result:
`ci/measurements.py` renders docs/measurements.md from them (docs/running.md, "Recording
results").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measurements  # noqa: E402  (ci/measurements.py: what every recorded result carries)
from fixtures.drivers import procs  # noqa: E402,F401  (telemetry off)


def bench_server_start(n: int) -> list[float]:
    from fixtures.case.server import ServerOptions
    from fixtures.drivers.server import LMCacheServer

    out = []
    for _ in range(n):
        s = LMCacheServer(ServerOptions())
        try:
            s.start()
            out.append(s.start_seconds)
        finally:
            s.close()
    return out


def bench_property(harness, name: str, examples: int) -> dict:
    from hypothesis import HealthCheck, Phase, given, settings

    from fixtures.properties import PROPERTIES

    prop = PROPERTIES[name]
    times: list[float] = []

    @settings(
        max_examples=examples + 1,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(w=prop.strategy())
    def run(w):
        t = time.monotonic()
        prop.check(harness, w)
        times.append(time.monotonic() - t)

    t0 = time.monotonic()
    run()
    wall = time.monotonic() - t0
    steady = times[1:] or times
    return {
        "property": name,
        "examples": len(times),
        "examples_per_s": round(len(steady) / sum(steady), 2) if sum(steady) else None,
        "median_s": round(statistics.median(steady), 3),
        "max_s": round(max(steady), 3),
        "wall_s": round(wall, 1),
    }


def bench_fault(harness, check) -> dict:
    from fixtures.selfchecks import hunt

    try:
        r = hunt(harness, check)
    finally:
        harness.release(check.options())
    return {
        "fault": check.fault,
        "property": check.property,
        "caught": r.caught,
        "first_failure_s": round(r.seconds_to_first_failure, 1) if r.seconds_to_first_failure else None,
        "shrunk_s": round(r.seconds, 1),
        "runs": r.examples,
        "within_bound": bool(r.minimal is not None and check.bound(r.minimal)),
        "shrunk_to": r.minimal.describe() if r.minimal else None,
    }


def bench_engine(harness, examples: int, faults: bool) -> dict:
    """The real-engine tier (tests/test_engine*.py): engine start, examples/s on a warm engine
    per transfer mode, and each engine self-check's time to first failure and to the shrunk case."""
    from hypothesis import HealthCheck, Phase, given, settings

    from fixtures.case.engine import DENSE, HYBRID, SLIDING, WINDOW
    from fixtures.drivers.engine_flow import run_engine_case
    from fixtures.drivers.real_engine import EnginePool, skip_reason
    from fixtures.oracle.engine import check
    from strategies.engine import engine_cases

    why = skip_reason()
    if why:
        print(f"engine tier skipped: {why}")
        return {"skipped": why}
    pool = EnginePool(harness)
    out: dict = {"modes": []}
    try:
        # every engine the properties run: (name, options, strategy keywords)
        engines = (
            [(f"dense {m}", o, {}) for m, o in sorted(DENSE.items())]
            + [(f"sliding {k}", o, {"min_len": WINDOW + 1}) for k, o in sorted(SLIDING.items())]
            + [("hybrid (state views re-pointed)", HYBRID, {"max_chunks": 3, "max_batch": 1})]
        )
        for mode, opts, kw in engines:
            t = time.monotonic()
            eng = pool.get(opts)
            start = {"wall_s": round(time.monotonic() - t, 1), "llm_init_s": eng.info.get("start_s")}
            times: list[float] = []

            @settings(
                max_examples=examples,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=engine_cases((opts,), **kw))
            def run(case):
                t1 = time.monotonic()
                found = check(run_engine_case(pool, case))
                times.append(time.monotonic() - t1)
                assert not found, found

            run()
            row = {
                "mode": mode,
                "engine_start_s": start["wall_s"],
                "llm_init_s": start["llm_init_s"],
                "examples": len(times),
                "examples_per_s": round(len(times) / sum(times), 2),
                "median_s": round(statistics.median(times), 2),
                "max_s": round(max(times), 2),
            }
            out["modes"].append(row)
            print(table([row], list(row)), flush=True)
        if faults:
            from fixtures.selfchecks import ENGINE_SELF_CHECKS as CHECKS
            from fixtures.selfchecks import search_for_failure

            frows = []
            for sc in CHECKS:
                opts = sc.options()
                t = time.monotonic()
                try:
                    caught, failures, n, secs, first = search_for_failure(
                        engine_cases((opts,), max_chunks=4, max_batch=2),
                        lambda case: check(run_engine_case(pool, case), sc.checks),
                        max_examples=sc.max_examples,
                    )
                finally:
                    pool.release(opts)
                minimal = failures[-1][0] if failures else None
                frows.append(
                    {
                        "fault": sc.fault,
                        "checks": "+".join(sc.checks),
                        "caught": caught,
                        "first_failure_s": round(first, 1) if first else None,
                        "shrunk_s": round(secs, 1),
                        "runs": n,
                        "within_bound": bool(minimal is not None and sc.small(minimal)),
                        "shrunk_to": minimal.describe() if minimal else None,
                    }
                )
                print(
                    f"{sc.id}: first failure {frows[-1]['first_failure_s']} s (engine + server start included), "
                    f"shrunk {frows[-1]['shrunk_s']} s, wall {time.monotonic() - t:.0f} s",
                    flush=True,
                )
            out["faults"] = frows
            print(
                "\nengine self-checks\n"
                + table(frows, ["fault", "checks", "caught", "first_failure_s", "shrunk_s", "runs", "within_bound"])
            )
    finally:
        pool.close()
    return out


def table(rows: list[dict], cols: list[str]) -> str:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=30, help="examples per property (default 30)")
    ap.add_argument("--only", default="", help="comma-separated property names (default: all)")
    ap.add_argument("--faults", default="all", help="'all', 'none', or comma-separated fault ids")
    ap.add_argument("--server-starts", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--engine", action="store_true", help="also bench the real-engine tier (.venv-engine)")
    ap.add_argument("--engine-only", action="store_true", help="only the real-engine tier")
    a = ap.parse_args(argv)
    started = time.monotonic()
    meta = {
        "kind": "bench",
        "date": measurements.utc_now(),
        "host": measurements.host(),
        "command": measurements.command_line(None if argv is None else [sys.argv[0], *argv]),
        "versions": measurements.versions(),
        "suite": measurements.revision(),
        "args": vars(a),
        "load_avg": {"start": round(os.getloadavg()[0], 2)},
    }

    from fixtures.drivers.rank_group import RankPool
    from fixtures.drivers.harness import Harness
    from fixtures.drivers.server import ServerPool
    from fixtures.properties import PROPERTIES
    from fixtures.selfchecks import SELF_CHECKS

    results: dict = {}
    if a.engine_only:
        harness = Harness(ServerPool(max_running=4), RankPool(size=1))
        try:
            results["engine"] = bench_engine(harness, a.examples, a.faults != "none")
        finally:
            harness.close()
        _write_json(a.json, meta, results, started)
        return 0
    starts = bench_server_start(a.server_starts) if a.server_starts else []
    if starts:
        results["server_start_s"] = {
            "n": len(starts),
            "median": round(statistics.median(starts), 2),
            "max": round(max(starts), 2),
        }
        print(
            f"server start (to /healthcheck + tap ready): median {statistics.median(starts):.2f} s, "
            f"max {max(starts):.2f} s over {len(starts)} starts\n"
        )

    harness = Harness(ServerPool(max_running=4), RankPool())
    try:
        t = time.monotonic()
        harness.ranks.ensure(4)
        results["rank_spawn_s"] = round(time.monotonic() - t, 1)
        print(f"4 rank processes spawned (torch + lmcache imported) in {results['rank_spawn_s']} s\n")
        names = [n for n in (a.only.split(",") if a.only else PROPERTIES) if n]
        rows = []
        for n in names:
            ex = max(2, a.examples // 5) if n == "long_prefix" else a.examples
            rows.append(bench_property(harness, n, ex))
            print(table(rows[-1:], list(rows[-1])), flush=True)
        results["properties"] = rows
        print("\nproperties\n" + table(rows, ["property", "examples", "examples_per_s", "median_s", "max_s", "wall_s"]))

        if a.faults != "none":
            checks = (
                SELF_CHECKS
                if a.faults == "all"
                else [c for c in SELF_CHECKS if c.id in a.faults.split(",") or c.fault in a.faults.split(",")]
            )
            frows = []
            for c in checks:
                frows.append(bench_fault(harness, c))
                print(
                    f"{c.id}: first failure {frows[-1]['first_failure_s']} s, shrunk {frows[-1]['shrunk_s']} s",
                    flush=True,
                )
            results["faults"] = frows
            print(
                "\ntime to first failure under each injected fault (includes the fault server's start)\n"
                + table(frows, ["fault", "property", "caught", "first_failure_s", "shrunk_s", "runs", "within_bound"])
            )
        if a.engine:
            results["engine"] = bench_engine(harness, a.examples, a.faults != "none")
    finally:
        harness.close()
    _write_json(a.json, meta, results, started)
    return 0


def _write_json(path: str | None, meta: dict, results: dict, started: float) -> None:
    if path:
        meta["load_avg"]["end"] = round(os.getloadavg()[0], 2)
        meta["duration_s"] = round(time.monotonic() - started, 1)
        print(f"bench: wrote {measurements.write(path, {**meta, **results})}")


if __name__ == "__main__":
    raise SystemExit(main())
