"""The bug report's shape: 100-160 chunks of 784 tokens, stored, settled, looked up again."""

import pytest
from hypothesis import given, settings

from tests.properties import PROPERTIES, budget


@pytest.mark.long
@settings(max_examples=budget(1))
@given(w=PROPERTIES["long_prefix"].strategy())
def test_long_prefix_round_trip(harness, w):
    """Every invariant at 100+ chunks x 784 tokens (TP1/TP2, lmcache_driven: the CPU stand-in for h2d)."""
    PROPERTIES["long_prefix"].check(harness, w)


@pytest.mark.long
@pytest.mark.parametrize("chunks", [114, 115, 127, 128, 129])
def test_bug_report_bracket(harness, chunks):
    """The report's bracket (114 good, 128 broken) as fixed cases, exact length, TP2."""
    from fixtures.kvmodel import KVLayout
    from fixtures.scenario import PromptSpec, StoreSpec, Workload
    from fixtures.server import ServerOptions

    w = Workload(
        server=ServerOptions(chunk_size=784), tp=2, mode="lmcache_driven",
        layout=KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=8, dtype="bf16", block_size=16),
        stores=(StoreSpec(PromptSpec(0, chunks * 784), steps=tuple(range(16, chunks, 16))),),
        query=PromptSpec(0, chunks * 784),
    )
    PROPERTIES["long_prefix"].check(harness, w)
