"""Known-issue signatures (fixtures/oracle/signatures.py) match the fact they name and nothing
near it: a signature that matched something else would set a real failure aside."""

from __future__ import annotations

import dataclasses
import types

import pytest

from fixtures.case.connector import ConnectorCase
from fixtures.case.model import TINY_GDN, ModelShape
from fixtures.case.workload import PromptSpec
from fixtures.compat.known_issues import holds_on
from fixtures.oracle import signatures as S
from fixtures.errors import HarnessError
from fixtures.oracle.verdicts import Violation

GDN = ModelShape("qwen3_next", 2, ("gdn", "full"))
SLIDING = ModelShape("gemma3_text", 2, ("sliding", "full"))

in_range = pytest.mark.skipif(
    not all(holds_on(s.builds) for s in S.SIGNATURES),
    reason="the installed LMCache is outside a signature's range: its matches are off (tested below)",
)


def _obs(shape, *, own_path=True, stale=(), freed=0):
    layers = {
        "model.layers.0.linear_attn": (0, (8, 4), "bfloat16"),
        "model.layers.1.self_attn": (1, (8, 4), "bfloat16"),
    }
    return types.SimpleNamespace(
        case=ConnectorCase(shape, route_arounds=not own_path),
        infos=[{"stale_views": list(stale), "layers": layers}],
        freed_while_storing=freed,
    )


def _v(kind, group, invariant="restored_bit_identical", rank=0):
    return Violation(invariant, "...", {"rank": rank, "group": group, "kind": kind})


def _name(obs, v):
    s = S.known(obs, v)
    return s.name if s else None


@in_range
def test_the_stale_gdn_view_signature_matches_only_its_fact():
    stale = ("model.layers.0.linear_attn",)
    assert _name(_obs(GDN, stale=stale), _v("gdn", 0)) == "shm_migration_stale_gdn_views"
    # near misses: the route-arounds on; no stale view; a stale view of another group; an
    # attention group; another invariant; another rank
    assert _name(_obs(GDN, own_path=False, stale=stale), _v("gdn", 0)) is None
    assert _name(_obs(GDN), _v("gdn", 0)) is None
    assert _name(_obs(GDN, stale=("model.layers.1.self_attn",)), _v("gdn", 0)) is None
    assert _name(_obs(GDN, stale=stale), _v("full", 1)) is None
    assert _name(_obs(GDN, stale=stale), _v("gdn", 0, invariant="told_equals_restored")) is None
    assert _name(_obs(GDN, stale=stale), _v("gdn", 0, invariant="bytes_per_group")) == "shm_migration_stale_gdn_views"
    assert _name(_obs(GDN, stale=stale), _v("gdn", 0, rank=1)) is None


@in_range
def test_the_wait_for_save_signature_matches_only_its_fact():
    assert _name(_obs(SLIDING, freed=2), _v("sliding", 0)) == "wait_for_save_returns_before_stores_end"
    # near misses: no step freed a block while a store was in flight; the route-arounds on; a
    # full-attention group; another invariant
    assert _name(_obs(SLIDING, freed=0), _v("sliding", 0)) is None
    assert _name(_obs(SLIDING, own_path=False, freed=2), _v("sliding", 0)) is None
    assert _name(_obs(SLIDING, freed=2), _v("full", 1)) is None
    assert _name(_obs(SLIDING, freed=2), _v("sliding", 0, invariant="told_equals_restored")) is None


def _engine_obs(groups, *, own_path=True, storages="private", in_flight=0):
    from fixtures.case.engine import HYBRID, EngineCase
    from fixtures.observation.engine import EngineObservation

    info = {
        "kv_cache_groups": [{"spec": spec, "block_size": 16, "layers": [], **extra} for spec, extra in groups],
        "kv_storages": {"model.layers.0.linear_attn": [storages], "model.layers.1.self_attn": ["shm"]},
    }
    case = EngineCase(HYBRID.own_path() if own_path else HYBRID, ((1, 2, 3),), route_arounds=not own_path)
    return EngineObservation(case, engine_info=info, stores_in_flight=in_flight)


