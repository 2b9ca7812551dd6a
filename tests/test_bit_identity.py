"""Restored KV is bit-identical (torch.equal, never allclose) and lands only where asked."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.engine import MODES
from tests.properties import PROPERTIES, budget


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_restored_blocks_are_bit_identical(harness, mode, kv_device, data):
    p = PROPERTIES["bit_identity"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))
