"""What is reported hit is what moves: blocks and bytes, per rank, against the server's own figures."""

import pytest
from hypothesis import example, given, settings

from fixtures.case.workload import MODES
from fixtures.properties import budget, judge, observe, on
from strategies import workloads
from tests import shrunk_cases as shrunk
from tests.test_hits import DRAWN


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(w=workloads(modes=DRAWN))
@example(w=shrunk.ONE_CHUNK)  # inflate_hit
@example(w=shrunk.THREE_CHUNKS)  # skip_retrieve_after:2
def test_hit_tokens_are_the_tokens_transferred(harness, mode, kv_device, w):
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "hit_transferred")


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(w=workloads(modes=DRAWN))
@example(w=shrunk.THREE_CHUNKS)  # skip_retrieve_after:2
def test_bytes_moved_are_tokens_times_bytes_per_token(harness, mode, kv_device, w):
    """Per rank: bytes landed == hit x bytes/token; lmcache_driven also == MP_RETRIEVE_END / MP_STORE_END."""
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "bytes_moved")
