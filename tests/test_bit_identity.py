"""Restored KV is bit-identical (torch.equal, never allclose) and lands only where asked."""

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
@example(w=shrunk.ONE_CHUNK)  # retrieve_overrun
@example(w=shrunk.THREE_CHUNKS)  # swap_retrieved_chunks:1
def test_restored_blocks_are_bit_identical(harness, mode, kv_device, w):
    obs = observe(harness, on(w, kv_device, mode))
    judge(obs, "bit_identity")
