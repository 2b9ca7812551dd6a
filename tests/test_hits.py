"""Hit accounting: what a lookup reports is exactly the prefix that is stored."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.engine import MODES
from tests.properties import PROPERTIES, budget


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(3))
@given(data=st.data())
def test_hit_is_exactly_the_stored_prefix(harness, mode, kv_device, data):
    """hit == C x (leading query chunks stored on every rank), for exact multiples,
    +/-1 token, prefixes, extensions, chunked stores and missing ranks."""
    p = PROPERTIES["hit_accounting"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(1))
@given(data=st.data())
def test_prompt_never_stored_hits_zero(harness, mode, kv_device, data):
    p = PROPERTIES["never_stored"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_divergence_in_chunk_k_hits_exactly_k_chunks(harness, mode, kv_device, data):
    """A token changed at the first, last or any offset of chunk k: hit k chunks, restored bit-exactly."""
    p = PROPERTIES["divergence"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))
