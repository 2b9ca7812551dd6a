"""A pytest junit XML as a recorded result in docs/results/ (rendered by ci/measurements.py).

    .venv/bin/pytest -n auto --junitxml=/tmp/suite.xml
    .venv/bin/python ci/run-summary.py /tmp/suite.xml --command '.venv/bin/pytest -n auto'
        # -> docs/results/suite-DATE.json: passed/failed/error/skipped/xfailed, pytest's total
        #    time, date, host, the command, the lmcache/vllm/torch versions

    .venv/bin/python ci/run-summary.py --matrix                       # .matrix/results/*.xml
    .venv/bin/python ci/run-summary.py --matrix .matrix/results/lmcache-0.5.5.xml ...
        # -> docs/results/matrix-DATE.json: one row per ci/matrix.sh run (build, selection)

The date is the junit's (the run's start, in UTC). The versions are the junit's properties
`lmcache`, `vllm`, `torch` where it has them, else those the run's header line names (--log:
the run's output), else the installed ones of the python that runs this (a matrix run: what
ci/matrix.sh recorded next to its junit). The host's CPU model is read
here only when the junit's hostname is this machine's (run it where the suite ran), and the
record says so; otherwise it is left unrecorded. A run that pytest did not finish (a
KeyboardInterrupt or a timeout in its log: --log, or the .log ci/matrix.sh writes next to its
junit) is marked interrupted. Files identical byte for byte are converted once.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import re
import socket
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measurements  # noqa: E402  (ci/measurements.py: the results' format and what each carries)

ROOT = measurements.ROOT
#: pytest's banner of a run it did not finish (KeyboardInterrupt, a collection error, pytest-timeout),
#: printed among the last lines of its output, just before the final summary line
INTERRUPTED = re.compile(r"^[!+]+ (KeyboardInterrupt|Interrupted|Timeout)\b")


def counts(root: ET.Element) -> tuple[dict[str, int], list[str], list[str]]:
    """pytest's outcome counts (a testcase's failure before its error before its skip) and the
    ids of the failed and the errored tests."""
    c = {k: 0 for k in measurements.COUNTS}
    failed: list[str] = []
    errors: list[str] = []
    for tc in root.iter("testcase"):
        if not tc.get("name"):  # an interrupted xdist run leaves a nameless testcase: no test
            continue
        tid = f"{tc.get('classname', '')}::{tc.get('name')}"
        skip = tc.find("skipped")
        if tc.find("failure") is not None:
            c["failed"] += 1
            failed.append(tid)
        elif tc.find("error") is not None:
            c["error"] += 1
            errors.append(tid)
        elif skip is not None:
            c["xfailed" if skip.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            c["passed"] += 1
    return c, failed, errors


def suite_attrs(root: ET.Element) -> tuple[str | None, float | None, str | None, dict]:
    """(start date in UTC, total seconds, hostname, properties) of the junit's test suites."""
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    stamps = [s.get("timestamp") for s in suites if s.get("timestamp")]
    date = None
    if stamps:
        t = datetime.datetime.fromisoformat(min(stamps))
        date = t.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")
    secs = [float(s.get("time")) for s in suites if s.get("time")]
    props = {p.get("name"): p.get("value") for s in suites for p in s.iter("property")}
    hosts = {s.get("hostname") for s in suites if s.get("hostname")}
    return date, (round(sum(secs), 1) if secs else None), (hosts.pop() if len(hosts) == 1 else None), props


def host_of(hostname: str | None, cores: int | None = None) -> dict:
    """The run's host: its CPU model read here only where the junit's hostname (and, where
    recorded, its core count) is this machine's."""
    here = measurements.host()
    same = hostname is not None and hostname == socket.gethostname() and cores in (None, here["cores"])
    if same:
        return {**here, "hostname": hostname, "cpu_model_source": "read when converted, on the run's host"}
    return {"cpu_model": None, "cores": cores, "hostname": hostname}


def interrupted(log: pathlib.Path | None) -> bool:
    if log is None or not log.exists():
        return False
    tail = log.read_text(errors="replace").splitlines()[-8:]
    return any(INTERRUPTED.match(line) for line in tail)


def versions_in_log(log: pathlib.Path | None) -> dict:
    """The versions the run's own header line names (`lmcache-pbt: lmcache X, vllm Y, ...; ...`)."""
    if log is None or not log.exists():
        return {}
    m = re.search(r"^lmcache-pbt: (lmcache [^;]+)", log.read_text(errors="replace"), re.M)
    return _versions(m.group(1)) if m else {}


