"""The bug report's shape: 100-160 chunks of 784 tokens, stored, settled, looked up again."""

import pytest
from hypothesis import example, given, settings

from fixtures.oracle import invariants
from fixtures.properties import budget, judge, observe, on
from strategies import long_prefix_workloads
from tests import shrunk_cases as shrunk


@pytest.mark.long
@settings(max_examples=budget(1))
@given(w=long_prefix_workloads())
@example(w=shrunk.bracket(114))  # the report's bracket: 114 chunks worked for the reporter,
@example(w=shrunk.bracket(115))  # 128 did not; exact lengths, TP2 (TP4 on cuda-tp4)
@example(w=shrunk.bracket(127))
@example(w=shrunk.bracket(128))
@example(w=shrunk.bracket(129))
@example(w=shrunk.LONG_115_TP1)  # skip_retrieve_after:114
def test_long_prefix_round_trip(harness, kv_device, w):
    """Every invariant at 100+ chunks x 784 tokens (TP1/TP2, lmcache_driven: on CPU the
    shared-memory stand-in for h2d, on CUDA LMCache's h2d path itself)."""
    obs = observe(harness, on(w, kv_device))
    judge(obs, *invariants.ALL)
