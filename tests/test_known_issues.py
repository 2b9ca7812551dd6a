"""LMCache 0.5.6 behaviour the properties found, pinned as minimal regression cases.

Each is `xfail(strict=True)` on the builds it is known to hold for (KNOWN_ON,
fixtures.compat.known_issues): it fails there for the stated reason, and the suite turns
red the day LMCache changes that behaviour, so the pin and the tolerance in
fixtures/oracle/invariants.py can be removed. On any other build it runs as an ordinary
property (pass or fail).
"""

import time

import pytest

from fixtures.case.connector import ConnectorCase
from fixtures.case.layout import KVLayout
from fixtures.case.server import ServerOptions
from fixtures.case.workload import PromptSpec, StoreSpec, Workload
from fixtures.compat import capabilities as caps
from fixtures.compat import refusals
from fixtures.compat.known_issues import (
    ABORT_BEFORE_LOOKUP_LOCK_LEAK,
    L1_READ_OVERCOUNT,
    NULL_BLOCK_WRITE,
    UP_TO,
    installed_lmcache,
    known_issue,
)
from fixtures.drivers.rank_group import RankGroup
from fixtures.drivers.polling import poll_until
from fixtures.drivers.vllm_model import resolved_block_size
from fixtures.errors import HarnessError
from fixtures.oracle import invariants, verdicts

#: the LMCache builds these findings are known to hold on (a PEP 440 specifier;
#: measured with ci/matrix.sh and fixtures.compat.bisect, docs/running.md "Version matrix";
#: the runs: docs/measurements.md; every finding: docs/findings.md). Findings
#: not yet measured on other builds stay at the build they were found on.
#: Every finding in this file fails on 0.5.7rc2 as an ordinary property with the same exception
#: type and assertion message, so each range ends there (UP_TO, fixtures.compat.known_issues).
KNOWN_ON = f">=0.5.6,{UP_TO}"
#: the same assertion fails on every build the matrix ran (0.5.0 on) as on 0.5.6
SINCE_0_5_0 = f">=0.5.0,{UP_TO}"
#: bisect: passes on 0.5.0, 0.5.1, 0.5.2; fails on 0.5.3 and 0.5.6 (first failing build 0.5.3)
SINCE_0_5_3 = L1_READ_OVERCOUNT
#: the matrix: the same assertion and message on 0.5.1-0.5.5 as on 0.5.6 (0.5.0 has no
#: --separate-object-groups: skipped there)
SINCE_0_5_1 = f">=0.5.1,{UP_TO}"
#: the matrix: the same assertion and message on 0.5.5 as on 0.5.6
#: (abort before the lookup is consumed: 0.5.0 shows the leak as a [locks] violation, 0.5.1-0.5.4
#: answer the lookup in its own step, so the situation cannot be made there)
SINCE_0_5_5 = f">=0.5.5,{UP_TO}"

TINY = KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4)


class Finding(AssertionError):
    """A pinned finding, seen. Each pin raises its own subclass (or its invariant's violation
    type), never a bare AssertionError, so a set-up failure or another bug cannot count as the
    finding: set-up conditions raise HarnessError (`_setup`), which fails a strict xfail."""


class L1ReadOvercount(Finding):
    pass


class NeverAnswered(Finding):
    """The server never answered a request."""


class RestartNotRecovered(Finding):
    pass


class StoreDropped(Finding):
    pass


class NullBlockWritten(Finding):
    pass


class RegistrationRefused(Finding):
    pass


class SchedulerCrashed(Finding):
    """vLLM's scheduler raised (an assert inside vLLM, after what LMCache reported)."""


class LocksLeaked(Finding):
    pass


class BuiltinConnectorBroken(Finding):
    pass


class ConnectorBrokenUnderThisScheduler(Finding):
    """LMCacheMPConnector reads a field of vLLM's scheduler output that this vLLM does not have."""


def _setup(ok: bool, what: str) -> None:
    """A precondition of the pinned case: its failure is an error of the case, not the finding."""
    if not ok:
        raise HarnessError(f"set-up: {what}")


def _seen(finding: type[Finding], ok: bool, message: str) -> None:
    if not ok:
        raise finding(message)


def _refusable(run, *a, **kw):
    """A finding about a layout: on a build that refuses the layout at registration, it cannot be
    seen there (one line; fixtures/compat/refusals.py)."""
    try:
        return run(*a, **kw)
    except (HarnessError, ValueError) as e:
        refusals.skip_if_refused(e)
        raise