def rel(p: pathlib.Path) -> str:
    p = p.resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def suite_record(xml: pathlib.Path, command: str, log: pathlib.Path | None) -> dict:
    root = ET.parse(xml).getroot()
    date, secs, hostname, props = suite_attrs(root)
    c, failed, errors = counts(root)
    names = ("lmcache", "vllm", "torch", "hypothesis")
    header = versions_in_log(log)
    if any(props.get(n) for n in names):
        vers, source = {n: props.get(n) for n in names if props.get(n)}, "the junit's properties"
    elif header:
        vers, source = header, "the run's header line (--log)"
    else:
        vers, source = measurements.versions(names), "installed where converted"
    return {
        "kind": "suite",
        "date": date,
        "host": host_of(hostname),
        "command": command,
        "versions": vers,
        "versions_source": source,
        "counts": c,
        "duration_s": secs,
        "interrupted": interrupted(log),
        "failed": failed,
        "errors": errors,
        "junit": rel(xml),
        "summarized_by": measurements.command_line(),
    }


def _versions(text: str) -> dict:
    """'lmcache 0.5.7rc2, vllm 0.33.0, torch 2.13.0+cpu' -> {name: version}."""
    out = {}
    for part in (text or "").split(","):
        name, _, ver = part.strip().partition(" ")
        if name and ver:
            out[name] = ver
    return out


def matrix_record(xmls: list[pathlib.Path]) -> dict:
    builds: list[dict] = []
    seen: dict[str, dict] = {}
    for xml in sorted(xmls):
        digest = hashlib.sha256(xml.read_bytes()).hexdigest()
        if digest in seen:
            seen[digest].setdefault("same_as", []).append(xml.name)
            continue
        root = ET.parse(xml).getroot()
        date, secs, hostname, _ = suite_attrs(root)
        c, failed, errors = counts(root)
        side = xml.with_suffix(".json")  # what fixtures/compat/matrix.run_build recorded next to it
        run = json.loads(side.read_text()) if side.exists() else {}
        b = {
            "label": xml.stem.removeprefix("lmcache-"),
            "junit": xml.name,
            "build": run.get("build"),
            "vllm": run.get("vllm"),
            "select": run.get("select"),
            "run_command": run.get("command"),
            "date": date,
            "versions": _versions(run.get("versions", "")),
            "host": host_of(hostname, run.get("cores")),
            "seconds": run.get("seconds"),
            "duration_s": secs,
            "counts": c,
            "pytest_summary": run.get("summary"),
            "interrupted": interrupted(xml.with_suffix(".log")),
            "failed": failed,
            "errors": errors,
        }
        seen[digest] = b
        builds.append(b)
    builds.sort(key=lambda b: (b["date"] or "", b["label"]))
    dates = [b["date"] for b in builds if b["date"]]
    return {
        "kind": "matrix",
        "date": max(dates) if dates else None,
        "command": measurements.command_line(),
        "builds": builds,
    }


def out_path(kind: str, record: dict, out: str | None) -> pathlib.Path:
    """--out, or docs/results/KIND-DAY.json; a second run of the same day gets -2, -3 ...; the
    same run converted again replaces its own file."""
    if out:
        return pathlib.Path(out)
    day = (record.get("date") or measurements.utc_now())[:10]
    n = 1
    while True:
        p = measurements.RESULTS / f"{kind}-{day}{'' if n == 1 else f'-{n}'}.json"
        if not p.exists():
            return p
        try:
            if json.loads(p.read_text()).get("date") == record.get("date"):
                return p
        except ValueError:
            pass
        n += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "junit", nargs="*", help="junit XML file(s): one for a suite run; --matrix: default .matrix/results/*.xml"
    )
    ap.add_argument("--matrix", action="store_true", help="convert ci/matrix.sh's junit files (one row each)")
    ap.add_argument("--command", help="the exact command that produced the junit (a suite run: required)")
    ap.add_argument("--log", help="the run's output, to tell whether pytest finished (a suite run)")
    ap.add_argument("--out", help="where to write (default docs/results/KIND-DATE.json)")
    a = ap.parse_args(argv)
    if a.matrix:
        xmls = [pathlib.Path(p) for p in a.junit] or sorted((ROOT / ".matrix" / "results").glob("*.xml"))
        if not xmls:
            raise SystemExit("run-summary: no junit files (.matrix/results/*.xml): run ci/matrix.sh first")
        record, kind = matrix_record(xmls), "matrix"
    else:
        if len(a.junit) != 1:
            ap.error("name one junit file (or --matrix)")
        if not a.command:
            ap.error("say which command produced it: --command '.venv/bin/pytest -n auto ...'")
        record, kind = (
            suite_record(pathlib.Path(a.junit[0]), a.command, pathlib.Path(a.log) if a.log else None),
            "suite",
        )
    path = measurements.write(out_path(kind, record, a.out), record)
    print(f"run-summary: wrote {rel(path)}; regenerate the page: {measurements.COMMAND}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
