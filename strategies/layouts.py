"""KV-cache layouts and TP rank layouts."""

from __future__ import annotations

from hypothesis import strategies as st

from fixtures.case.layout import KVLayout

DTYPES = ("fp16", "bf16", "fp32")


def kv_layouts(*, chunk_size: int | None = None, max_bytes_per_token: int = 2048) -> st.SearchStrategy[KVLayout]:
    """Layers, KV heads per rank, head dim, dtype and vLLM block size.

    Shrinks to 1 layer x 1 head x head_dim 4 fp16, block 16. The block size
    always divides `chunk_size` (LMCache requires it); head_dim is capped so a
    token stays under `max_bytes_per_token` per rank.
    """
    blocks = [b for b in (16, 8, 32) if chunk_size is None or chunk_size % b == 0] or [chunk_size or 16]

    @st.composite
    def build(draw):
        layers = draw(st.integers(1, 4))
        heads = draw(st.sampled_from([1, 2, 4, 8]))
        dtype = draw(st.sampled_from(DTYPES))
        dims = [
            d
            for d in (4, 8, 16, 64, 128)
            if 2 * layers * heads * d * KVLayout(dtype=dtype).itemsize <= max_bytes_per_token
        ]
        return KVLayout(
            num_layers=layers,
            kv_heads_per_rank=heads,
            head_dim=draw(st.sampled_from(dims or [4])),
            dtype=dtype,
            block_size=draw(st.sampled_from(blocks)),
        )

    return build()


def tiny_layouts(*, chunk_size: int | None = None) -> st.SearchStrategy[KVLayout]:
    """Small layouts for 100+ chunk prompts: a few bytes per token keep 125k tokens cheap."""
    blocks = [b for b in (16, 8) if chunk_size is None or chunk_size % b == 0] or [chunk_size or 16]
    return st.builds(
        KVLayout,
        num_layers=st.integers(1, 2),
        kv_heads_per_rank=st.sampled_from([1, 2]),
        head_dim=st.sampled_from([4, 8]),
        dtype=st.sampled_from(DTYPES),
        block_size=st.sampled_from(blocks),
    )


def rank_layouts(tps: tuple[int, ...] = (1, 2, 4), *, allow_missing: bool = True):
    """(tp, ranks that store) where None means every rank; shrinks to (1, None)."""

    @st.composite
    def build(draw):
        tp = draw(st.sampled_from(tps))
        if tp == 1 or not allow_missing or not draw(st.booleans()):
            return tp, None
        ranks = draw(st.sets(st.integers(0, tp - 1), min_size=0, max_size=tp - 1))
        return tp, tuple(sorted(ranks))

    return build()