@known_issue(
    SINCE_0_5_3,
    raises=L1ReadOvercount,
    reason="LMCache 0.5.3-0.5.6 book read locks a lookup releases unused (another TP rank "
    "lacks the chunk) as L1 reads: lmcache_mp_l1_read_chunks_total rises with "
    "nothing transferred",
)
def test_l1_read_counter_counts_only_chunks_transferred(harness):
    w = Workload(
        ServerOptions(chunk_size=16),
        2,
        "lmcache_driven",
        TINY,
        (StoreSpec(PromptSpec(0, 16), ranks=(0,)),),
        PromptSpec(0, 16),
    )
    obs = harness.run(w)
    _setup(obs.hit == 0, f"rank 1 never stored, yet the lookup hit {obs.hit}")
    _seen(
        L1ReadOvercount,
        obs.delta("lmcache_mp_l1_read_chunks_total") == 0,
        f"l1_read_chunks_total rose by {obs.delta('lmcache_mp_l1_read_chunks_total'):g} with nothing retrieved; "
        f"{invariants.KNOWN_L1_READ_OVERCOUNT}",
    )


@known_issue(
    SINCE_0_5_5,
    raises=NeverAnswered,
    reason="LMCache 0.5.6: a RETRIEVE whose end exceeds the request's tokens raises "
    "ValueError (session.get_hashes) inside the blocking handler and the server "
    "never replies; the worker adapter waits forever (retrieve futures have no "
    "timeout)",
)
def test_retrieve_past_the_prompt_is_answered(harness):
    srv = harness.server(ServerOptions(chunk_size=16))
    eng = RankGroup(
        harness.ranks, srv, tp=1, mode="lmcache_driven", layout=TINY, model_name="pbt-known-retrieve-past-end"
    )
    try:
        toks = PromptSpec(7, 16).tokens()
        src = eng.alloc(1)
        eng.prefill(toks, src)
        mark = srv.events.mark() if srv.events is not None else 0
        (rep,) = eng.store("known-s", toks, [(0, 16, src)], "known")
        _setup(rep[0].ok, "the 16-token store failed")
        if srv.events is not None:
            # the chunk is committed to L1 (a build may report the store done first: 0.5.2, 0.5.3)
            srv.events.wait_for(
                mark,
                lambda es: any(e.type == "L1_WRITE_FINISHED" and e.md.get("keys_by_salt", {}).get("known") for e in es),
                timeout=10,
            )
        hit = eng.lookup("known-q", toks, "known")
        if hit != 16:
            raise HarnessError(f"set-up: the lookup right after a committed 16-token store hit {hit}")
        dst = eng.alloc(2)
        (r,) = eng.retrieve("known-q", toks, dst, 0, 32, "known", timeout=5.0)
        _seen(
            NeverAnswered, r.finished, "the server never answered a RETRIEVE with end=32 for a 16-token request (5 s)"
        )
    finally:
        eng.close()


@known_issue(
    SINCE_0_5_0,
    raises=RestartNotRecovered,
    reason="LMCache 0.5.6: a worker adapter starts its heartbeat "
    "lazily on its first store/retrieve; one that has only "
    "registered never notices a server restart, is never "
    "re-registered, and every later store fails",
)
def test_a_restart_before_the_first_store_is_recovered(harness):
    srv = harness.server(ServerOptions(chunk_size=16, l2_fs=True, tag="known-restart"))
    eng = RankGroup(
        harness.ranks,
        srv,
        tp=1,
        mode="lmcache_driven",
        layout=TINY,
        model_name="pbt-known-restart",
        heartbeat_interval=1.0,
    )
    try:
        toks = PromptSpec(8, 16).tokens()
        src = eng.alloc(1)
        eng.prefill(toks, src)
        srv.restart()
        ok = []
        for i in range(3):  # give the adapter three heartbeat intervals to recover
            (rep,) = eng.store(f"known-r{i}", toks, [(0, 16, src)], f"known-r{i}")
            ok.append(rep[0].ok)
            time.sleep(1.5)
        _seen(RestartNotRecovered, ok[-1], f"stores after the restart: {ok} (never recovered)")
    finally:
        eng.close()
        harness.release(ServerOptions(chunk_size=16, l2_fs=True, tag="known-restart"))


