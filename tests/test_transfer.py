"""What is reported hit is what moves: blocks and bytes, per rank, against the server's own figures."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.engine import MODES
from tests.properties import PROPERTIES, budget


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_hit_tokens_are_the_tokens_transferred(harness, mode, kv_device, data):
    p = PROPERTIES["hit_transferred"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_bytes_moved_are_tokens_times_bytes_per_token(harness, mode, kv_device, data):
    """Per rank: bytes landed == hit x bytes/token; lmcache_driven also == MP_RETRIEVE_END / MP_STORE_END."""
    p = PROPERTIES["bytes_moved"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))
