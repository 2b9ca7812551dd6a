"""Where a hit is served from, and a looked-up hit under eviction (fixtures.drivers.tiers).

* tier_attribution: the lookup's L1/L2 counters book each hit chunk to the tier that served it
  (fs L2 server: store, write through, clear L1, store a prefix again, look up + retrieve);
* locks_hold: chunks a lookup read-locked survive L1 eviction until their retrieve.

Each has a self-check (marker selfcheck): a fault in the server's own code is found by the
property's Hypothesis search and shrunk to the bound stated; the shrunk case is an @example.
"""

import pytest
from hypothesis import example, given, settings, target

from fixtures.case.layout import KVLayout
from fixtures.case.server import ServerOptions
from fixtures.case.tiers import FILLER, HOLD_SERVER, TIER_SERVER, HoldCase, TierCase
from fixtures.case.workload import PromptSpec
from fixtures.drivers.tiers import fill_until_evicted, run_hold, run_tiers
from fixtures.oracle.tiers import check_hold, check_tiers
from fixtures.properties import budget, hold_property, tier_property
from fixtures.selfchecks import search_for_failure
from strategies.tiers import hold_cases, tier_cases

TINY = KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4)


@settings(max_examples=budget(1.5))
@given(case=tier_cases())
# the shrunk case of the self-check below: one chunk, served by L2 only
@example(case=TierCase(1, "lmcache_driven", TINY, 1, 0, PromptSpec(0, 16)))
# partly L1, partly L2, TP2, and a query one token past the stored prompt
@example(case=TierCase(2, "lmcache_driven", TINY, 4, 2, PromptSpec(0, 65)))
@example(case=TierCase(2, "engine_driven", TINY, 3, 3, PromptSpec(0, 47)))
def test_each_hit_chunk_is_booked_to_the_tier_that_served_it(harness, case):
    obs = tier_property(harness, case)
    c = case.server.chunk_size
    target(obs.hit / c, label="hit chunks")
    target((obs.deltas.get("lmcache_mp_lookup_hit_l2_tokens_total") or 0) / c, label="L2 hit chunks")


@settings(max_examples=budget(0.6))
@given(case=hold_cases())
# the shrunk case of the self-check below
@example(case=HoldCase(1, "lmcache_driven", TINY, PromptSpec(0, 16)))
@example(case=HoldCase(2, "engine_driven", TINY, PromptSpec(0, 8 * 16 + 1)))
def test_a_held_hit_survives_eviction_until_its_retrieve(harness, case):
    obs = hold_property(harness, case)
    target(obs.hit / case.server.chunk_size, label="held chunks")


SELF_CHECKS = [
    # fault, property, strategy, run+check, bound on the shrunk case, bound text
    (
        "l2_hits_booked_as_l1",
        "tier_attribution",
        tier_cases,
        lambda h, x: check_tiers(run_tiers(h, x)),
        TIER_SERVER,
        lambda x: x.tp == 1 and x.stored == 1 and x.in_l1 == 0 and x.hit_chunks() == 1,
        "TP1, one stored chunk, served by L2",
    ),
    (
        "evict_locked",
        "locks_hold",
        hold_cases,
        lambda h, x: check_hold(run_hold(h, x)),
        HOLD_SERVER,
        lambda x: x.tp == 1 and x.prompt.length // x.server.chunk_size == 1,
        "TP1, a 1-chunk prompt held",
    ),
]


@pytest.mark.selfcheck
@pytest.mark.parametrize(
    "fault,prop,strategy,body,server,bound,bound_text", SELF_CHECKS, ids=[f"{f}->{p}" for f, p, *_ in SELF_CHECKS]
)
def test_tier_and_lock_faults_are_caught_and_shrunk(harness, fault, prop, strategy, body, server, bound, bound_text):
    opts = ServerOptions(**{**server.__dict__, "faults": (fault,)})
    try:
        caught, failures, n, secs, first = search_for_failure(
            strategy(server=opts), lambda x: body(harness, x), max_examples=60
        )
    finally:
        harness.release(opts)
    assert caught, f"fault {fault} was NOT caught by {prop} in {n} examples"
    minimal, violations = failures[-1]
    print(
        f"\n{fault}->{prop}: caught after {first:.1f} s, shrunk in {secs:.0f} s over {n} runs to:\n  "
        + minimal.describe().replace("\n", "\n  ")
        + "\n  violations: "
        + "; ".join(violations[:3])
    )
    assert bound(minimal), f"{fault} was caught but shrank only to:\n{minimal.describe()}\nexpected: {bound_text}"


def test_a_fill_right_after_a_restart_evicts(harness):
    """Harness check (a CI flake once, in the history machine): a filler engine that stored
    before a server restart is in LMCache's degraded mode until its heartbeat reconnects, and a
    degraded worker adapter drops every store without a word, so a fill started at once stored
    nothing and reported "never evicted". fill_until_evicted waits for the filler to see the
    server healthy; without that wait this test fails whenever the restart leaves the filler
    degraded (it does right after `restart()` returns: the heartbeat runs once a second)."""
    opts = ServerOptions(chunk_size=16, l1_size_gb=0.03125, tag="fill-restart")
    srv = harness.server(opts)
    try:
        filler = harness.rank_groups.get(
            srv, 1, "lmcache_driven", FILLER, model_name="pbt-fill-restart", heartbeat_interval=1.0
        )
        first, _ = fill_until_evicted(srv, filler, "fill-restart-a", "fra", 7000)
        assert first > 0, "the first fill (no restart) did not evict"
        srv.restart(keep_l2=False)
        degraded = not filler.healthy()
        srv.clear_l1(force=True)
        second, _ = fill_until_evicted(srv, filler, "fill-restart-b", "frb", 8000)
    finally:
        harness.release(opts)
    assert second > 0, f"a fill right after the restart did not evict (filler degraded after the restart: {degraded})"
    print(f"\nfill after restart: filler degraded after the restart: {degraded}; evicted {second:g} chunks")
