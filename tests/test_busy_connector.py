"""The connector under a busy engine (fixtures/machines/busy_connector.py): many requests,
preemption, aborts, block pressure, settle timing, a server restart with L2.

The machine runs vLLM's real Scheduler with a KV block pool too small for every
request at once, the real LMCacheMPConnector in both roles (one WORKER-role
connector per TP rank process), and the real server (fs L2). Every step checks
[computed] [told] [stores] [locks] [counters] [l2] (see the module docstring).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from itertools import groupby

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from fixtures import settings as pbt
from fixtures import observe
from fixtures.case.model import ModelShape
from fixtures.case.workload import PromptSpec
from fixtures.compat import capabilities as caps
from fixtures.compat import refusals
from fixtures.errors import HarnessError
from fixtures.machines.busy_connector import (
    PREEMPTED,
    RULES,
    BusyConfig,
    Recorder,
    fails,
    first_failure,
    machine_for,
    run_program,
)
from fixtures.machines.programs import program_text
from fixtures.oracle import verdicts
from fixtures.properties import budget
from fixtures.selfchecks import shrink_program, judge_on_other_builds

pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
pytestmark = [pytest.mark.connector, pytest.mark.stateful, pytest.mark.busy]
if pbt.NO_BUSY.get():
    pytestmark.append(pytest.mark.skip(reason="busy-connector tier switched off (LMCACHE_PBT_NO_BUSY=1)"))

#: steps per generated program, and programs per layout (a share of the profile's budget:
#: 1 at ci and dev, 20 at nightly; every rule already fires in each layout's tour). One
#: program of 20 steps takes 2-3 min on 2 cores (every check after every engine step).
STEPS = pbt.BUSY_STEPS.get()
PROGRAMS = pbt.BUSY_PROGRAMS.get() or budget(0.1)

LAYOUTS = {
    # dense attention, TP 1/2/4; LMCache chunk = 2 blocks of 16
    # (mamba_cache_mode "none": LMCache 0.5.6 applies its Mamba step-alignment bound,
    # max_num_batched_tokens >= block, to any model whose cache config says "align")
    "dense": BusyConfig(
        ModelShape("llama", 2, ("full", "full"), num_kv_heads=4, head_dim=16, block_size=16, mamba_cache_mode="none"),
        tps=(1, 2, 4),
        chunk_multiple=2,
    ),
    # sliding window (2 blocks) + full attention, separate object groups
    "sliding": BusyConfig(
        ModelShape(
            "gemma3_text",
            2,
            ("sliding", "full"),
            num_kv_heads=2,
            head_dim=16,
            block_size=16,
            sliding_window=32,
            mamba_cache_mode="none",
        ),
        tps=(1, 2),
        chunk_multiple=2,
        separate_object_groups=True,
    ),
    # hybrid GDN + full attention (vLLM's page alignment picks the block), one KV head per rank
    # at TP1 and TP2 (LMCache 0.5.6's CPU SHM path needs contiguous views: tests/test_known_issues.py).
    # Not TP4: the alignment makes the block size depend on the per-rank state page, so a TP4
    # engine would need another LMCache chunk than the layout's server has.
    "hybrid-gdn": BusyConfig(
        ModelShape(
            "qwen3_next",
            4,
            ("gdn", "gdn", "gdn", "full"),
            num_kv_heads=1,
            linear_key_heads=4,
            linear_value_heads=8,
            mamba_cache_mode="align",
        ),
        tps=(1, 2),
        chunk_multiple=1,
        separate_object_groups=True,
        max_chunks=3,
    ),
}
#: the dense layout on vLLM's builtin LMCacheMPConnectorUpstream (the connector axis; it has no
#: hybrid KV cache manager, so dense only): skips in one line where it cannot be constructed
LAYOUTS["dense-vllm_builtin"] = replace(LAYOUTS["dense"], connector="vllm_builtin")


def tour(cfg: BusyConfig, own_path: bool = False) -> list[tuple[str, dict]]:
    """A fixed program that fires every rule where each has something to act on (own_path: on
    LMCache's own path, without the machine's route-arounds)."""
    c = cfg.chunk
    p = PromptSpec(0, 3 * c)  # exactly 3 chunks
    q = PromptSpec(0, 3 * c + 1)  # the same family, one token more
    r = PromptSpec(1, 2 * c - 1)  # another family, one token short of 2 chunks
    s = PromptSpec(0, 2 * c + 5, (c + 3,))  # shares chunk 0 with p, diverges in chunk 1
    return [
        ("start", {"tp": cfg.tps[-1], "budget": c + 1, **({"route_arounds": False} if own_path else {})}),
        ("add_request", dict(p=p, tenant="t0", max_tokens=1)),
        ("step", dict(wait_ms=0, n=3)),  # lookup not ready, then prefill steps
        ("add_request", dict(p=q, tenant="t0", max_tokens=3)),
        ("add_request", dict(p=r, tenant="t1", max_tokens=3)),
        ("step", dict(wait_ms=50, n=3)),  # two requests share the budget
        ("preempt_all", {}),
        ("step", dict(wait_ms=5, n=2)),
        ("add_request", dict(p=s, tenant="t0", max_tokens=1)),
        ("abort", dict(i=0)),
        ("drain", {}),
        ("reset_prefix_cache", {}),
        ("add_request", dict(p=q, tenant="t0", max_tokens=1)),  # served from LMCache
        ("add_request", dict(p=p, tenant="t1", max_tokens=1)),  # another tenant: a miss
        ("drain", {}),
        ("start_second_engine", {}),  # another model name, same server
        ("add_request", dict(p=q, tenant="t0", max_tokens=3, engine="B")),  # A stored q: B must miss
        ("drain", {}),
        ("reset_prefix_cache", {}),
        ("add_request", dict(p=q, tenant="t0", max_tokens=3, engine="B")),  # B's own store: a hit
        ("drain", {}),
        ("restart_server", {}),
        ("reset_prefix_cache", {}),
        ("add_request", dict(p=q, tenant="t0", max_tokens=1)),  # from L2 after the restart
        ("add_request", dict(p=q, tenant="t0", max_tokens=3, engine="B")),  # B's, from L2 too
        ("drain", {}),
    ]


@pytest.fixture
def busy_machine(harness):
    made = []

    def make(cfg: BusyConfig, recorder: Recorder | None = None):
        made.append(cfg)
        return machine_for(harness, cfg, recorder)

    try:
        yield make
    finally:
        for cfg in made:
            harness.release(cfg.server())


@contextlib.contextmanager
def supported(cfg: BusyConfig):
    """Skip (one line) when this build cannot run the layout's connector or register its KV
    caches at all."""
    caps.require(f"connector:{cfg.connector}")
    try:
        yield
    except (HarnessError, ValueError, BaseExceptionGroup) as e:  # a group: Hypothesis' distinct failures
        refusals.skip_if_refused(e)
        raise


def failure_without_the_fault(busy_machine, cfg: BusyConfig, steps) -> str | None:
    """What the fault's program fails with once the faults are taken out (None: it passes).
    Where a self-check's fault went uncaught, this tells judge_on_other_builds whether the
    build already breaks the property or the fault does not take effect there."""
    with supported(cfg):
        return fails(busy_machine(replace(cfg, scheduler_faults=(), server_faults=())), steps)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_busy_tour_fires_every_rule(busy_machine, layout):
    """Every rule, in an order where each acts on something; every check after every step."""
    cfg = LAYOUTS[layout]
    rec = Recorder()
    t0 = time.monotonic()
    with supported(cfg):
        run_program(busy_machine(cfg, rec), tour(cfg))
    secs = time.monotonic() - t0
    missing = [r for r in RULES if r != "new_prompt" and not rec.fired.get(r)]
    print(f"\n{layout}: tour of {len(tour(cfg))} rules, {rec.steps} engine steps in {secs:.1f} s")
    assert not missing, f"the tour did not fire {missing}"


@pytest.mark.parametrize("layout", ["dense", "sliding"])
def test_busy_tour_on_lmcaches_own_path(busy_machine, layout):
    """The tour without the machine's route-arounds (steps do not wait for their stores, an abort
    lands during a load): every check after every step, and a violation only set aside where a
    known issue's signature on this build explains it (then the program stops there, counted in
    the run's summary); any other violation fails."""
    cfg = LAYOUTS[layout]
    rec = Recorder()
    with supported(cfg):
        m = run_program(busy_machine(cfg, rec), tour(cfg, own_path=True))
    missing = [r for r in RULES if r != "new_prompt" and not rec.fired.get(r)]
    print(f"\n{layout} on LMCache's own path: set aside by {m.set_aside_by or 'nothing'}; {rec.steps} engine steps")
    assert m.set_aside_by or not missing, f"the tour did not fire {missing}"


