"""Hit accounting: what a lookup reports is exactly the prefix that is stored."""

import pytest
from hypothesis import example, given, settings

from fixtures.case.workload import MODES
from fixtures.properties import budget, judge, observe, on
from strategies import workloads
from tests import shrunk_cases as shrunk

#: every case is drawn in one transfer mode; the `mode` parameter says which it runs in
DRAWN = ("lmcache_driven",)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(3))
@given(w=workloads(modes=DRAWN))
@example(w=shrunk.ONE_CHUNK)  # inflate_hit
def test_hit_is_exactly_the_stored_prefix(harness, mode, kv_device, w):
    """hit == C x (leading query chunks stored on every rank), for exact multiples,
    +/-1 token, prefixes, extensions, chunked stores and missing ranks."""
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "hit_accounting")


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(1))
@given(w=workloads(modes=DRAWN, query_kinds=("fresh",)))
def test_prompt_never_stored_hits_zero(harness, mode, kv_device, w):
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "hit_accounting")


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(w=workloads(modes=DRAWN, query_kinds=("flipped",)))
@example(w=shrunk.LAST_TOKEN_CHANGED)  # chunk_hash_off_by_one
@example(w=shrunk.CHANGED_IN_CHUNK_3)  # swap_retrieved_chunks:1 beside chunk_hash_off_by_one
def test_divergence_in_chunk_k_hits_exactly_k_chunks(harness, mode, kv_device, w):
    """A token changed at the first, last or any offset of chunk k: hit k chunks, restored bit-exactly."""
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "hit_accounting", "bit_identity")
