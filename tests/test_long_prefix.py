"""The bug report's shape: 100-160 chunks of 784 tokens, stored, settled, looked up again."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.devices import KV_DEVICES
from tests.properties import PROPERTIES, budget


@pytest.mark.long
@settings(max_examples=budget(1))
@given(data=st.data())
def test_long_prefix_round_trip(harness, kv_device, data):
    """Every invariant at 100+ chunks x 784 tokens (TP1/TP2, lmcache_driven: on CPU the
    shared-memory stand-in for h2d, on CUDA LMCache's h2d path itself)."""
    p = PROPERTIES["long_prefix"]
    p.check(harness, data.draw(p.on(kv_device), label="workload"))


@pytest.mark.long
@pytest.mark.parametrize("chunks", [114, 115, 127, 128, 129])
def test_bug_report_bracket(harness, kv_device, chunks):
    """The report's bracket (114 good, 128 broken) as fixed cases, exact length, TP2 (TP4 on cuda-tp4)."""
    from fixtures.kvmodel import KVLayout
    from fixtures.scenario import PromptSpec, StoreSpec, Workload
    from fixtures.server import ServerOptions

    d = KV_DEVICES[kv_device]
    w = Workload(
        server=ServerOptions(chunk_size=784), tp=d.tp_for(2), mode="lmcache_driven", device=d.device,
        layout=KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=8, dtype="bf16", block_size=16),
        stores=(StoreSpec(PromptSpec(0, chunks * 784), steps=tuple(range(16, chunks, 16))),),
        query=PromptSpec(0, chunks * 784),
    )
    PROPERTIES["long_prefix"].check(harness, w)
