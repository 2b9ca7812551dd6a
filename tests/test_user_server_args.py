"""Your own `lmcache server` flags (`--lmcache-server-args` / LMCACHE_PBT_SERVER_ARGS): every
server the suite starts gets them; the flags its oracles model (L1 size, eviction policy and
thresholds) become ServerOptions' defaults; the flags it owns are refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from fixtures import ROOT, settings
from fixtures.case.server import ServerArgsError, ServerOptions, parse_user_args
from fixtures.case.workload import PromptSpec, StoreSpec, Workload
from fixtures.properties import check_workload

FLAGS = "--eviction-policy ARC --l1-size-gb=0.3 --max-workers 2"


def test_your_flags_are_modelled_or_passed_through():
    fields, rest = parse_user_args(FLAGS)
    assert dict(fields) == {"eviction_policy": "ARC", "l1_size_gb": 0.3}
    assert rest == ("--max-workers", "2")
    assert parse_user_args("") == ((), ())


@pytest.mark.parametrize(
    "flags, says",
    [
        ("--chunk-size 784", "server flag --chunk-size: not yours to set here: each test draws it"),
        ("--port=5555", "server flag --port: not yours to set here: the suite allocates the ports"),
        ("--l1-size-gb forty", "server flag --l1-size-gb: 'forty' is not a float"),
        ("--eviction-policy", "server flag --eviction-policy: missing its value"),
        ("--l2-adapter '{", "No closing quotation"),
    ],
)
def test_a_flag_the_suite_cannot_take_is_one_line(flags, says):
    with pytest.raises(ServerArgsError) as e:
        parse_user_args(flags)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_servers_the_suite_starts_get_your_flags(harness, monkeypatch):
    """A server started under your flags runs with them (its command line), and a property's
    workload on it holds (hit == the stored chunks, bit for bit)."""
    monkeypatch.setenv(settings.SERVER_ARGS.name, FLAGS)
    opts = ServerOptions(tag="user-flags")
    assert (opts.eviction_policy, opts.l1_size_gb, opts.extra_args) == ("ARC", 0.3, ("--max-workers", "2"))
    try:
        srv = harness.server(opts)
        argv = psutil.Process(srv.pid).cmdline()
        tail = argv[argv.index("--eviction-policy") :]
        assert tail[:2] == ["--eviction-policy", "ARC"] and "0.3" in argv, argv
        assert argv[argv.index("--max-workers") + 1] == "2", argv
        w = Workload(
            server=opts,
            tp=1,
            mode="lmcache_driven",
            layout=_layout(),
            stores=(StoreSpec(PromptSpec(0, 50)),),
            query=PromptSpec(0, 50),
        )
        obs = check_workload(harness, w, ("hit_accounting", "bit_identity"))
        assert obs.hit == 48
    finally:
        harness.release(opts)


def _layout():
    from fixtures.case.layout import KVLayout

    return KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4, block_size=16)


def _nested(tmp_path, flags: str, *selection: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "LMCACHE_PBT_SERVER_ARGS"))}
    env[settings.REPRO_DIR.name] = str(tmp_path)  # its repros and skip record are not the run's
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
    argv += ["--hypothesis-profile=smoke", f"--lmcache-server-args={flags}", *selection]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_suite_runs_nested_with_your_flags(tmp_path):
    test = "tests/test_hits.py::test_prompt_never_stored_hits_zero"
    run = _nested(tmp_path, FLAGS, test, "-k", "cpu and lmcache_driven")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert f"your server flags: {FLAGS}" in out, out[:2000]
    assert "1 passed" in out, out[-2000:]


def test_a_refused_flag_stops_the_run_in_one_line(tmp_path):
    run = _nested(tmp_path, "--chunk-size 784", "tests/test_hits.py::test_prompt_never_stored_hits_zero")
    out = (run.stdout + run.stderr).strip()
    assert run.returncode == 4, out[-2000:]
    assert "lmcache-pbt: server flag --chunk-size: not yours to set here" in out, out[-2000:]