HYBRID_GROUPS = (("MambaSpec", {}), ("FullAttentionSpec", {}))
SLIDING_GROUPS = (("SlidingWindowSpec", {"sliding_window": 64}), ("FullAttentionSpec", {}))
DENSE_GROUPS = (("FullAttentionSpec", {}),)


@in_range
def test_the_engine_tiers_signatures_match_only_their_facts():
    """The real-engine tier (EngineObservation): warm != cold with the GDN layers reading private
    memory; warm != cold where vLLM frees blocks mid-request and a wait_for_save returned early."""
    out = Violation("warm_equals_cold", "...")
    assert _name(_engine_obs(HYBRID_GROUPS), out) == "shm_migration_stale_gdn_views"
    assert _name(_engine_obs(HYBRID_GROUPS), Violation("warm_equals_apc", "...")) == "shm_migration_stale_gdn_views"
    assert _name(_engine_obs(SLIDING_GROUPS, storages="shm", in_flight=1), out) == (
        "wait_for_save_returns_before_stores_end"
    )
    # near misses: the route-arounds on; the GDN state in shm (where LMCache restores it) and no
    # store in flight; another check (hits, no_failure); stores in flight on a dense model
    # (vLLM frees no block of a running request there)
    assert _name(_engine_obs(HYBRID_GROUPS, own_path=False), out) is None
    assert _name(_engine_obs(HYBRID_GROUPS, storages="shm"), out) is None
    assert _name(_engine_obs(HYBRID_GROUPS), Violation("hits", "...")) is None
    assert _name(_engine_obs(SLIDING_GROUPS, storages="shm", in_flight=1), Violation("no_failure", "...")) is None
    assert _name(_engine_obs(SLIDING_GROUPS, storages="shm", in_flight=0), out) is None
    assert _name(_engine_obs(DENSE_GROUPS, storages="shm", in_flight=3), out) is None


def _machine(*, own_path=True, freed=0, aborted_during_load=0):
    """What the busy machine shows the signatures (fixtures.machines.busy_connector)."""
    return types.SimpleNamespace(
        route_arounds=not own_path,
        engines={"A": types.SimpleNamespace(freed_while_storing=freed)},
        aborted_during_load=aborted_during_load,
    )


@in_range
def test_the_busy_machines_signatures_match_only_their_facts():
    crash = Violation("vllm_scheduler_raised", "...", {"where": "_update_from_kv_xfer_finished"})
    assert _name(_machine(freed=1), Violation("computed", "...")) == "wait_for_save_returns_before_stores_end"
    assert _name(_machine(aborted_during_load=1), crash) == "abort_during_load_crashes_vllm_scheduler"
    assert _name(_machine(aborted_during_load=1), Violation("freed", "...")) == (
        "abort_during_load_crashes_vllm_scheduler"
    )
    # near misses: the route-arounds on; no block freed while a store was in flight; another
    # check; no abort during a load; an assert elsewhere in vLLM
    assert _name(_machine(own_path=False, freed=1), Violation("computed", "...")) is None
    assert _name(_machine(own_path=False, aborted_during_load=1), crash) is None
    assert _name(_machine(freed=0), Violation("computed", "...")) is None
    assert _name(_machine(freed=1), Violation("told", "...")) is None
    assert _name(_machine(freed=1), Violation("stores", "...")) is None
    assert _name(_machine(), crash) is None
    assert _name(_machine(), Violation("freed", "...")) is None
    other = Violation("vllm_scheduler_raised", "...", {"where": "schedule"})
    assert _name(_machine(aborted_during_load=1), other) is None


def test_a_signature_is_off_outside_its_builds():
    off = tuple(dataclasses.replace(s, builds="==0.0.1") for s in S.SIGNATURES)
    obs = _obs(GDN, stale=("model.layers.0.linear_attn",))
    assert S.known(obs, _v("gdn", 0), off) is None
    assert S.set_aside(obs, [_v("gdn", 0)], off) == ([_v("gdn", 0)], [])