def test_busy_restart_waits_only_where_the_workers_can_notice(busy_machine):
    """A generated program (dense and sliding, shrunk to this) once failed [restart]: engine B
    stored, engine A only registered, and an adapter that never stored never notices a
    restart (known LMCache 0.5.6 behaviour), so the harness waited 60 s for A's worker. The
    restart now runs only once every engine's workers have stored; this program skips it."""
    cfg = replace(LAYOUTS["dense"], tps=(1,))
    with supported(cfg):
        _restart_program(busy_machine(cfg))


def _restart_program(Machine):
    run_program(
        Machine,
        [
            ("start", {"tp": 1, "budget": 32}),
            ("start_second_engine", {}),
            ("add_request", dict(p=PromptSpec(0, 61, (19,)), tenant="t0", max_tokens=3, engine="B")),
            ("preempt_all", {}),
            ("preempt_all", {}),
            ("restart_server", {}),
            ("drain", {}),
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_busy_engine_histories(busy_machine, layout):
    """Generated programs: interleaved requests of shared-prefix families, steps at any
    token budget, aborts, preemption, resets, settle timing, a restart with L2."""
    cfg = LAYOUTS[layout]
    rec = Recorder()
    t0 = time.monotonic()
    with supported(cfg):
        run_state_machine_as_test(
            busy_machine(cfg, rec),
            settings=settings(settings.default, max_examples=PROGRAMS, stateful_step_count=STEPS, deadline=None),
        )
    secs = time.monotonic() - t0
    counts = ", ".join(f"{r}={rec.fired.get(r, 0)}" for r in RULES)
    print(
        f"\nbusy {layout}: rules fired over {PROGRAMS} programs of up to {STEPS} steps: {counts}\n"
        f"{rec.steps} engine steps in {secs:.0f} s: {rec.steps / secs:.2f} steps/s, "
        f"{sum(rec.fired.values()) / secs:.2f} rules/s (every check after every step included)"
    )


# ---------------------------------------------------------------------------
# Self-checks: a fault in the real connector / server, found by Hypothesis' own
# search over the machine, shrunk to a few steps; the shrunk programs live on below.
# ---------------------------------------------------------------------------

DENSE_TP1 = BusyConfig(LAYOUTS["dense"].shape, tps=(1,), chunk_multiple=2)


@dataclass(frozen=True)
class BusySelfCheck:
    fault: str
    where: str  # "scheduler" (patched in this process) or "server"
    tags: tuple[str, ...]  # the checks that may catch it (where its effect lands decides which)
    max_steps: int  # bound on the shrunk program (rules, prompts and the engine start not counted)

    @property
    def id(self) -> str:
        return f"{self.fault}->{'+'.join(self.tags)}"

    def config(self) -> BusyConfig:
        if self.where == "scheduler":
            return replace(DENSE_TP1, scheduler_faults=(self.fault,))
        return replace(DENSE_TP1, server_faults=(self.fault,))


#: the faults' fixed programs (test_busy_fault_program_is_caught) ...
FIXED = [
    # (a) the stored watermark advances again when vLLM asks twice (blocks short)
    BusySelfCheck("stored_watermark_twice", "scheduler", ("stores",), 8),
    # (b) a preempted request's lookup locks are never freed
    BusySelfCheck("preempted_lookup_locks_kept", "scheduler", ("locks",), 8),
    # (c) a load writes past its range into the blocks after it: another request's
    # ([computed]) or, depending on which physical blocks vLLM handed out and when the load
    # lands, blocks no request holds ([freed]) ...
    BusySelfCheck("retrieve_overrun", "server", ("computed", "freed"), 8),
    # ... and, alone on the engine, only blocks no request holds (vLLM freed them): [freed]
    BusySelfCheck("retrieve_overrun", "server", ("freed",), 8),
]
#: ... and Hypothesis' search over SITUATIONS, once per fault (test_busy_fault_is_caught_and_shrunk:
#: the overrun's search shrinks to the [freed] program, 5 rules)
SELF_CHECKS = [c for c in FIXED if c.id != "retrieve_overrun->freed"]


#: Each fault's program as test_busy_fault_is_caught_and_shrunk shrank it (first written by
#: hand from how the fault works), run as a fixed regression: the fault must be caught by
#: its own check within `max_steps` rules. LMCache chunk 32 (2 blocks of 16), 18 KV blocks.
FAULT_PROGRAMS = {
    # a 3-chunk prefix is stored; a 4-chunk+1 request of another family takes 9 of the 17
    # usable blocks, so the request of the stored family (9 blocks) waits and vLLM asks
    # get_num_new_matched_tokens again every step: the watermark reaches 96 + k x 96, and
    # its prefill ends with nothing stored past the hit. The blocker is admitted first (three
    # steps, 50 ms apart) and decodes 10 tokens: both requests' lookups are polled without
    # blocking, and vLLM admits a later waiting request whose lookup answered while the first
    # one's is still "not ready", so added together the stored family went first whenever its
    # lookup answered first (a CI run where the situation never triggered; 4 of 30 under load)
    "stored_watermark_twice->stores": [
        ("start", {"tp": 1, "budget": 200}),
        ("add_request", dict(p=PromptSpec(0, 96), tenant="t0", max_tokens=1)),
        ("drain", {}),
        ("add_request", dict(p=PromptSpec(1, 129), tenant="t0", max_tokens=10)),
        ("step", dict(wait_ms=50, n=3)),
        ("add_request", dict(p=PromptSpec(0, 129), tenant="t0", max_tokens=1)),
        ("drain", {}),
    ],
    # two 4-chunk prompts fit at admission (vLLM reserves the whole prompt: 8 + 8 of 17 usable
    # blocks) but not their first decode blocks: vLLM preempts the one admitted second, whose
    # own blocks stay in its prefix cache; it resumes with vLLM's hit covering LMCache's (no
    # retrieve), so only free_lookup_locks releases the lookup's 4 read locks. Their lookups
    # answer when they answer (polled without blocking): with 3 tokens each, the one whose
    # lookup answered first could finish before the other was admitted (a lookup 8 steps
    # late), so nothing was preempted (a clean-clone run where the fault went unseen). With 16
    # tokens (at most 9 blocks: 128 + 15 positions) the first still runs, within 9 + 8 blocks,
    # when a lookup answers up to 12 steps late (16: missed; the test below makes one 8 late:
    # test_the_locks_situation_preempts_when_a_lookup_answers_late), and the steps 50 ms
    # apart give both lookups time to answer before either is admitted
    "preempted_lookup_locks_kept->locks": [
        ("start", {"tp": 1, "budget": 200}),
        ("add_request", dict(p=PromptSpec(1, 128), tenant="t0", max_tokens=16)),
        ("add_request", dict(p=PromptSpec(0, 128), tenant="t0", max_tokens=16)),
        ("step", dict(wait_ms=50, n=3)),
        ("drain", {}),
    ],
    # a 2-chunk prefix is stored (vLLM's prefix cache reset, so LMCache serves it); a request
    # loading it and one of another family are scheduled together: the load's extra chunk
    # lands in the other request's first blocks
    "retrieve_overrun->computed+freed": [
        ("start", {"tp": 1, "budget": 200}),
        ("add_request", dict(p=PromptSpec(0, 64), tenant="t0", max_tokens=1)),
        ("drain", {}),
        ("reset_prefix_cache", {}),
        ("add_request", dict(p=PromptSpec(0, 65), tenant="t0", max_tokens=3)),
        ("add_request", dict(p=PromptSpec(1, 96), tenant="t0", max_tokens=3)),
        ("step", dict(wait_ms=50, n=3)),
        ("drain", {}),
    ],
    # the same load alone: its extra chunk lands in blocks no request holds (freed by the
    # first request and reset out of vLLM's prefix cache)
    "retrieve_overrun->freed": [
        ("start", {"tp": 1, "budget": 200}),
        ("add_request", dict(p=PromptSpec(0, 64), tenant="t0", max_tokens=1)),
        ("drain", {}),
        ("reset_prefix_cache", {}),
        ("add_request", dict(p=PromptSpec(0, 65), tenant="t0", max_tokens=3)),
        ("step", dict(wait_ms=50, n=3)),
        # the load happens whenever the lookup answers: three steps 50 ms apart were not
        # always enough under load in a clean-clone run ("its program passed every check")
        ("drain", {}),
    ],
}


@pytest.mark.selfcheck
@pytest.mark.parametrize("check", FIXED, ids=lambda c: c.id)
def test_busy_fault_program_is_caught(busy_machine, check):
    """The fault's fixed program fails, with its own check's tag, within the step bound."""
    steps = FAULT_PROGRAMS[check.id]
    counted = [s for s in steps if s[0] != "start"]
    assert len(counted) <= check.max_steps
    cfg = check.config()
    with supported(cfg):
        why = fails(busy_machine(cfg), steps)
    # the same program without the fault passes every check (the failure is the fault's)
    clean_why = failure_without_the_fault(busy_machine, cfg, steps)
    if why is None or not any(why.startswith(f"[{tag}]") for tag in check.tags) or clean_why is not None:
        judge_on_other_builds(check.fault, clean_why)
    assert why is not None, f"{check.fault}: its program passed every check"
    assert any(why.startswith(f"[{tag}]") for tag in check.tags), f"{check.fault}: caught by another check: {why}"
    assert clean_why is None, f"{check.fault}: the program fails without the fault too: {clean_why}"


@pytest.mark.selfcheck
@pytest.mark.parametrize("late", ["r1", "r2"])
def test_the_locks_situation_preempts_when_a_lookup_answers_late(busy_machine, monkeypatch, late):
    """The kept-locks program does not depend on which lookup answers first: with one
    request's lookup answering 8 steps after the other's (vLLM's "not ready yet", None, from
    the connector's get_num_new_matched_tokens, as a slow server answers), the first request
    still runs when the second is admitted, vLLM preempts, and [locks] catches the fault.
    (With 3 tokens per request, as before, this meant no preemption at all. The program
    tolerates up to 12 steps; 8 leaves the second request's load a few steps' slack.)"""
    from fixtures.drivers import vllm_model  # noqa: F401  (first: it sets up vLLM's CPU platform)
    from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector

    check = next(c for c in FIXED if c.fault == "preempted_lookup_locks_kept")
    LATE = 8
    answer = LMCacheMPConnector.get_num_new_matched_tokens
    not_ready = []

    def answers_late(self, request, num_computed_tokens):
        if request.request_id.endswith(f"-{late}") and len(not_ready) < LATE:
            not_ready.append(request.request_id)
            return None, False
        return answer(self, request, num_computed_tokens)

    monkeypatch.setattr(LMCacheMPConnector, "get_num_new_matched_tokens", answers_late)
    cfg = check.config()
    with supported(cfg), observe.recorded() as seen:
        why = fails(busy_machine(cfg), FAULT_PROGRAMS[check.id])
    if why is None:
        judge_on_other_builds(check.fault, failure_without_the_fault(busy_machine, cfg, FAULT_PROGRAMS[check.id]))
    assert len(not_ready) == LATE, f"the lookup of {late} was asked only {len(not_ready)} times before it answered"
    assert PREEMPTED in seen, "nothing was preempted"
    assert why is not None and why.startswith("[locks]"), f"{check.fault}: not caught by [locks]: {why}"


#: The search space of the shrinking self-checks: the three situations above, one after the
#: other on one engine (each fault shows in its own; the others are noise to shrink away).
#: The overrun's comes first: later, with more of the pool in use, its extra chunk can fall
#: past the last KV block, the load fails, and a failed load crashes vLLM's scheduler
#: (known LMCache 0.5.6 behaviour) before any check sees the overrun.
SITUATIONS = [("start", {"tp": 1, "budget": 200})] + [
    s
    for f in (
        "retrieve_overrun->computed+freed",
        "stored_watermark_twice->stores",
        "preempted_lookup_locks_kept->locks",
    )
    for s in FAULT_PROGRAMS[f]
    if s[0] != "start"
]
SEARCH_EXAMPLES = pbt.BUSY_SELFCHECK_EXAMPLES.get()


@pytest.mark.selfcheck
@pytest.mark.parametrize("check", SELF_CHECKS, ids=lambda c: c.id)
def test_busy_fault_is_caught_and_shrunk(busy_machine, check):
    """The machine's checks catch the fault on SITUATIONS, raised by the check that judges it
    (its own exception type); Hypothesis then searches the subsequences of SITUATIONS up to the
    failing step and its shrinking drops steps down to a few that read as a reproduction.
    (Whole-machine programs reach these faults too rarely for CI: 60 derandomized programs of
    20 steps, 614 s, never triggered stored_watermark_twice.)"""
    cfg = check.config()
    Machine = busy_machine(cfg)
    start, program = SITUATIONS[0], SITUATIONS[1:]
    t0 = time.monotonic()
    with supported(cfg), observe.recorded() as seen:
        why, at = first_failure(Machine, SITUATIONS)
    if why is None:
        judge_on_other_builds(check.fault, failure_without_the_fault(busy_machine, cfg, SITUATIONS))
    # (what the machine saw, so that a miss names its cause: the requests, the rules'
    # events, each idle check's verdict)
    runs = [line if n == 1 else f"{line} (x{n})" for line, n in ((k, len(list(g))) for k, g in groupby(seen))]
    assert why is not None, (
        f"{check.fault} was NOT caught on the situations program; the machine saw, last 30:\n  "
        + "\n  ".join(runs[-30:])
    )
    failing = shrink_program(
        lambda steps: run_program(Machine, [start] + steps), program[:at], examples=SEARCH_EXAMPLES
    )
    secs = time.monotonic() - t0
    assert failing, f"{check.fault}: caught on the situations, but no subsequence failed in {SEARCH_EXAMPLES} examples"
    types = {verdicts.violation_type(tag) for tag in check.tags}
    mine = [f for f in failing if f[0] in types]
    others = sorted({f[0].__name__ for f in failing} - {ty.__name__ for ty in types})
    if not mine:
        judge_on_other_builds(check.fault, failure_without_the_fault(busy_machine, cfg, SITUATIONS))
    assert mine, f"{check.fault}: caught only by other checks: {others}: {failing[-1][2]}"
    _, minimal, why_min = mine[-1]
    text = program_text(minimal, cfg.chunk)
    print(
        f"\n{check.fault}: caught on the situations ({why})\n  shrunk by Hypothesis in {secs:.0f} s, "
        f"{len(failing)} failing replays, to {len(minimal)} steps:\n  {text}\n  -> {why_min}"
        + (f"\n  (also seen while shrinking: {', '.join(others)})" if others else "")
    )
    assert len(minimal) <= check.max_steps, f"{check.fault}: shrank only to {len(minimal)} steps: {text}"
