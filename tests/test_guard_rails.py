"""Guard rails on the suite's own code: one home for its environment variables, and docs
generated from it that stay true. (Lint runs in .ci/run: `ruff check`.)"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

from fixtures import ROOT, settings

#: the suite's own sources (not the environments, models, repros or matrix builds)
SOURCES = [p for d in ("fixtures", "strategies", "tests", "ci") for p in (ROOT / d).rglob("*.py")]
SOURCES += [ROOT / "conftest.py"]
SHELL = [*(ROOT / "ci").glob("*.sh"), ROOT / ".ci" / "run"]
PREFIX = "LMCACHE_PBT_"


def _reads_environ(node: ast.AST) -> str | None:
    """The LMCACHE_PBT_* name `node` reads from the environment directly, if it does."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        f = ast.unparse(node.func)
        if f in ("os.environ.get", "os.getenv", "_os.environ.get", "environ.get", "getenv"):
            name = node.args[0].value
            return name if isinstance(name, str) and name.startswith(PREFIX) else None
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and ast.unparse(node.value).endswith("environ")
        and isinstance(node.slice, ast.Constant)
    ):
        name = node.slice.value
        return name if isinstance(name, str) and name.startswith(PREFIX) else None
    return None


def test_only_the_settings_module_reads_the_suites_environment_variables():
    direct = []
    for path in SOURCES:
        if path == ROOT / "fixtures" / "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _reads_environ(node)
            if name:
                direct.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {name}")
    assert not direct, "read these through fixtures.settings:\n" + "\n".join(direct)


def test_every_variable_named_anywhere_is_declared():
    declared = {v.name for v in settings.ALL}
    named = {}
    for path in [*SOURCES, *SHELL, ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for m in re.finditer(PREFIX + r"[A-Z0-9_]+", path.read_text()):
            named.setdefault(m.group(0).rstrip("_"), str(path.relative_to(ROOT)))
    unknown = {n: where for n, where in named.items() if n not in declared}
    assert not unknown, f"declare these in fixtures/settings.py: {unknown}"


def test_the_settings_page_is_generated_from_the_settings_module():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings.markdown(), "regenerate it: python -m fixtures.settings > docs/settings.md"


def test_the_measurements_page_is_generated_from_the_recorded_results():
    """docs/measurements.md is what ci/measurements.py renders from docs/results/*.json (its --check)."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "measurements.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, (r.stdout + r.stderr).strip()


def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv(settings.MAX_ENGINES.name, "two")
    try:
        settings.MAX_ENGINES.get()
    except SystemExit as e:
        assert str(e).startswith("LMCACHE_PBT_MAX_ENGINES='two': not a valid int")
    else:
        raise AssertionError("a bad value was accepted")


def test_every_tolerance_range_is_listed_with_its_builds():
    """The ranges in fixtures/compat/known_issues.py that oracles gate tolerances on are listed,
    with their builds, on docs/findings.md."""
    from fixtures.compat import known_issues as K

    page = (ROOT / "docs" / "findings.md").read_text()
    ranges = {n: getattr(K, n) for n in dir(K) if n.isupper() and n != "UP_TO" and isinstance(getattr(K, n), str)}
    missing = [f"{n} ({b})" for n, b in ranges.items() if f"| `{n}` | `{b}` |" not in page]
    assert ranges and not missing, (
        f"list these in docs/findings.md (Where an oracle tolerates a known issue): {missing}"
    )


def test_every_known_issue_signature_is_listed_with_its_builds():
    """Each signature that sets an own-path example aside (fixtures/oracle/signatures.py) is on
    docs/findings.md with its builds."""
    from fixtures.oracle.signatures import SIGNATURES

    page = (ROOT / "docs" / "findings.md").read_text()
    missing = [f"{s.name} ({s.builds})" for s in SIGNATURES if f"| `{s.name}` | `{s.builds}` |" not in page]
    assert not missing, f"list these in docs/findings.md (Signatures: ...): {missing}"


def test_a_skip_the_manifest_does_not_expect_fails_the_run():
    """Skip accounting catches each way a skip can hide a check: a new skip, a skip for another
    reason, and an expected skip that did not happen (only among the tests that ran)."""
    from fixtures.skips import compare

    expected = {"t::a": "needs CUDA", "t::b": "needs CUDA", "t::c": "refused"}
    assert (
        compare(expected, {"t::a": "needs CUDA", "t::b": "needs CUDA", "t::c": "refused"}, {"t::a", "t::b", "t::c"})
        == []
    )
    assert compare(expected, {"t::a": "needs CUDA"}, {"t::a"}) == []  # a selection: b and c did not run
    lines = compare(
        expected, {"t::a": "needs CUDA", "t::c": "another reason", "t::d": "new"}, {"t::a", "t::b", "t::c", "t::d"}
    )
    assert lines[0].startswith("skip manifest: FAILED")
    assert any("unexpected skip: t::d: new" in ln for ln in lines)
    assert any("t::c: another reason (expected reason: refused)" in ln for ln in lines)
    assert any("expected skip did not happen: t::b" in ln for ln in lines)


#: modules mypy does not check yet (pyproject.toml [[tool.mypy.overrides]] ignore_errors): this
#: list only shrinks
MYPY_NOT_YET = 12


def test_the_modules_mypy_skips_do_not_grow():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    skipped = [m for o in cfg["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors") for m in o["module"]]
    assert len(skipped) <= MYPY_NOT_YET, (
        f"{len(skipped)} modules are exempt from mypy (at most {MYPY_NOT_YET}): type-check a new module instead"
    )


def test_the_import_layers_hold():
    """The layers of docs/design.md (pyproject.toml [tool.importlinter]); .ci/run runs the same."""
    cli = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    r = subprocess.run(
        [sys.executable, "-c", cli, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
