"""Histories: interleavings, settle timing, L1/L2 tiers, restarts, eviction (fixtures/stateful.py).

The machine runs on its own server (chunk 16, 32 MiB L1, fs L2) shared by
engine A (TP2, lmcache_driven), engine B (TP1, engine_driven, another model)
and a filler engine that pushes L1 past its eviction watermark.
"""

import os
import time

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from fixtures.stateful import RULES, MachineConfig, fails, machine_for, minimize, run_program, tour
from fixtures.server import ServerOptions
from tests.properties import budget

#: steps per program; examples per run come from the profile (budget)
STEPS = int(os.environ.get("LMCACHE_PBT_STATEFUL_STEPS", "14"))


@pytest.mark.stateful
def test_a_fixed_tour_fires_every_rule(harness, kv_device):
    """Every rule, once, in an order where each acts on something; all checks apply."""
    cfg = MachineConfig().on(kv_device)
    Machine = machine_for(harness, cfg)
    try:
        run_program(Machine, tour())
    finally:
        harness.release(cfg.server)
    missing = [r for r in RULES if not Machine.fired.get(r)]
    assert not missing, f"the tour did not fire {missing}"


@pytest.mark.stateful
@pytest.mark.slow
def test_histories_never_overstate_and_never_lose(harness, kv_device):
    cfg = MachineConfig().on(kv_device)
    Machine = machine_for(harness, cfg)
    t0 = time.monotonic()
    try:
        run_state_machine_as_test(Machine, settings=settings(
            settings.default, max_examples=budget(1), stateful_step_count=STEPS, deadline=None))
    finally:
        harness.release(cfg.server)
    # Hypothesis' swarm testing switches rules off per program, so a few programs need
    # not cover every rule: the tour above does; this prints what the search ran.
    secs = time.monotonic() - t0
    steps = sum(Machine.fired.values())
    counts = ", ".join(f"{r}={Machine.fired.get(r, 0)}" for r in RULES)
    print(f"\nstateful rules fired over {budget(1)} programs: {counts}\n"
          f"{steps} steps in {secs:.0f} s: {steps / secs:.2f} steps/s (checks after every step included)")


STATEFUL_FAULTS = [
    # fault, the bound on the shrunk program (steps, excluding new_prompt)
    ("l2_drops_last_chunk", 5),
    ("lookup_counts_inflight:1000", 4),
    # store, settle_l2, clear_l1, a lookup served by L2 booked to L1
    ("l2_hits_booked_as_l1", 4),
    # store, lookup_and_hold, fill_l1 (evicts the held chunks), retrieve_held
    ("evict_locked", 4),
]


@pytest.mark.stateful
@pytest.mark.selfcheck
@pytest.mark.parametrize("fault,max_steps", STATEFUL_FAULTS, ids=[f for f, _ in STATEFUL_FAULTS])
def test_stateful_fault_is_caught_and_shrunk(harness, fault, max_steps):
    """The machine's checks catch the fault on the tour program (the one CI runs), and the
    failing program delta-debugs down to a few steps that read as a reproduction."""
    cfg = MachineConfig(server=ServerOptions(chunk_size=16, l1_size_gb=0.03125, l2_fs=True, faults=(fault,),
                                             tag="stateful"))
    Machine = machine_for(harness, cfg)
    try:
        why = fails(Machine, tour())
        assert why is not None, f"fault {fault} was NOT caught by the stateful checks on the tour program"
        minimal, why_min, runs = minimize(Machine, tour())
    finally:
        harness.release(cfg.server)
    text = " -> ".join(_step_text(name, a) for name, a in minimal)
    print(f"\n{fault}: caught on the tour ({why})\n  delta-debugged in {runs} replays to {len(minimal)} steps:"
          f"\n  {text}\n  -> {why_min}")
    assert why_min is not None, f"{fault}: the shrunk program no longer fails when replayed"
    assert len(minimal) <= max_steps, f"{fault}: shrank only to {len(minimal)} steps: {text}"


def _step_text(name: str, args: dict) -> str:
    parts = [f"{k}={v.describe(16) if hasattr(v, 'describe') else v}" for k, v in args.items()]
    return f"{name}({', '.join(parts)})"
