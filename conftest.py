"""pytest set-up for the suite: profiles, options, per-worker servers, one-line errors, repros.

Profiles (Hypothesis): `dev` (default locally), `ci` (default when CI is set:
derandomized, bounded), `nightly` (thorough), `smoke` (2-example budget unit, for
ci/gpu-smoke.sh on briefly lent machines). Pick one with
`--hypothesis-profile NAME` or `LMCACHE_PBT_PROFILE=NAME`.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from fixtures import settings as pbt
from fixtures.drivers import procs  # noqa: F401  (telemetry off in this process and its children)

# ---------------------------------------------------------------------------
# Hypothesis profiles. `max_examples` is the budget unit: tests scale it with
# tests.budget(weight), so a profile change moves every property together.
# ---------------------------------------------------------------------------

_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", max_examples=10, **_COMMON)
# LMCACHE_PBT_DB=DIR keeps failing examples in DIR under any profile (the GPU job keeps it as an artifact)
_DB = DirectoryBasedExampleDatabase(pbt.DB.get()) if pbt.DB.is_set() else None
settings.register_profile("ci", max_examples=10, derandomize=True, database=_DB, **_COMMON)
settings.register_profile("smoke", max_examples=2, derandomize=True, database=_DB, **_COMMON)
settings.register_profile("nightly", max_examples=200, **_COMMON)
settings.register_profile(
    "selfcheck",
    max_examples=200,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    report_multiple_bugs=False,
    **_COMMON,
)
DEFAULT_PROFILE = pbt.PROFILE.get("ci" if os.environ.get("CI") else "dev")
settings.load_profile(DEFAULT_PROFILE)


def pytest_addoption(parser):
    g = parser.getgroup("lmcache-pbt")
    g.addoption(
        "--lmcache-url",
        default=pbt.URL.get(),
        help="run against an already running server (ZMQ URL, e.g. tcp://127.0.0.1:5555); "
        "tests that need restarts, faults or other server options skip",
    )
    g.addoption(
        "--lmcache-http",
        default=pbt.HTTP.get(),
        help="that server's HTTP URL (e.g. http://127.0.0.1:8080), for /metrics and /status",
    )
    g.addoption(
        "--lmcache-tap",
        default=pbt.TAP.get(),
        help="events file of fixtures.observation.server_tap loaded by that server (server-side byte figures)",
    )
    g.addoption(
        "--lmcache-server-args",
        default=pbt.SERVER_ARGS.get(),
        help="your own `lmcache server` flags (one quoted string), added to every server the suite starts; "
        "the suite's ports, tap, chunk size and object-group layout stay its own (docs/running.md)",
    )
    g.addoption(
        "--gpu-share",
        action="store_true",
        default=False,
        help="let TP ranks share one GPU when fewer GPUs than ranks exist (tp4 on one GPU)",
    )
    g.addoption(
        "--update-skip-manifest",
        action="store_true",
        default=False,
        help="write this run's skips as the expected ones (ci/expected-skips.json; fixtures/skips.py)",
    )


def pytest_configure(config):
    from fixtures.compat import preflight
    from fixtures.errors import SuiteError

    if not hasattr(config, "workerinput"):
        # the controller (or a run without xdist): one run dir every temp dir of the run lives
        # under, removed at the session's end even where a worker is killed before its own exit
        config._lmcache_pbt_run_dir = procs.make_run_dir()
    # SIGTERM (a cancelled CI job, `kill PID`) cleans up as Ctrl-C does; the controller passes it on
    procs.sigterm_like_ctrl_c(forward_to_workers=not hasattr(config, "workerinput"))
    # every skip listed by reason and compared with ci/expected-skips.json (fixtures/skips.py)
    from fixtures import skips

    skips.register(config)
    # `kill -USR1 PID` prints where every thread of a pytest process stands (a stuck run's post-mortem)
    procs.dump_stacks_on_sigusr1()
    # LMCache's connector (scheduler side, in this process) makes its sockets on Context.instance()
    procs.bound_zmq_linger()

    try:
        preflight.check_core()
    except SuiteError as e:
        pytest.exit(f"lmcache-pbt: {e}", returncode=4)
    # the user's server flags: every server of the run (and xdist's workers) gets them
    server_args = config.getoption("--lmcache-server-args")
    if server_args:
        from fixtures.case.server import parse_user_args

        os.environ[pbt.SERVER_ARGS.name] = server_args
        try:
            parse_user_args(server_args)
        except SuiteError as e:
            pytest.exit(f"lmcache-pbt: {e}", returncode=4)
    # Probe the build once, here in the controller before xdist starts its workers
    # (they then read the cached result; fixtures.compat.capabilities).
    from fixtures.compat import capabilities

    try:
        capabilities.get()
    except Exception as e:  # noqa: BLE001
        pytest.exit(f"lmcache-pbt: {e}", returncode=4)
    url, http = config.getoption("--lmcache-url"), config.getoption("--lmcache-http")
    if (url is None) != (http is None):
        raise pytest.UsageError("--lmcache-url and --lmcache-http go together")
    if url:
        # Narrow generated chunk sizes to the one the external server runs with.
        import json
        import urllib.request

        import strategies.workloads as sw

        try:
            with urllib.request.urlopen(http.rstrip("/") + "/config", timeout=10) as r:
                chunk = json.loads(r.read().decode())["mp"]["chunk_size"]
        except Exception as e:  # noqa: BLE001
            pytest.exit(f"lmcache-pbt: no LMCache server answers at {http}/config ({e})", returncode=4)
        sw.CHUNK_SIZES = (int(chunk),)
        os.environ[pbt.CHUNK_SIZES.name] = str(chunk)


def pytest_unconfigure(config):
    run_dir = getattr(config, "_lmcache_pbt_run_dir", None)
    if run_dir and not pbt.KEEP_SERVER_DIRS.get():
        from fixtures.drivers import procs

        procs.remove_run_dir(run_dir)


def pytest_report_header(config):
    prof = config.getoption("hypothesis_profile", default=None) or DEFAULT_PROFILE
    where = config.getoption("--lmcache-url") or "a fresh `lmcache server` per option set, per xdist worker"
    from fixtures.compat import capabilities

    try:
        build = capabilities.get().header()
    except Exception as e:  # noqa: BLE001 -- the header must not be what fails the run
        build = f"capability probe failed: {e}"
    flags = config.getoption("--lmcache-server-args")
    mine = f"; your server flags: {flags}" if flags and not config.getoption("--lmcache-url") else ""
    return [f"lmcache-pbt: {build}", f"lmcache-pbt: hypothesis profile {prof}; server: {where}{mine}"]


# ---------------------------------------------------------------------------
# Reports: one line for environment errors; repro files for property failures
# ---------------------------------------------------------------------------

_BLOB = re.compile(r"@reproduce_failure\(([^)]*)\)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    from fixtures import repro
    from fixtures.drivers import pool

    repro.set_current_test(item.nodeid)
    pool.begin_test()
    item._lmcache_pbt_counts = {key: dict(counter) for key, counter in _per_test_counters()}


def _per_test_counters():
    """(report key, process-wide Counter) pairs whose per-test increments each report carries to
    the controller, which adds them up over the workers (fixtures/skips.py): examples set aside
    by a known issue's signature, and examples per server configuration."""
    from fixtures.case import server_configs
    from fixtures.oracle import signatures

    return (("known_signatures", signatures.MATCHED), ("server_configs", server_configs.DRAWN))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    from fixtures import repro
    from fixtures.errors import SuiteError

    if report.when == "call":
        for key, counter in _per_test_counters():
            before = getattr(item, "_lmcache_pbt_counts", {}).get(key, {})
            added = {n: c - before.get(n, 0) for n, c in counter.items() if c > before.get(n, 0)}
            if added:
                report.user_properties.append((key, added))
    exc = call.excinfo.value if call.excinfo is not None else None
    if isinstance(exc, SuiteError) and report.failed:
        # An environment problem, not a property verdict: say it in one line.
        report.longrepr = f"{type(exc).__name__}: {exc}"
        return
    if report.when == "call" and report.failed:
        payload = repro.take(item.nodeid)
        if payload is not None:
            text = report.longreprtext or ""
            m = _BLOB.search(text)
            prof = item.config.getoption("hypothesis_profile", default=None) or DEFAULT_PROFILE
            path = repro.write(
                payload,
                blob=m.group(1) if m else None,
                profile=prof,
                seed=item.config.getoption("hypothesis_seed", default=None),
            )
            rel = os.path.relpath(path)
            report.sections.append(
                (
                    "lmcache-pbt repro",
                    f"repro written: {rel}\nreplay: python -m fixtures.replay {rel}"
                    " [--lmcache-url tcp://HOST:PORT --lmcache-http http://HOST:PORT]",
                )
            )
    elif report.when == "call":
        repro.take(item.nodeid)


def pytest_generate_tests(metafunc):
    """Every test that takes `kv_device` runs once per device (fixtures.drivers.devices): `cpu`
    everywhere, `cuda` (marker gpu) and `cuda-tp4` (marker tp4) where GPUs exist; the
    property bodies are the same."""
    if "kv_device" not in metafunc.fixturenames:
        return
    from fixtures.drivers.devices import KV_DEVICES

    share = metafunc.config.getoption("--gpu-share")
    marks = {1: [pytest.mark.gpu], 4: [pytest.mark.gpu, pytest.mark.tp4]}
    metafunc.parametrize(
        "kv_device",
        [pytest.param(d.name, marks=marks.get(d.need_gpus, ()), id=d.test_id(share)) for d in KV_DEVICES.values()],
    )


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip with one reason line when CUDA is absent (never pass silently)."""
    from fixtures.drivers.devices import gpu_skip_reason

    for item in items:
        need = 4 if item.get_closest_marker("tp4") else (1 if item.get_closest_marker("gpu") else 0)
        if need:
            reason = gpu_skip_reason(need, share=config.getoption("--gpu-share"))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
