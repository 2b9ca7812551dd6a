"""Histories: interleavings, settle timing, L1/L2 tiers, restarts, eviction (fixtures/machines/stateful.py).

The machine runs on its own server (chunk 16, 32 MiB L1, fs L2) shared by
engine A (TP2, lmcache_driven), engine B (TP1, engine_driven, another model)
and a filler engine that pushes L1 past its eviction watermark.
"""

import functools
import time

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from fixtures import settings as pbt
from fixtures.case.server import ServerOptions
from fixtures.machines.programs import program_text
from fixtures.machines.stateful import (
    RULES,
    MachineConfig,
    Recorder,
    first_failure,
    machine_for,
    run_program,
    tour,
)
from fixtures.oracle import verdicts
from fixtures.properties import budget
from fixtures.selfchecks import shrink_program

#: steps per program; examples per run come from the profile (budget)
STEPS = pbt.STATEFUL_STEPS.get()


@pytest.mark.stateful
def test_a_fixed_tour_fires_every_rule(harness, kv_device):
    """Every rule, once, in an order where each acts on something; all checks apply."""
    cfg = MachineConfig().on(kv_device)
    rec = Recorder()
    try:
        run_program(machine_for(harness, cfg, rec), tour())
    finally:
        harness.release(cfg.server)
    missing = [r for r in RULES if not rec.fired.get(r)]
    assert not missing, f"the tour did not fire {missing}"


@pytest.mark.stateful
@pytest.mark.slow
def test_histories_never_overstate_and_never_lose(harness, kv_device):
    cfg = MachineConfig().on(kv_device)
    rec = Recorder()
    t0 = time.monotonic()
    try:
        run_state_machine_as_test(
            machine_for(harness, cfg, rec),
            settings=settings(settings.default, max_examples=budget(1), stateful_step_count=STEPS, deadline=None),
        )
    finally:
        harness.release(cfg.server)
    # Hypothesis' swarm testing switches rules off per program, so a few programs need
    # not cover every rule: the tour above does; this prints what the search ran.
    secs = time.monotonic() - t0
    steps = sum(rec.fired.values())
    counts = ", ".join(f"{r}={rec.fired.get(r, 0)}" for r in RULES)
    print(
        f"\nstateful rules fired over {budget(1)} programs: {counts}\n"
        f"{steps} steps in {secs:.0f} s: {steps / secs:.2f} steps/s (checks after every step included)"
    )


SEARCH_EXAMPLES = pbt.STATEFUL_SELFCHECK_EXAMPLES.get()
STATEFUL_FAULTS = [
    # fault, the check that must catch it, the bound on the shrunk program (steps; prompts and
    # the engines' start not counted)
    ("l2_drops_last_chunk", "lower", 4),
    # a lookup counts a store not yet committed: its hit retrieves with load errors
    ("lookup_counts_inflight:1000", "retrieve", 3),
    # store, settle_l2, clear_l1, a lookup served by L2 booked to L1
    ("l2_hits_booked_as_l1", "tiers", 4),
    # store, lookup_and_hold, fill_l1 (evicts the held chunks), retrieve_held
    ("evict_locked", "held", 4),
]


@pytest.mark.stateful
@pytest.mark.selfcheck
@pytest.mark.parametrize("fault,check,max_steps", STATEFUL_FAULTS, ids=[f[0] for f in STATEFUL_FAULTS])
def test_stateful_fault_is_caught_and_shrunk(harness, fault, check, max_steps):
    """The machine's checks catch the fault on the tour (the program CI runs), raised by the
    check that judges it (its own exception type); Hypothesis then searches the programs made
    of the tour's steps (subsequences of the tour up to its failing step) and its own
    shrinking deletes steps down to a few that read as a reproduction.
    (Random programs of the whole machine reach these faults too rarely for CI: each needs a
    particular 3-4 step order, e.g. store, settle_l2, clear_l1, lookup.)"""
    cfg = MachineConfig(
        server=ServerOptions(chunk_size=16, l1_size_gb=0.03125, l2_fs=True, faults=(fault,), tag="stateful")
    )
    Machine = machine_for(harness, cfg)
    program = [st for st in tour() if st[0] != "new_prompt"]  # prompts travel as arguments
    t0 = time.monotonic()
    try:
        why, at = first_failure(Machine, program)
        assert why is not None, f"fault {fault} was NOT caught by the stateful checks on the tour program"
        # what follows the failing step plays no part
        failing = shrink_program(functools.partial(run_program, Machine), program[: at + 1], examples=SEARCH_EXAMPLES)
    finally:
        harness.release(cfg.server)
    # Hypothesis shrinks each distinct failure (exception type) on its own; the last failing
    # replay of the expected check's type is its shrunk program
    assert failing, f"{fault}: caught on the tour, but no subsequence of it failed in {SEARCH_EXAMPLES} examples"
    mine = [f for f in failing if f[0] is verdicts.violation_type(check)]
    others = sorted({f[0].__name__ for f in failing} - {verdicts.violation_type(check).__name__})
    assert mine, f"{fault}: caught only by other checks: {others}: {failing[-1][2]}"
    _, minimal, why_min = mine[-1]
    text = program_text(minimal, 16)
    print(
        f"\n{fault}: caught on the tour ({why})\n  shrunk by Hypothesis in {time.monotonic() - t0:.0f} s, "
        f"{len(failing)} failing replays, to {len(minimal)} steps:\n  {text}\n  -> {why_min}"
        + (f"\n  (also seen while shrinking: {', '.join(others)})" if others else "")
    )
    assert len(minimal) <= max_steps, f"{fault}: shrank only to {len(minimal)} steps: {text}"
