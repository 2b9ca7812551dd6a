"""Fixed cases every run replays as `@example`s: the shrunk case of every self-check
(fixtures/selfchecks.py and tests/test_selfchecks.py; the table in docs/tier-single-shot.md) and the bug
report's bracket. Each runs on the ordinary (fault-free) server, where it must pass.

A shrunk case kept as an example keeps the property honest at the exact size where a
known fault shows: if a change to the strategies stopped generating it, the example
still runs it.
"""

from __future__ import annotations

from fixtures.case.layout import KVLayout
from fixtures.case.server import ServerOptions
from fixtures.case.workload import PromptSpec, StoreSpec, Workload

#: the layout every self-check shrinks to
TINY = KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4)


def stored_then_looked_up(chunks: int, *, flips: tuple[int, ...] = (), chunk: int = 16) -> Workload:
    """TP1: one prompt of `chunks` chunks stored, then looked up (with `flips` changed)."""
    n = chunks * chunk
    return Workload(
        ServerOptions(chunk_size=chunk),
        1,
        "lmcache_driven",
        TINY,
        (StoreSpec(PromptSpec(0, n)),),
        PromptSpec(0, n, flips),
    )


#: inflate_hit (hit_accounting, hit_transferred), retrieve_overrun (bit_identity),
#: undercount_hit_metric (counters): a 1-chunk prompt stored and looked up
ONE_CHUNK = stored_then_looked_up(1)
#: skip_retrieve_after:2 (hit_transferred, bytes_moved), swap_retrieved_chunks:1 (bit_identity)
THREE_CHUNKS = stored_then_looked_up(3)
#: chunk_hash_off_by_one (divergence): the last token of the only chunk changed, hit 0
LAST_TOKEN_CHANGED = stored_then_looked_up(1, flips=(15,))
#: two faults at once, the bit_identity side: 4 chunks stored, the lookup changed at chunk 3's
#: first token (3 chunks hit)
CHANGED_IN_CHUNK_3 = stored_then_looked_up(4, flips=(48,))


def bracket(chunks: int) -> Workload:
    """The report's bracket (114 good, 128 broken): `chunks` x 784 tokens, stored in
    chunked-prefill steps of 16 chunks, looked up exactly, TP2 (TP4 on cuda-tp4)."""
    n = chunks * 784
    return Workload(
        ServerOptions(chunk_size=784),
        2,
        "lmcache_driven",
        KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=8, dtype="bf16", block_size=16),
        (StoreSpec(PromptSpec(0, n), steps=tuple(range(16, chunks, 16))),),
        PromptSpec(0, n),
    )


#: skip_retrieve_after:114 (long_prefix) shrinks to exactly 115 chunks at TP1
LONG_115_TP1 = Workload(
    ServerOptions(chunk_size=784),
    1,
    "lmcache_driven",
    bracket(115).layout,
    (StoreSpec(PromptSpec(0, 115 * 784)),),
    PromptSpec(0, 115 * 784),
)
