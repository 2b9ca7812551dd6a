"""The real vLLM engine (CPU build) over LMCache: what the user sees must not change.

Each example runs fixtures.drivers.engine_flow's flow (cold alone / store / vLLM's own
prefix-cache hit / reset_prefix_cache + warm from LMCache) on a real
`vllm.LLM` with LMCacheMPConnector against the suite's `lmcache server`, and
checks: warm == cold and warm == vLLM's prefix-cache hit, token ids and
logprobs bit for bit; the engine's hit counters agree with the server's hit and
what it moved; nothing fails, hangs or crashes. Failures shrink and write an
`engine` repro (`python -m fixtures.replay FILE` runs it on a fresh engine).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings

from fixtures.case.engine import (
    DENSE,
    HYBRID,
    HYBRID_UNMODIFIED,
    SLIDING,
    SLIDING_ENGINE_DRIVEN,
    WINDOW,
    EngineCase,
)
from fixtures.compat import refusals
from fixtures.compat.known_issues import known_issue
from fixtures.drivers.engine_flow import run_engine_case
from fixtures.drivers.real_engine import EngineStartError
from fixtures.observe import event
from fixtures.oracle import verdicts
from fixtures.oracle.engine import CHECKS, check, judge, report
from fixtures.oracle.signatures import engine_gdn_state_private, engine_gdn_storages
from fixtures.properties import budget
from strategies.engine import engine_cases

pytestmark = pytest.mark.engine


def started(pool, opts):
    """The engine for `opts`; skips in one line when this build refuses its layout at start."""
    try:
        return pool.get(opts)
    except EngineStartError as e:
        refusals.skip_if_refused(e)
        raise


def run_and_check(pool, case, names=CHECKS):
    started(pool, case.engine)
    obs = run_engine_case(pool, case)
    event(f"batch of {len(case.prompts)}, step {'max' if case.step is None else case.step}, {case.settle}")
    found = judge(obs, names)
    if found:
        verdicts.fail(found, report(obs, found), kind="engine", case=case.to_json(), names=names)
    return obs


def _ids(n: int, seed: int = 0) -> tuple[int, ...]:
    r = random.Random(seed)
    return tuple(r.randrange(3, 500) for _ in range(n))


def _case(opts, lens, about, step=None, own_path=False):
    """own_path: on LMCache's own path (EngineCase.route_arounds False, the engine's own_path())."""
    if own_path:
        opts = opts.own_path()
    return EngineCase(opts, tuple(_ids(n) for n in lens), step=step, about=about, route_arounds=not own_path)


@pytest.mark.parametrize("mode", sorted(DENSE))
def test_dense_warm_equals_cold(engine_pool, mode):
    o = DENSE[mode]

    @settings(max_examples=budget(1.0))
    @given(case=engine_cases((o,)))
    # shrunk cases: skip_retrieve_after:1 (lmcache_driven) and engine_driven_skip_retrieve_after:1
    # (engine_driven) both 2C, connector_tells_one_less (1C), the split-point
    # finding (4C-1: hit 3C, 63 tokens computed), the batch non-invariance finding (3C twice)
    @example(case=_case(o, (128,), ("2C+0",)))
    @example(case=_case(o, (64,), ("1C+0",)))
    @example(case=_case(o, (255,), ("4C-1",)))
    @example(case=_case(o, (192, 192), ("3C+0", "same as #0")))
    def prop(case):
        run_and_check(engine_pool, case)

    prop()


def test_hybrid_warm_equals_cold(engine_pool):
    """The same property on a tiny Qwen3-Next (GDN + attention), one prompt at a time, with the
    model's GDN state views re-pointed into the storage LMCache moved (the connector tier's
    harness does the same; the unmodified case is pinned below), and on LMCache's own path
    (drawn: views left stale, wait_for_save not waited on), where a warm != cold that the known
    issues' signatures explain is set aside and anything else fails."""
    c = HYBRID.chunk

    @settings(max_examples=budget(0.5))
    @given(case=engine_cases((HYBRID,), max_chunks=3, max_batch=1))
    # hits of 2 and 3 chunks, in one step and in steps of 256 (the pinned case below)
    @example(case=_case(HYBRID, (2 * c + 1,), ("2C+1",), step=256))
    @example(case=_case(HYBRID, (3 * c + 1,), ("3C+1",), step=256))
    # LMCache's own path in every run (on the builds the shm-migration issue is known for, its
    # warm != cold is set aside and counted)
    @example(case=_case(HYBRID, (2 * c + 1,), ("2C+1",), step=256, own_path=True))
    def prop(case):
        run_and_check(engine_pool, case)

    prop()


