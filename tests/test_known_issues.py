"""LMCache 0.5.6 behaviour the properties found, pinned as minimal regression cases.

Each is `xfail(strict=True)`: it fails today for the stated reason, and the
suite turns red the day LMCache changes that behaviour, so the pin and the
tolerance in fixtures/invariants.py can be removed.
"""

import pytest

from fixtures import invariants
from fixtures.engine import Engine
from fixtures.kvmodel import KVLayout
from fixtures.scenario import PromptSpec, StoreSpec, Workload
from fixtures.server import ServerOptions

TINY = KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="LMCache 0.5.6 books read locks a lookup releases unused (another TP rank "
                                       "lacks the chunk) as L1 reads: lmcache_mp_l1_read_chunks_total rises with "
                                       "nothing transferred")
def test_l1_read_counter_counts_only_chunks_transferred(harness):
    w = Workload(ServerOptions(chunk_size=16), 2, "lmcache_driven", TINY,
                 (StoreSpec(PromptSpec(0, 16), ranks=(0,)),), PromptSpec(0, 16))
    obs = harness.run(w)
    assert obs.hit == 0  # rank 1 never stored: no hit, no retrieve
    assert obs.delta("lmcache_mp_l1_read_chunks_total") == 0, (
        f"l1_read_chunks_total rose by {obs.delta('lmcache_mp_l1_read_chunks_total'):g} with nothing retrieved; "
        f"{invariants.KNOWN_L1_READ_OVERCOUNT}")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="LMCache 0.5.6: a RETRIEVE whose end exceeds the request's tokens raises "
                                       "ValueError (session.get_hashes) inside the blocking handler and the server "
                                       "never replies; the worker adapter waits forever (retrieve futures have no "
                                       "timeout)")
def test_retrieve_past_the_prompt_is_answered(harness):
    srv = harness.server(ServerOptions(chunk_size=16))
    eng = Engine(harness.ranks, srv, tp=1, mode="lmcache_driven", layout=TINY, model_name="pbt-known-retrieve-past-end")
    try:
        toks = PromptSpec(7, 16).tokens()
        src = eng.alloc(1)
        eng.prefill(toks, src)
        (rep,) = eng.store("known-s", toks, [(0, 16, src)], "known")
        assert rep[0].ok
        assert eng.lookup("known-q", toks, "known") == 16
        dst = eng.alloc(2)
        (r,) = eng.retrieve("known-q", toks, dst, 0, 32, "known", timeout=5.0)
        assert r.finished, "the server never answered a RETRIEVE with end=32 for a 16-token request (5 s)"
    finally:
        eng.close()
