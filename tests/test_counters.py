"""The server's counters agree with what the engine side saw, delta by delta."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.engine import MODES
from tests.properties import PROPERTIES, budget


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_server_counters_match_the_engine(harness, mode, kv_device, data):
    p = PROPERTIES["counters"]
    p.check(harness, data.draw(p.on(kv_device, modes=(mode,)), label="workload"))