@in_range
def test_an_example_is_set_aside_only_when_every_violation_is_known():
    obs = _obs(GDN, stale=("model.layers.0.linear_attn",))
    known, other = _v("gdn", 0), _v("full", 1)
    assert S.set_aside(obs, [known]) == ([], ["shm_migration_stale_gdn_views"])
    assert S.set_aside(obs, [known, other]) == ([known, other], [])
    assert S.set_aside(obs, []) == ([], [])


def _own_path_gdn_case(*faults: str) -> ConnectorCase:
    """A 4-chunk GDN + attention prompt served from LMCache on its own path (the shm migration
    issue's case), with `faults` in the server; skips where the build cannot run it."""
    from fixtures.compat import capabilities as caps

    caps.require("connector:lmcache", *(f"fault:{f.split(':')[0]}" for f in faults))
    if not holds_on(S.SHM_MIGRATION_BUILDS):
        pytest.skip(f"the shm migration issue is not known on this build ({S.SHM_MIGRATION_BUILDS})")
    p = PromptSpec(4, 200)
    return ConnectorCase(
        TINY_GDN, tp=1, separate_object_groups=True, first=p, second=p, faults=faults, route_arounds=False
    )


@pytest.mark.connector
@pytest.mark.parametrize("mutant", [False, True], ids=["own-path", "mutant-route-around-back-on"])
def test_a_case_on_lmcaches_own_path_runs_it_unpatched(harness, monkeypatch, mutant):
    """ConnectorCase(route_arounds=False) runs LMCache's own path: on a build where the shm
    migration issue is known, the GDN state it restores is the known wrong one, and the example
    is set aside by that signature. The mutant harness re-enables the route-around without saying
    so (the pool hands out an engine that re-points the views): the claim must then fail."""
    from fixtures.drivers import connector
    from fixtures.oracle import connector_invariants as ci

    case = _own_path_gdn_case()
    made = []
    if mutant:

        def get(server, c, *, num_blocks, max_model_len):
            eng = connector.ConnectorEngine(
                harness,
                server,
                c.shape,
                tp=c.tp,
                num_blocks=num_blocks,
                max_num_batched_tokens=c.max_num_batched_tokens,
                max_model_len=max_model_len,
            )
            made.append(eng)
            return eng

        monkeypatch.setattr(harness.connector_engines, "get", get)
    try:
        obs = connector.run_case(harness, case)
    finally:
        for eng in made:
            eng.close()
    if not obs.retrieve_ops:
        raise HarnessError("request 2 was not served from LMCache: the case shows nothing")
    rest, matched = S.set_aside(obs, ci.check(obs))

    def claim():
        assert not rest, f"violations no known signature explains: {rest}"
        assert matched == ["shm_migration_stale_gdn_views"], (
            f"LMCache's own path showed no stale GDN state view (matched: {matched}): is it patched?"
        )

    if mutant:
        with pytest.raises(AssertionError, match="is it patched"):
            claim()
    else:
        claim()


@pytest.mark.connector
def test_a_regression_on_lmcaches_own_path_is_caught_beside_a_known_issue(harness):
    """A second bug on the path a route-around hides: the own-path GDN case above with a
    server fault that lands retrieved chunks 1 and 2 in each other's blocks
    (swap_retrieved_chunks:1; a fault that cut the load short would crash vLLM's scheduler
    instead, another known issue). The GDN group's known stale-view violation is still there,
    but the attention group's restored KV is wrong too, which no signature explains: the example
    is not set aside, it fails."""
    from fixtures.drivers import connector
    from fixtures.oracle import connector_invariants as ci

    case = _own_path_gdn_case("swap_retrieved_chunks:1")
    try:
        obs = connector.run_case(harness, case)
    finally:
        harness.release(connector.case_server(case))
    found = ci.check(obs)
    known = [v for v in found if S.known(obs, v)]
    rest, matched = S.set_aside(obs, found)
    assert known, f"the known stale-view violation is missing: is the own path patched? {found}"
    assert rest == found and matched == [], f"the regression was set aside with the known issue: {matched}"
    assert any(v.facts.get("kind") != "gdn" for v in rest), f"no violation outside the GDN group: {rest}"
