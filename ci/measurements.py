"""docs/measurements.md, generated from the recorded results in docs/results/*.json.

    .venv/bin/python ci/measurements.py            # write docs/measurements.md
    .venv/bin/python ci/measurements.py --check    # exit 1 (one line) when the page is not what the results give

The results are written by their producers, never by hand:

    .venv/bin/python ci/bench.py ... --json docs/results/bench-DATE.json         # kind "bench"
    .venv/bin/python ci/run-summary.py JUNIT --command '...'                      # kind "suite"
    .venv/bin/python ci/run-summary.py --matrix [.matrix/results/*.xml]           # kind "matrix"

Every result carries its date (UTC), its host (CPU model and core count) and the command that
made it; this module also holds the helpers the producers record them with (`host`, `utc_now`,
`command_line`, `versions`). The page says nothing the files do not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "measurements.md"
COMMAND = ".venv/bin/python ci/measurements.py"


# ---------------------------------------------------------------------------
# what every producer records
# ---------------------------------------------------------------------------


def cpu_model() -> str | None:
    """The CPU model /proc/cpuinfo names (None where it names none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def host() -> dict:
    """This machine: CPU model and core count (os.cpu_count())."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count()}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line(argv: list[str] | None = None) -> str:
    """This process's command line as it was typed: the interpreter relative to the working
    directory where it lies under it (`.venv/bin/python`), the script as given."""
    argv = sys.argv if argv is None else argv
    exe = sys.executable or "python"
    try:
        rel = os.path.relpath(exe)
        exe = rel if not rel.startswith("..") else exe
    except ValueError:
        pass
    return shlex.join([exe, *argv])


def revision() -> dict:
    """The suite's git commit and whether tracked files differ from it (None outside a checkout)."""

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return {"commit": None}
    return {"commit": commit, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def versions(names: tuple[str, ...] = ("lmcache", "vllm", "torch", "hypothesis")) -> dict:
    """The installed versions (fixtures.compat.preflight.installed: None where not installed)."""
    sys.path.insert(0, str(ROOT))
    from fixtures.compat.preflight import installed

    return {n: installed(n) for n in names}


def write(path: str | os.PathLike, record: dict) -> pathlib.Path:
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p


# ---------------------------------------------------------------------------
# reading and rendering
# ---------------------------------------------------------------------------


def load_results(directory: pathlib.Path = RESULTS) -> list[tuple[str, dict]]:
    """(file name, record) for every results file, oldest first (then by name)."""
    out = []
    for p in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            rec = json.loads(p.read_text())
        except ValueError as e:
            raise SystemExit(f"measurements: {p.relative_to(ROOT)} is not JSON ({e})") from None
        out.append((p.name, rec))
    return sorted(out, key=lambda nr: (str(nr[1].get("date", "")), nr[0]))


def _s(x, unit: str = " s") -> str:
    return "-" if x is None else f"{x}{unit}"


def _host(h: dict | None) -> str:
    h = h or {}
    cpu = h.get("cpu_model") or "CPU model not recorded"
    cores = h.get("cores")
    where = f" ({h['cpu_model_source']})" if h.get("cpu_model_source") and h.get("cpu_model") else ""
    return f"{cpu}{where}, {cores if cores is not None else '?'} cores"


def _versions(v: dict | None) -> str:
    return ", ".join(f"{k} {x}" for k, x in (v or {}).items() if x) or "versions not recorded"


def _table(cols: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join("-" if c is None else str(c) for c in r) + " |" for r in rows
    ]


def _head(name: str, rec: dict, title: str) -> list[str]:
    out = [
        f"### {title}: {rec.get('date', 'date not recorded')}",
        "",
        f"From [`results/{name}`](results/{name}). Host: {_host(rec.get('host'))}; {_versions(rec.get('versions'))}.",
    ]
    suite = rec.get("suite") or {}
    if suite.get("commit"):
        out[-1] += (
            f" The suite at commit `{suite['commit']}`{' (tracked files modified)' if suite.get('dirty') else ''}."
        )
    load = rec.get("load_avg")
    if load:
        out[-1] += f" Load average (1 min) {load.get('start')} at the start, {load.get('end')} at the end."
    out += ["", "    " + rec.get("command", "(command not recorded)"), ""]
    return out


def render_bench(name: str, rec: dict) -> list[str]:
    out = _head(name, rec, "Benchmark")
    if rec.get("duration_s") is not None:
        out += [f"Whole run: {rec['duration_s']} s.", ""]
    st = rec.get("server_start_s")
    if st:
        out += [f"Server start: median {st['median']} s, max {st['max']} s over {st['n']} starts.", ""]
    if rec.get("rank_spawn_s") is not None:
        out += [f"Rank processes spawned (torch + lmcache imported): {rec['rank_spawn_s']} s.", ""]
    props = rec.get("properties") or []
    if props:
        out += _table(
            ["property", "examples", "examples/s", "median", "max", "wall"],
            [
                [
                    f"`{p['property']}`",
                    p.get("examples"),
                    p.get("examples_per_s"),
                    _s(p.get("median_s")),
                    _s(p.get("max_s")),
                    _s(p.get("wall_s")),
                ]
                for p in props
            ],
        ) + [""]
    out += _faults(rec.get("faults"), "property")
    eng = rec.get("engine")
    if eng:
        if eng.get("skipped"):
            out += [f"Engine tier: skipped ({eng['skipped']}).", ""]
        else:
            if eng.get("modes"):
                out += (
                    ["Engine tier:", ""]
                    + _table(
                        ["engine", "engine start", "LLM init", "examples", "examples/s", "median", "max"],
                        [
                            [
                                m.get("mode"),
                                _s(m.get("engine_start_s")),
                                _s(m.get("llm_init_s")),
                                m.get("examples"),
                                m.get("examples_per_s"),
                                _s(m.get("median_s")),
                                _s(m.get("max_s")),
                            ]
                            for m in eng["modes"]
                        ],
                    )
                    + [""]
                )
            out += _faults(eng.get("faults"), "checks")
    if not props and not rec.get("faults") and not eng:
        out += ["(no figures in this file)", ""]
    return out


def _faults(rows: list[dict] | None, what: str) -> list[str]:
    if not rows:
        return []
    return _table(
        ["fault", what, "caught", "first failure", "shrunk", "runs", "within bound"],
        [
            [
                f"`{r['fault']}`",
                r.get(what),
                r.get("caught"),
                _s(r.get("first_failure_s")),
                _s(r.get("shrunk_s")),
                r.get("runs"),
                r.get("within_bound"),
            ]
            for r in rows
        ],
    ) + [""]


COUNTS = ("passed", "failed", "error", "skipped", "xfailed")


def render_suite(name: str, rec: dict) -> list[str]:
    out = _head(name, rec, "Whole suite")
    c = rec.get("counts") or {}
    line = ", ".join(f"{c[k]} {k}" for k in COUNTS if c.get(k)) or "no tests"
    line += f"; pytest {_s(rec.get('duration_s'))}"
    if rec.get("interrupted"):
        line += "; **interrupted** (the run did not finish: the counts are of what ran)"
    return out + [line + ".", ""]


def render_matrix(name: str, rec: dict) -> list[str]:
    out = [
        f"### Version matrix: {rec.get('date', 'date not recorded')}",
        "",
        f"From [`results/{name}`](results/{name}), converted by `{rec.get('command', '?')}`. "
        f"Each row is one `ci/matrix.sh` run (one build, one selection); `seconds` is the "
        f"run's wall time, `pytest` the junit's total.",
        "",
    ]
    rows = []
    for b in rec.get("builds", []):
        c = b.get("counts") or {}
        label = b.get("label", "?") + (" (interrupted)" if b.get("interrupted") else "")
        rows.append(
            [
                label,
                b.get("date"),
                c.get("passed", 0),
                c.get("xfailed", 0),
                c.get("skipped", 0),
                c.get("failed", 0),
                c.get("error", 0),
                _s(b.get("seconds")),
                _s(b.get("duration_s")),
            ]
        )
    out += _table(["run", "date", "pass", "xfail", "skip", "fail", "error", "seconds", "pytest"], rows) + [""]
    if any(b.get("interrupted") for b in rec.get("builds", [])):
        out += [
            "(interrupted): the run was stopped before pytest finished (its log ends with pytest's "
            "interrupt banner); the counts are of the tests that ran.",
            "",
        ]
    for b in rec.get("builds", []):
        same = f" (also recorded, identical, as {', '.join(b['same_as'])})" if b.get("same_as") else ""
        out += [
            f"* **{b.get('label')}**{same}: host {_host(b.get('host'))}; {_versions(b.get('versions'))}",
            f"  `{b.get('run_command', '(command not recorded)')}`",
        ]
    return out + [""]


RENDER = {"bench": render_bench, "suite": render_suite, "matrix": render_matrix}

MEANING = """\
## What each figure means

Measured, never asserted: nothing in the suite fails on time. Machines, loads and the suite
itself differ from run to run, so compare figures only within one result (same host, same day).

* **Server start** (`ci/bench.py`): a fresh `lmcache server` until `/healthcheck` answers and
  the event tap is ready; median and max over `--server-starts` starts.
* **examples/s** per property: `--examples` derandomized examples (the same ones every run)
  against a warm server and warm rank processes; the first example of each property (engine
  registration) is excluded from the rate (`examples` counts it: `--examples` + 1);
  `median` and `max` are seconds per example after the first, `wall` the property's whole run.
  `long_prefix` runs a fifth of the examples (at least 2).
* **Faults** (`--faults`): each self-check (`fixtures/selfchecks.py`) with its fault injected;
  `first failure` is the seconds to the first failing example (the fault server's start
  included), `shrunk` to the shrunk case, `runs` the examples it took, `within bound` whether
  the shrunk case is as small as the self-check requires.
* **Engine tier** (`--engine`, `--engine-only`): `engine start` is the seconds until an engine
  is ready (process start, imports, `LLM(...)` init, first forward), `LLM init` the part of it
  the engine reports; examples/s on the warm engine. One example is several generates (store,
  prefix cache, warm, warm alone, paced cold). The engine self-checks' times include engine and
  server start.
* **Whole suite** (`ci/run-summary.py`): pytest's counts and total time from its junit XML;
  `skipped` excludes xfails. A suite run's skips are also compared with
  `ci/expected-skips.json` (`fixtures/skips.py`).
* **Version matrix** (`ci/run-summary.py --matrix`): per `ci/matrix.sh` run (one build, one
  selection), the junit's counts; `seconds` is the build's wall time including pytest's
  start-up. The per-test tables and the one-line reason of each FAIL and skip are in the
  generated [matrix pages](next-release.md#results); what the verdicts mean, in
  [findings.md](findings.md).
"""


def render(results: list[tuple[str, dict]]) -> str:
    out = [
        f"<!-- generated by `{COMMAND}` from docs/results/*.json; do not edit: "
        "record a result (docs/running.md) and run the command again -->",
        "",
        "# Measurements",
        "",
        f"**Generated** by `{COMMAND}` from the result files in [`results/`](results/); do not "
        "edit this page by hand. How to record a result and regenerate it: "
        "[running.md](running.md#recording-results). Figures recorded by hand before this page "
        "was generated are in its git history (the last hand-written version: "
        "`git show 300db7e:docs/measurements.md`).",
        "",
        MEANING,
        "## Results",
        "",
        "Oldest first. Each result names its date (UTC), its host, the installed versions and the "
        "exact command that produced it.",
        "",
    ]
    if not results:
        out += ["(none recorded yet)", ""]
    for name, rec in results:
        kind = rec.get("kind")
        if kind not in RENDER:
            raise SystemExit(f"measurements: docs/results/{name}: unknown kind {kind!r} (one of {', '.join(RENDER)})")
        out += RENDER[kind](name, rec)
    return "\n".join(out).rstrip("\n") + "\n"


def check() -> str | None:
    """None when the page is what the results render, else the one-line reason."""
    want = render(load_results())
    try:
        have = PAGE.read_text()
    except OSError:
        have = None
    if have == want:
        return None
    return f"measurements: {PAGE.relative_to(ROOT)} is not what docs/results/ renders: regenerate it: {COMMAND}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the page differs from what the results render"
    )
    a = ap.parse_args(argv)
    if a.check:
        why = check()
        if why:
            print(why)
            return 1
        return 0
    PAGE.write_text(render(load_results()))
    print(f"measurements: wrote {PAGE.relative_to(ROOT)} from {len(load_results())} result(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