@known_issue(
    SINCE_0_5_0,
    raises=StoreDropped,
    reason="LMCache 0.5.6: a store that does not fit whole into "
    "L1 is dropped (reported successful) and does not "
    "trigger eviction; with L1 just under its watermark, "
    "every store bigger than the free space is dropped",
)
def test_a_store_that_does_not_fit_makes_room(harness):
    opts = ServerOptions(chunk_size=16, l1_size_gb=0.03125, tag="known-full")
    srv = harness.server(opts)
    lay = KVLayout(num_layers=4, kv_heads_per_rank=8, head_dim=64)  # 8 KiB per token
    eng = RankGroup(
        harness.ranks, srv, tp=1, mode="lmcache_driven", layout=lay, model_name="pbt-known-full", num_blocks=256
    )
    try:
        n = 1632  # 40% of the 32 MiB L1: two fill it to 79.7%, just under the 0.8 watermark
        written = []
        for i in range(3):
            eng.reset_blocks()
            toks = PromptSpec(100 + i, n).tokens()
            blocks = eng.alloc(n // 16)
            eng.prefill(toks, blocks)
            m0 = srv.metrics()
            (rep,) = eng.store(f"known-f{i}", toks, [(0, n, blocks)], "known-full")
            _setup(rep[0].ok, f"store {i} failed")
            time.sleep(2.5)  # two ticks of the eviction loop
            written.append(srv.metrics().delta(m0, "lmcache_mp_l1_write_chunks_total"))
        _seen(
            StoreDropped,
            written[2] > 0,
            f"chunks written per store: {written} (the third store was dropped, nothing evicted)",
        )
    finally:
        eng.close()
        harness.release(opts)


# ---------------------------------------------------------------------------
# The connector (fixtures.drivers.connector): vLLM's own configs and scheduler
# ---------------------------------------------------------------------------


def _connector():
    pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
    caps.require("connector:lmcache")
    from fixtures.case.model import ModelShape
    from fixtures.drivers import connector

    return connector, ModelShape


def _tiny_gdn(ModelShape, **kw):
    """The smallest hybrid model (fixtures.case.model.TINY_GDN), with `kw` changed."""
    import dataclasses

    from fixtures.case.model import TINY_GDN

    return dataclasses.replace(TINY_GDN, **kw)


@pytest.mark.connector
@known_issue(
    SINCE_0_5_1,
    raises=NeverAnswered,
    reason="LMCache 0.5.6: a register_kv_cache the server rejects "
    "(here: a sliding window shorter than the chunk and not "
    "a multiple of the block) raises inside the blocking "
    "handler; the server logs it and never replies, and the "
    "connector reports 'did not respond ... Is the server "
    "running?' after mq_timeout",
)
def test_a_rejected_registration_is_answered_with_its_reason(harness):
    connector, ModelShape = _connector()
    from fixtures.errors import HarnessError

    shape = ModelShape(
        "gemma3_text", 2, ("sliding", "full"), num_kv_heads=1, head_dim=16, block_size=32, sliding_window=16
    )
    opts = ServerOptions(chunk_size=96, separate_object_groups=True, tag="known-reject")
    srv = harness.server(opts)
    eng = None
    try:
        eng = connector.ConnectorEngine(
            harness,
            srv,
            shape,
            tp=1,
            num_blocks=4 * 64 + 16,
            max_num_batched_tokens=256,
            max_model_len=2048,
            extra=(("lmcache.mp.mq_timeout", 5.0),),
        )
    except HarnessError as e:
        _seen(
            NeverAnswered,
            "did not respond" not in str(e),
            (
                "the server rejected the registration (its log: 'sub-chunk sliding "
                "window size 16 must be a multiple of tokens_per_block 32') but "
                "never answered; the connector timed out after 5 s"
            ),
        )
    finally:
        if eng is not None:
            eng.close()
        harness.release(opts)


NULL_BLOCK_CASES = {
    # id: (layer kinds, window, separate object groups, LMCache chunk = this x block, tokens a step)
    "sliding-shared-groups": (("sliding", "full"), 32, False, 1, 32),
    "sliding-window-not-below-chunk": (("sliding", "full"), 100, True, 3, 96),
    "gdn-shared-groups": (("gdn", "full"), 32, False, 1, 256),
}


@pytest.mark.connector
@pytest.mark.parametrize("case_id", list(NULL_BLOCK_CASES))
@known_issue(
    NULL_BLOCK_WRITE,
    raises=NullBlockWritten,
    reason="LMCache 0.5.6 retrieves chunks of a group vLLM does not "
    "hold for the request into vLLM's null block 0 (block id "
    "0 in the block table): sliding-window out-of-window "
    "chunks without --separate-object-groups or with a window "
    "not shorter than a chunk; GDN non-checkpoint chunks "
    "without --separate-object-groups",
)
def test_chunks_a_group_does_not_hold_skip_the_null_block(harness, case_id):
    connector, ModelShape = _connector()
    from fixtures.oracle import connector_invariants

    kinds, window, separate, mult, step = NULL_BLOCK_CASES[case_id]
    family = "gemma3_text" if "sliding" in kinds else "qwen3_next"
    shape = ModelShape(
        family,
        2,
        kinds,
        num_kv_heads=1,
        head_dim=16,
        block_size=16,
        sliding_window=window,
        linear_key_heads=1,
        linear_value_heads=2,
        linear_head_dim=16,
        mamba_cache_mode="align",
    )
    bs = resolved_block_size(shape)
    n = 7 * bs * mult
    case = ConnectorCase(
        shape,
        chunk_multiple=mult,
        tp=1,
        separate_object_groups=separate,
        first=PromptSpec(3, n),
        second=PromptSpec(3, n),
        max_num_batched_tokens=step,
    )
    obs = _refusable(connector.run_case, harness, case)
    _setup(bool(obs.retrieve_ops), "request 2 was not served from LMCache")
    others = [v for v in connector_invariants.check(obs) if "null block" not in str(v)]
    if others:  # everything else must hold: another violation is another bug, not this finding
        raise verdicts.violation_type(others[0].invariant)(connector_invariants.report(obs, others))
    written = sorted({g.kind for c in obs.checks for g in c.groups if 0 in g.changed_elems})
    _seen(NullBlockWritten, not written, f"the load wrote into vLLM's null block 0 for groups of kind {written}")


@pytest.mark.connector
@known_issue(
    KNOWN_ON,
    raises=verdicts.RestoredBitIdenticalViolation,
    reason="LMCache 0.5.6 (GDN + attention, mamba_cache_mode=align, "
    "--separate-object-groups): when vLLM's prefill steps do "
    "not end on LMCache chunk boundaries, the lookup hits up "
    "to a chunk for which no recurrent state was stored; the "
    "retrieve restores the attention KV but no GDN state, and "
    "vLLM resumes from a state block nothing wrote (the bug "
    "report's wrong context)",
)
def test_a_gdn_hit_restores_the_state_vllm_resumes_from(harness):
    connector, ModelShape = _connector()
    from fixtures.oracle import connector_invariants

    shape = _tiny_gdn(ModelShape)
    # chunk 4 x 48 = 192 tokens, 20 chunks, 512-token prefill steps (not a multiple of 192)
    case = ConnectorCase(
        shape,
        chunk_multiple=4,
        tp=1,
        separate_object_groups=True,
        first=PromptSpec(9, 3840),
        second=PromptSpec(9, 3840),
        max_num_batched_tokens=512,
    )
    obs = _refusable(connector.run_case, harness, case)
    found = connector_invariants.check(obs, ("restored_bit_identical",))
    if found:
        verdicts.fail(found, connector_invariants.report(obs, found))


@pytest.mark.connector
@known_issue(
    KNOWN_ON,
    raises=verdicts.RestoredBitIdenticalViolation,
    reason="LMCache 0.5.6's CPU SHM migration (register_kv_caches "
    "on CPU) moves the KV storage into shared memory and "
    "re-points only the tensors it is handed; vLLM's Mamba "
    "state views into the same storage keep the old memory, "
    "so a restored GDN state is invisible to the engine",
)
def test_cpu_shm_migration_repoints_every_view(harness):
    connector, ModelShape = _connector()
    from fixtures.oracle import connector_invariants

    shape = _tiny_gdn(ModelShape)
    case = ConnectorCase(shape, tp=1, separate_object_groups=True, first=PromptSpec(4, 200), second=PromptSpec(4, 200))
    opts = connector.case_server(case)
    srv = harness.server(opts)
    nb, mml = connector.case_geometry(case)
    eng = _refusable(
        connector.ConnectorEngine,
        harness,
        srv,
        shape,
        tp=1,
        num_blocks=nb,
        max_num_batched_tokens=2048,
        max_model_len=mml,
        repoint_views=False,
    )
    try:
        obs = connector.run_case(harness, case, engine=eng)
        found = connector_invariants.check(obs, ("restored_bit_identical",))
        _setup(bool(obs.retrieve_ops), "request 2 was not served from LMCache")
        if found:
            verdicts.fail(found, connector_invariants.report(obs, found))
    finally:
        eng.close()


@pytest.mark.connector
@known_issue(
    KNOWN_ON,
    raises=RegistrationRefused,
    reason="LMCache 0.5.6's CPU SHM transfer path needs every KV "
    "view contiguous: a hybrid GDN model with more than one "
    "KV head per rank fails registration with ValueError",
)
def test_hybrid_gdn_with_two_kv_heads_per_rank_registers(harness):
    connector, ModelShape = _connector()
    from fixtures.errors import HarnessError

    shape = _tiny_gdn(ModelShape, num_kv_heads=2)
    case = ConnectorCase(shape, tp=1, separate_object_groups=True, first=PromptSpec(4, 64), second=PromptSpec(4, 64))
    try:
        connector.run_case(harness, case)
    except (HarnessError, ValueError) as e:
        # a build that refuses every GDN model, whatever its KV heads, cannot show whether this
        # layout registers: 0.5.0-0.5.3 refuse the scheduler config (one block a prefill step),
        # 0.5.3-0.5.4 the caches without vLLM's layout hint
        refusals.skip_if_refused(e, only=("mamba_one_block_steps", "kv_layout_unknown"))
        if isinstance(e, ValueError):
            raise
        _seen(RegistrationRefused, "ValueError" not in str(e), f"registration failed: {str(e).splitlines()[0][:300]}")
        raise


@pytest.mark.connector
def test_mamba_cache_mode_all_fails_loudly_at_configuration():
    """mamba_cache_mode: 'align' and 'none' are in the generated mix (strategies/hybrid.py) and
    served; vLLM 0.33's CacheConfig rejects 'all' for the GDN models here, before any KV moves."""
    connector, ModelShape = _connector()
    from fixtures.drivers import vllm_model

    shape = _tiny_gdn(ModelShape, mamba_cache_mode="all")
    with pytest.raises(ValueError, match="mamba_cache_mode"):
        vllm_model.vllm_config(shape, "tcp://127.0.0.1:1")


@pytest.mark.connector
@known_issue(
    KNOWN_ON,
    raises=verdicts.RestoredBitIdenticalViolation,
    reason="LMCache 0.5.6: LMCacheMPConnector.wait_for_save only "
    "submits the step's stores (its docstring says it blocks "
    "until they are done); vLLM frees a sliding-window "
    "group's out-of-window blocks mid-prefill and reuses them "
    "while the server still copies them, so the stored chunk "
    "holds later tokens' KV and a later full hit restores it",
)
def test_a_store_copies_blocks_before_vllm_reuses_them(harness):
    connector, ModelShape = _connector()
    from fixtures.oracle import connector_invariants

    shape = ModelShape(
        "gemma3_text", 2, ("sliding", "full"), num_kv_heads=4, head_dim=16, block_size=32, sliding_window=32
    )
    # Chunked prefill (256 tokens a step) moves the window past tokens [64, 96) while their
    # store is in flight; request 2 diverges at token 127, so vLLM resumes at 96 relying on
    # exactly that sliding-window block. (Found by test_connector.py's generated cases.)
    # The server reads each store 300 ms late (fault slow_store, a busy server), so the
    # reuse lands before the read on every run instead of on a loaded runner only.
    case = ConnectorCase(
        shape,
        tp=4,
        separate_object_groups=True,
        first=PromptSpec(2, 785),
        second=PromptSpec(2, 785, (127,)),
        max_num_batched_tokens=256,
        faults=("slow_store:300",),
    )
    srv = harness.server(connector.case_server(case))
    nb, mml = connector.case_geometry(case)
    eng = _refusable(
        connector.ConnectorEngine,
        harness,
        srv,
        shape,
        tp=4,
        num_blocks=nb,
        max_num_batched_tokens=256,
        max_model_len=mml,
        wait_for_stores=False,
    )
    try:
        obs = connector.run_case(harness, case, engine=eng)
        _setup(bool(obs.retrieve_ops), "request 2 was not served from LMCache")
        bad = connector_invariants.check(obs, ("restored_bit_identical",))
        if bad:
            verdicts.fail(bad, connector_invariants.report(obs, bad))
    finally:
        eng.close()
        harness.release(connector.case_server(case))


@pytest.mark.connector
@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
@known_issue(
    KNOWN_ON,
    raises=SchedulerCrashed,
    reason="LMCache 0.5.6 + vLLM 0.33: after a failed LMCache load "
    "(kv_load_failure_policy=fail) vLLM finishes the request "
    "with an error; request_finished returns True (blocks "
    "freed later), the worker still reports the request in "
    "finished_recving, which frees and deletes it, and then "
    "echoes it in finished_sending: vLLM's scheduler asserts "
    "(_update_from_kv_xfer_finished) and its engine core dies",
)
def test_a_failed_load_does_not_crash_vllms_scheduler(harness, family):
    """The retrieve fails inside LMCache (fault retrieve_loses_last_chunk: an object gone
    between lookup and retrieve). vLLM must fail or recompute request 2, not crash."""
    import traceback

    connector, ModelShape = _connector()
    shape = ModelShape("llama", 1, ("full",)) if family == "llama" else _tiny_gdn(ModelShape)
    bs = resolved_block_size(shape)
    case = ConnectorCase(
        shape,
        tp=1,
        separate_object_groups=True,
        first=PromptSpec(0, 3 * bs),
        second=PromptSpec(0, 3 * bs),
        max_num_batched_tokens=bs if family != "llama" else 2048,
        faults=("retrieve_loses_last_chunk",),
    )
    opts = connector.case_server(case)
    crashed = None
    try:
        _refusable(connector.run_case, harness, case)
    except AssertionError as e:  # raised inside vLLM's scheduler, not by this test
        frame = traceback.extract_tb(e.__traceback__)[-1]
        crashed = f"{frame.name} ({frame.filename.split('site-packages/')[-1]}:{frame.lineno}): {frame.line}"
    finally:
        harness.release(opts)  # the engine's scheduler is left mid-update: drop it with its server
    _seen(
        SchedulerCrashed, crashed is None, f"vLLM's scheduler crashed after LMCache reported a failed load: {crashed}"
    )


@pytest.mark.connector
@known_issue(
    ABORT_BEFORE_LOOKUP_LOCK_LEAK,
    raises=LocksLeaked,
    reason="LMCache 0.5.6: a request aborted before vLLM consumed its "
    "lookup keeps the server's prefetch result and its read "
    "locks until the read-lock TTL (300 s): request_finished "
    "only drops the scheduler-side lookup future",
)
def test_an_abort_before_the_lookup_is_consumed_releases_its_locks(harness):
    """Found by the busy-engine machine (tests/test_busy_connector.py): add; step; abort; drain."""
    pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
    caps.require("connector:lmcache")
    from fixtures.case.model import ModelShape
    from fixtures.machines.busy_connector import (
        BusyConfig,
        _lock_counts,
        machine_for,
        run_program,
    )

    cfg = BusyConfig(
        ModelShape("llama", 1, ("full",), num_kv_heads=1, head_dim=16, block_size=16, mamba_cache_mode="none"),
        tps=(1,),
        chunk_multiple=2,
        l2=False,
    )
    c = cfg.chunk
    p = PromptSpec(3, 3 * c)
    try:
        m = _refusable(
            run_program,
            machine_for(harness, cfg),
            [
                ("start", {"tp": 1, "budget": 4 * c}),
                ("add_request", dict(p=p, tenant="t0", max_tokens=1)),
                ("drain", {}),  # the prompt's 3 chunks are stored
                ("add_request", dict(p=p, tenant="t0", max_tokens=1)),
                ("step", dict(wait_ms=0, n=1)),  # its lookup is submitted, not answered yet
                ("abort", dict(i=0)),  # aborted while still waiting
                ("drain", {}),
            ],
        )
        if not m.aborted_before_lookup:
            # a build whose lookup answers in the step that submits it (0.5.1) schedules the
            # request before the abort: the situation this finding needs cannot be made there
            pytest.skip(
                f"lmcache {installed_lmcache()} answered the lookup in the step that submitted it: the "
                "request was scheduled before the abort, so no abort before its lookup is consumed "
                "can be made on this build"
            )
        srv = m.server  # (no MP_LOOKUP_PREFETCH_END shows for the aborted request: its result is never consumed)
        counts = poll_until(
            lambda: _lock_counts(srv), lambda c: c == (0, 0), timeout=5, first_delay=0.1, max_delay=0.1
        )[1]
        _seen(
            LocksLeaked,
            counts == (0, 0),
            (
                f"5 s after the aborted request ended (no request alive) the server's L1 holds "
                f"{counts[0]} read-locked and {counts[1]} write-locked objects"
            ),
        )
    finally:
        harness.release(cfg.server())


#: LMCacheMPConnector reads CachedRequestData.resumed_req_ids, which vLLM 0.34 dropped: every
#: scheduler step with a running request raises AttributeError in build_connector_meta (read in
#: 0.5.6's and 0.5.7rc2's connector source; the capability probe reads it for any pairing)
CONNECTOR_SCHEDULER_FIELDS = f">=0.5.6,{UP_TO}"
CONNECTOR_SCHEDULER_FIELDS_VLLM = ">=0.34.0"


#: measured: vLLM 0.33.0 and 0.34.0 (ci/matrix.sh --vllm 0.34.0), every lmcache from 0.5.0 to 0.5.6
#: (each takes `server_urls` in LMCacheMPSchedulerAdapter: read in each release's wheel)
BUILTIN_CONNECTOR_VLLM = ">=0.33.0,<=0.34.0"

_BUILTIN_PROBE = r"""
import json, sys
from fixtures.drivers import procs, vllm_model  # telemetry off; vLLM's CPU platform
from fixtures.case.model import ModelShape
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

plan = vllm_model.build(ModelShape("llama", 1, ("full",)), sys.argv[1], tp=1, num_blocks=80, max_model_len=1024,
                        connector="by_name")  # kv_connector="LMCacheMPConnector", resolved by vLLM's registry
cls = KVConnectorFactory.get_connector_class(plan.vllm_config.kv_transfer_config)
try:
    conn = KVConnectorFactory.create_connector(plan.vllm_config, KVConnectorRole.SCHEDULER, plan.scheduler_kv_config)
    out = {"class": cls.__name__, "error": None}
    conn.shutdown()
except Exception as e:
    out = {"class": cls.__name__, "error": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
"""


@known_issue(
    SINCE_0_5_0,
    vllm=BUILTIN_CONNECTOR_VLLM,
    raises=BuiltinConnectorBroken,
    reason="vLLM 0.33-0.34's builtin LMCacheMPConnectorUpstream (what LMCACHE_USE_UPSTREAM_MP=1 selects) "
    "cannot be constructed against lmcache 0.5.x: its create_scheduler_adapter passes server_url= to "
    "LMCacheMPSchedulerAdapter, which takes server_urls (and its wait_for_save reads "
    "worker_adapter.use_mla, which 0.5.6's worker adapter does not have)",
)
def test_vllms_builtin_connector_is_constructed_against_this_lmcache(harness):
    """What a user gets who sets LMCACHE_USE_UPSTREAM_MP=1: vLLM's registry resolves
    `LMCacheMPConnector` to its builtin LMCacheMPConnectorUpstream, and the scheduler-role
    connector must construct against a real server (in a subprocess: vLLM picks the class when
    the module is first imported)."""
    import json
    import os
    import subprocess
    import sys

    from fixtures import ROOT
    from fixtures.errors import HarnessError

    pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
    srv = harness.server(ServerOptions(chunk_size=16))
    env = dict(os.environ, LMCACHE_USE_UPSTREAM_MP="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-c", _BUILTIN_PROBE, srv.url],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(ROOT),
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise HarnessError(
            f"the builtin-connector probe printed nothing (exit {r.returncode}): "
            f"{(r.stderr.strip().splitlines() or [''])[-1]}"
        )
    out = json.loads(lines[-1])
    if out["class"] != "LMCacheMPConnectorUpstream":
        raise HarnessError(f"LMCACHE_USE_UPSTREAM_MP=1 resolved LMCacheMPConnector to {out['class']}")
    err = out["error"]
    if err is not None and not err.startswith("TypeError"):
        raise HarnessError(f"vLLM's builtin connector failed for a reason this pin does not name: {err}")
    _seen(BuiltinConnectorBroken, err is None, f"vLLM's builtin connector does not construct: {err}")


@pytest.mark.connector
@known_issue(
    CONNECTOR_SCHEDULER_FIELDS,
    vllm=CONNECTOR_SCHEDULER_FIELDS_VLLM,
    raises=ConnectorBrokenUnderThisScheduler,
    reason="LMCache 0.5.6-0.5.7rc2 + vLLM 0.34: LMCacheMPConnector.build_connector_meta reads "
    "CachedRequestData.resumed_req_ids, which vLLM 0.34 dropped: every scheduler step with a "
    "running request raises AttributeError (the whole connector tier fails on this pairing)",
)
def test_lmcaches_connector_runs_under_this_vllms_scheduler(harness):
    """The smallest report flow (one layer, TP1, two chunks, a second request) through vLLM's own
    Scheduler: on a pairing whose scheduler output lacks a field the connector reads, the first
    step with a running request raises AttributeError naming it."""
    connector, ModelShape = _connector()
    shape = ModelShape("llama", 1, ("full",), num_kv_heads=1, head_dim=16)
    n = 2 * resolved_block_size(shape) + 3
    case = ConnectorCase(shape, tp=1, first=PromptSpec(5, n), second=PromptSpec(5, n), max_tokens=2)
    try:
        connector.run_case(harness, case)
    except AttributeError as e:
        if "CachedRequestData" not in str(e) and "resumed_req_ids" not in str(e):
            raise
        _seen(ConnectorBrokenUnderThisScheduler, False, f"a scheduler step raised {type(e).__name__}: {e}")


@pytest.mark.connector
@known_issue(
    SINCE_0_5_0,
    raises=SchedulerCrashed,
    reason="LMCache 0.5.6 + vLLM 0.33: a request aborted while its LMCache "
    "load is in flight (WAITING_FOR_REMOTE_KVS) is freed and deleted "
    "by vLLM on LMCache's 'sent' echo of the finished request, while "
    "the load still runs (it writes into the freed blocks); when it "
    "ends, the worker reports it loaded and vLLM's scheduler asserts on "
    "a request it no longer has (_update_from_kv_xfer_finished): its "
    "engine core dies",
)
def test_an_abort_during_a_load_does_not_crash_vllms_scheduler(harness):
    """Found by the busy-engine machine's tour (TP4 dense and TP2 hybrid, an abort that landed
    inside a load on loaded cores: 2 of 6 runs). Made deterministic with a server that starts
    each retrieve 300 ms late (fault slow_retrieve: a busy server, not a bug by itself): vLLM
    aborts the request (a client disconnect) while it waits for its load, another request
    keeps the engine stepping, and the load ends."""
    import traceback

    from fixtures.case.model import ModelShape
    from fixtures.machines.busy_connector import BusyConfig, machine_for

    pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
    caps.require("connector:lmcache", "fault:slow_retrieve")
    from vllm.v1.request import RequestStatus

    cfg = BusyConfig(
        ModelShape("llama", 1, ("full",), num_kv_heads=1, head_dim=16, block_size=16, mamba_cache_mode="none"),
        tps=(1,),
        chunk_multiple=2,
        l2=False,
        server_faults=("slow_retrieve:300",),
        second_engine=False,
    )
    p = PromptSpec(3, 3 * cfg.chunk + 1)
    m = machine_for(harness, cfg)()
    crashed = None
    try:
        _refusable(m.start, tp_i=0, budget=4 * cfg.chunk)
        m.add_request(p, "t0", 1)
        m.drain()  # its 3 chunks are stored
        m.reset_prefix_cache()
        m.add_request(p, "t0", 1)  # a 3-chunk hit: vLLM schedules the load
        rid = next(iter(m.live))
        eng = m.eng
        for _ in range(50):
            eng.step()
            if eng.sched.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                break
        else:
            raise HarnessError("the request never waited for its LMCache load")
        eng.sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)  # vLLM's own abort, mid-load
        m.live.clear()
        # the engine goes on serving: another request keeps it stepping while the load ends
        eng.add("other", PromptSpec(9, 4 * cfg.chunk).tokens().tolist(), salt="other", max_tokens=20)
        try:
            eng.run_until_idle(max_steps=400, timeout=60)
        except AssertionError as e:  # raised inside vLLM's scheduler, not by this test
            frame = traceback.extract_tb(e.__traceback__)[-1]
            crashed = (
                f"{frame.name} ({frame.filename.split('site-packages/')[-1]}:{frame.lineno}): {frame.line}; "
                + " ".join(getattr(e, "__notes__", ()))
            )
    finally:
        try:
            m.teardown()
        finally:
            harness.release(cfg.server())
    _seen(
        SchedulerCrashed,
        crashed is None,
        f"vLLM's scheduler crashed after a request was aborted during its LMCache load: {crashed}",
    )
