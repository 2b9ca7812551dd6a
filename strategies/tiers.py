"""Cases for the tier-attribution and held-lock properties (fixtures.drivers.tiers).

Both shrink to TP1, one layer x 1 head x head_dim 4, a 1-chunk prompt, the stored prompt
itself as the query and nothing stored again in L1.
"""

from __future__ import annotations

from hypothesis import strategies as st

from fixtures.case.tiers import HOLD_SERVER, TIER_SERVER, HoldCase, TierCase
from fixtures.case.workload import MODES, PromptSpec, StoreSpec
from strategies.layouts import kv_layouts
from strategies.workloads import QUERY_KINDS, query_for


@st.composite
def tier_cases(draw, *, server=TIER_SERVER, tps=(1, 2), modes=MODES, max_chunks: int = 6) -> TierCase:
    c = server.chunk_size
    tp = draw(st.sampled_from(tps))
    stored = draw(st.integers(1, max_chunks))
    in_l1 = draw(st.integers(0, stored))
    base = StoreSpec(PromptSpec(0, stored * c))
    # the stored prompt itself, a prefix, extended, one token changed in chunk k (exact chunk
    # multiples and +/-1 come from the prefix / extended kinds)
    query = draw(query_for((base,), c, max_chunks + 2, kinds=tuple(k for k in QUERY_KINDS if k != "fresh")))
    return TierCase(
        tp, draw(st.sampled_from(modes)), draw(kv_layouts(chunk_size=c)), stored, in_l1, query, server=server
    )


@st.composite
def hold_cases(draw, *, server=HOLD_SERVER, tps=(1, 2), modes=MODES, max_chunks: int = 8) -> HoldCase:
    c = server.chunk_size
    n = draw(st.integers(1, max_chunks))
    length = n * c + draw(st.sampled_from([0, 1, c - 1]))
    return HoldCase(
        draw(st.sampled_from(tps)),
        draw(st.sampled_from(modes)),
        draw(kv_layouts(chunk_size=c)),
        PromptSpec(0, length),
        server=server,
    )