class GdnStateNotRestored(Exception):
    """warm != cold on the hybrid engine, nothing else wrong, and the model's GDN layers read
    state from private memory, not from the shm storage LMCache restores into."""


# 0.5.7rc2 (the matrix): the same GdnStateNotRestored, the same warm != cold
# at the same token (|d| 0.00792) with the GDN layers' state in private memory: the range ends there
@known_issue(
    ">=0.5.6,<=0.5.7rc2",
    raises=GdnStateNotRestored,
    reason="LMCache 0.5.6 (CPU): register_kv_caches migrates the KV storage into shm and re-points only "
    "the tensors it is handed; vLLM's GDN layers keep their own conv/SSM state views of the old "
    "memory, so a restored state is never read and warm != cold",
)
def test_hybrid_gdn_state_is_restored_where_the_model_reads_it(engine_pool):
    """The hybrid divergence the reference probe saw, unmodified: one 2C+1 prompt (hit 2C),
    steps of 256. Pinned on exactly that cause: only the bit-for-bit checks fail and the engine
    reports its GDN layers' state in private memory."""
    case = _case(HYBRID_UNMODIFIED, (2 * HYBRID.chunk + 1,), ("2C+1",), step=256)
    started(engine_pool, case.engine)
    obs = run_engine_case(engine_pool, case)
    found = check(obs)
    if (
        found
        and {v.invariant for v in found} <= {"warm_equals_cold", "warm_equals_apc"}
        and engine_gdn_state_private(obs)
    ):
        raise GdnStateNotRestored(report(obs, found) + f"\nGDN state storages: {engine_gdn_storages(obs)}")
    assert not found, report(obs, found)


@pytest.mark.parametrize("layout", sorted(SLIDING))
def test_sliding_warm_equals_cold(engine_pool, layout):
    """The dense property's checks on a sliding-window model, every first prompt longer than the
    window (so the window cuts into what vLLM keeps and what LMCache restores)."""
    o = SLIDING[layout]
    c = o.chunk

    @settings(max_examples=budget(0.6))
    @given(case=engine_cases((o,), max_chunks=4, min_len=WINDOW + 1))
    # a hit ending on a chunk boundary, a whole-prompt hit (N-1), and a hit of the first
    # chunks of a longer prompt with a step that crosses a window boundary
    @example(case=_case(o, (3 * c,), ("3C+0",)))
    @example(case=_case(o, (2 * c + 1,), ("2C+1",), step=c + 1))
    # LMCache's own path in every run: wait_for_save returns before the stores end
    @example(case=_case(o, (3 * c,), ("3C+0",), own_path=True))
    def prop(case):
        run_and_check(engine_pool, case)

    prop()


class EngineDrivenRefusesGroups(Exception):
    """The engine_driven start failed with exactly the pinned LMCache refusal."""


@known_issue(
    "==0.5.6",
    raises=EngineDrivenRefusesGroups,
    reason="LMCache 0.5.6 limit: engine_driven refuses vLLM's hybrid KV cache groups (sliding + full: "
    "'engine-driven transfer does not support multiple KV transfer groups')",
)
def test_sliding_engine_driven_registers(engine_pool):
    """engine_driven on the sliding model: pinned until LMCache accepts several KV cache groups there
    (then this XPASSes, strict, and the sliding property should add the mode). Any other start
    failure is an error, not this xfail."""
    try:
        eng = engine_pool.get(SLIDING_ENGINE_DRIVEN)
    except EngineStartError as e:
        if "does not support multiple KV transfer groups" in str(e):
            raise EngineDrivenRefusesGroups(str(e)) from None
        raise
    assert eng.alive()
