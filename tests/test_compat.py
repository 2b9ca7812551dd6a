"""The build-compatibility layer: capability probe, version-aware known issues, matrix report.

Cheap (no server): the probe result is the session's cached one (fixtures.compat.capabilities).
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from fixtures.compat import capabilities, known_issues, matrix, preflight


def test_probe_reports_the_installed_build():
    c = capabilities.get()
    assert c.versions["lmcache"] == preflight.installed("lmcache")
    assert c.has("server_cli"), c.why("server_cli")
    assert set(c.transfer_modes) >= {"lmcache_driven", "engine_driven"}
    header = c.header()
    for name in ("lmcache", "vllm", "torch", "hypothesis"):
        assert f"{name} " in header
    # every capability the harness asks for is either present or missing with a reason
    for cap in (*capabilities.SERVER_FLAGS, *capabilities.PATHS, *capabilities.ARGS, *capabilities.HTTP):
        assert c.has(cap) or c.why(cap), cap


def test_a_missing_capability_skips_in_one_line():
    c = capabilities.Capabilities(versions={"lmcache": "0.5.0"}, lmcache_path="", have=frozenset({"server_cli"}),
                                  missing={"server_module": "`lmcache server` has no --server-module flag"})
    reason = c.skip_reason("server_module")
    assert reason == ("needs capability server_module: `lmcache server` has no --server-module flag "
                      "(lmcache 0.5.0)")
    assert "\n" not in reason and c.skip_reason("server_cli") is None


@pytest.mark.parametrize("version, builds, expected", [
    ("0.5.6", "==0.5.6", True),
    ("0.5.6+local", "==0.5.6", True),
    ("0.5.6.dev7", "==0.5.6", False),
    ("0.5.6.dev7", ">=0.5.5,<0.5.7", True),
    ("0.5.5", "==0.5.6", False),
    ("0.5.7", ">=0.5.1,<=0.5.6", False),
    ("0.5.1", ">=0.5.1,<=0.5.6", True),
])
def test_known_issue_ranges_are_compared_with_packaging(version, builds, expected):
    assert known_issues.holds_on(builds, Version(version)) is expected


def test_any_lmcache_from_0_5_0_passes_preflight(monkeypatch):
    for have, ok in (("0.5.0", True), ("0.5.3", True), ("0.5.6.dev7", True), ("0.6.0+local", True),
                     ("0.4.9", False)):
        monkeypatch.setattr(preflight, "installed", lambda name, have=have: have if name == "lmcache" else "x")
        assert (preflight.problems(("lmcache",)) == []) is ok, have


def test_matrix_cells_are_one_line():
    failure = """AssertionError: 2 invariant violation(s):
  [hit_transferred] rank 0: hit 48 tokens = 3 blocks, but the retrieve wrote 2 blocks fully
  [bytes_moved] rank 0: the server reports 768 bytes
workload:
  server chunk=16 l1=0.25GB; engine TP1 lmcache_driven
  store 0: seed 0: 48 tokens (3 chunks); steps [0,48); all ranks
  lookup: seed 0: 48 tokens (3 chunks); reserve_last_token=False; settle=settled
"""
    line = matrix._one_line(failure, limit=1000)
    assert line.startswith("[hit_transferred] rank 0: hit 48 tokens")
    assert "store 0: seed 0: 48 tokens" in line and "\n" not in line
    assert matrix._one_line("HarnessError: rank 0 failed 'open'\nTraceback ...") == "HarnessError: rank 0 failed 'open'"


def test_every_fault_names_the_code_it_patches():
    """A fault without a capability entry would skip its self-checks as an "unknown capability"
    (seen in a clean-clone run for two new faults): every registered fault has one, and on the
    default build every one of them is present."""
    from fixtures import faults

    missing = sorted(f"fault:{n}" for n in faults.REGISTRY if f"fault:{n}" not in capabilities.PATHS)
    assert not missing, f"faults with no entry in fixtures.compat.capabilities.PATHS: {missing}"
    absent = {n: capabilities.get().why(f"fault:{n}") for n in faults.REGISTRY if not capabilities.has(f"fault:{n}")}
    assert not absent or preflight.installed("lmcache") != "0.5.6", absent


def _lmcache_touches() -> dict[tuple[str, str], set[str]]:
    """(module, symbol) -> files, for every `import lmcache...` / `from lmcache... import x` and
    every string constant that names an LMCache module (`"lmcache.a.b"`, `"lmcache.a.b:C.d"`)
    in the suite's own code."""
    import ast
    import re

    from fixtures import ROOT

    found: dict[tuple[str, str], set[str]] = {}
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        if any(part.startswith(".") for part in rel.parts):
            continue
        for n in ast.walk(ast.parse(f.read_text())):
            pairs: list[tuple[str, str]] = []
            if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "lmcache":
                pairs = [(n.module, a.name) for a in n.names]
            elif isinstance(n, ast.Import):
                pairs = [(a.name, "") for a in n.names if a.name.split(".")[0] == "lmcache"]
            elif (isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and re.fullmatch(r"lmcache(\.\w+)+(:[\w.]+)?", n.value)):
                mod, _, sym = n.value.partition(":")
                pairs = [(mod, sym)]
            for p in pairs:
                found.setdefault(p, set()).add(str(rel))
    return found


def test_the_internals_inventory_is_complete():
    """Every LMCache symbol the suite's code touches is in fixtures/compat/internals.py (or is a
    fault target in capabilities.PATHS), so a symbol a release moves is found in one place."""
    from fixtures.compat import internals

    touches = _lmcache_touches()
    assert len(touches) > 50  # the scan reads the suite (it found 80-odd when written)
    listed, keys = internals.listed(), internals.config_keys()
    unlisted = {f"{m}:{s}" if s else m: sorted(files) for (m, s), files in touches.items()
                if f"{m}.{s}".rstrip(".") not in keys and not internals.covers(m, s, listed)}
    assert not unlisted, f"LMCache internals touched but not in fixtures.compat.internals.INTERNALS: {unlisted}"


def test_the_inventory_scan_sees_an_unlisted_symbol():
    from fixtures.compat import internals

    listed = internals.listed()
    assert internals.covers("lmcache.v1.multiprocess.token_hasher", "TokenHasher", listed)
    assert internals.covers("lmcache.v1.distributed.l2_adapters", "fs_l2_adapter", listed)
    assert not internals.covers("lmcache.v1.multiprocess.token_hasher", "NoSuchHasher", listed)
    assert not internals.covers("lmcache.v1." + "no_such_module", "", listed)  # (a literal would be scanned)


def test_internals_probe_names_what_it_could_not_decide(monkeypatch):
    from fixtures.compat import capabilities, internals

    def boom(path):
        raise RuntimeError("undecidable")

    monkeypatch.setattr(capabilities, "resolve", boom)
    rows = [r for r in internals.probe() if r["kind"] == "symbol"]
    assert rows and all(not r["present"] and r["why"] == "probe raised RuntimeError: undecidable" for r in rows)
