"""Prompts, prefix families, chunk sizes and counts, store steps, settle timings."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event
from hypothesis import strategies as st

from fixtures import settings
from fixtures.case import server_configs
from fixtures.case.server import ServerOptions
from fixtures.compat import capabilities as caps
from fixtures.case.workload import MODES, PromptSpec, StoreSpec, Workload
from strategies.layouts import kv_layouts, rank_layouts, tiny_layouts

#: Chunk sizes a run draws from. Each distinct value is one server per xdist
#: worker (~6 s to start), so the set is small; it includes non-powers of two
#: and the bug report's 784. Override: LMCACHE_PBT_CHUNK_SIZES=16,48,112,784
CHUNK_SIZES = settings.CHUNK_SIZES.get()

#: Upper bound on one prompt's tokens in the general properties (the long-prefix
#: property goes to 160 x 784 = 125,440).
MAX_TOKENS = settings.MAX_TOKENS.get()

#: A generated workload's KV (all prompts, all ranks) stays under this, half the
#: default 0.25 GB L1, so its chunks always fit below the eviction watermark and
#: the hit can be predicted exactly. (Pressure on L1 is issue of its own: the
#: stateful machine fills L1 past the watermark on purpose.)
MAX_WORKLOAD_BYTES = settings.MAX_WORKLOAD_BYTES.get()


def chunk_sizes(values: tuple[int, ...] | None = None) -> st.SearchStrategy[int]:
    """One of the configured chunk sizes (CHUNK_SIZES, read when the strategy is
    built; conftest narrows it to the server's chunk size under --lmcache-url);
    shrinks to the smallest."""
    return st.sampled_from(sorted(values if values is not None else CHUNK_SIZES))


def chunk_counts(max_chunks: int = 160) -> st.SearchStrategy[int]:
    """0..max_chunks, weighted to small counts and to 100+ when allowed."""
    parts = [st.integers(0, min(4, max_chunks)), st.integers(0, min(24, max_chunks))]
    if max_chunks >= 100:
        parts.append(st.integers(100, max_chunks))
    return st.one_of(*parts)


def prompt_lengths(chunk: int, max_chunks: int) -> st.SearchStrategy[int]:
    """n*chunk + delta: exact multiples and +/-1 token most of the time, any tail otherwise."""

    @st.composite
    def build(draw):
        n = draw(chunk_counts(max_chunks))
        delta = draw(st.one_of(st.sampled_from([0, -1, 1]), st.integers(0, chunk - 1)))
        return max(0, n * chunk + delta)

    return build()


def _offset_in_chunk(chunk: int) -> st.SearchStrategy[int]:
    """Where inside a chunk a token differs: first, last, or anywhere."""
    return st.one_of(st.sampled_from([0, chunk - 1]), st.integers(0, chunk - 1))


@st.composite
def store_specs(
    draw,
    chunk: int,
    max_chunks: int,
    tp: int,
    missing_ranks: tuple[int, ...] | None,
    seed: st.SearchStrategy[int] = st.integers(0, 2),
) -> StoreSpec:
    length = draw(prompt_lengths(chunk, max_chunks))
    flips: tuple[int, ...] = ()
    if length > chunk and draw(st.integers(0, 3)) == 3:  # a divergent tail inside the family
        flips = (draw(st.integers(0, length // chunk - 1)) * chunk + draw(_offset_in_chunk(chunk)),)
    full = length // chunk
    steps: tuple[int, ...] = ()
    if full > 1 and draw(st.booleans()):  # chunked prefill: the store arrives in steps
        steps = tuple(sorted(draw(st.sets(st.integers(1, full - 1), min_size=1, max_size=min(4, full - 1)))))
    return StoreSpec(PromptSpec(draw(seed), length, flips), steps, missing_ranks)


QUERY_KINDS = ("stored", "prefix", "extended", "flipped", "fresh")


@st.composite
def query_for(
    draw, stores: tuple[StoreSpec, ...], chunk: int, max_chunks: int, kinds: tuple[str, ...] = QUERY_KINDS
) -> PromptSpec:
    """A lookup prompt related to a stored one: itself, a prefix of it, it extended,
    it with one token flipped in chunk k, or a prompt nobody stored."""
    kind = draw(st.sampled_from(kinds))
    base = draw(st.sampled_from(stores)).prompt
    if kind == "stored":
        return base
    if kind == "prefix":
        return PromptSpec(base.seed, draw(st.integers(0, base.length)), tuple(p for p in base.flips if p < base.length))
    if kind == "extended":
        extra = draw(st.one_of(st.sampled_from([1, chunk - 1, chunk, chunk + 1]), st.integers(1, 2 * chunk)))
        return PromptSpec(base.seed, min(base.length + extra, max_chunks * chunk + chunk - 1), base.flips)
    if kind == "flipped" and base.length == 0:
        base = PromptSpec(base.seed, chunk, base.flips)
    if kind == "flipped":
        k = draw(st.integers(0, max(0, base.length - 1) // chunk))
        pos = min(base.length - 1, k * chunk + draw(_offset_in_chunk(chunk)))
        return PromptSpec(base.seed, base.length, tuple(sorted(set(base.flips) ^ {pos})))
    return PromptSpec(draw(st.integers(1000, 1003)), draw(prompt_lengths(chunk, max_chunks)))


@st.composite
def workloads(
    draw,
    *,
    chunk: st.SearchStrategy[int] | None = None,
    modes: tuple[str, ...] = MODES,
    tps: tuple[int, ...] = (1, 2, 4),
    allow_missing_ranks: bool = True,
    max_stores: int = 3,
    max_tokens: int = MAX_TOKENS,
    layouts=None,
    settles: tuple[str, ...] = ("settled", "immediate"),
    server: ServerOptions = ServerOptions(),
    reserve_last_token: st.SearchStrategy[bool] | None = None,
    query_kinds: tuple[str, ...] = QUERY_KINDS,
    device: str = "cpu",
) -> Workload:
    """A full single-shot workload for fixtures.drivers.scenario.run (KV caches on `device`)."""
    c = draw(chunk if chunk is not None else chunk_sizes())
    layouts = layouts or kv_layouts
    layout = draw(layouts(chunk_size=c))
    tp, missing = draw(rank_layouts(tps, allow_missing=allow_missing_ranks))
    # capped for the largest TP the case may run at (fixtures.properties.on: cuda-tp4 runs it at TP4)
    byte_cap = MAX_WORKLOAD_BYTES // (layout.bytes_per_token * max(tps + (4,)) * max_stores)
    max_chunks = max(1, min(160, max_tokens // c, byte_cap // c))
    mode = draw(st.sampled_from(modes))
    n = draw(st.integers(1, max_stores))
    drawn = []
    for i in range(n):
        # Only one store of a workload loses ranks, so "missing" stays readable.
        drawn.append(draw(store_specs(c, max_chunks, tp, missing if i == 0 else None)))
    stores = tuple(drawn)
    query = draw(query_for(stores, c, max_chunks, query_kinds))
    return Workload(
        server=draw(server_configurations(replace(server, chunk_size=c))),
        tp=tp,
        mode=mode,
        layout=layout,
        stores=stores,
        query=query,
        reserve_last_token=draw(reserve_last_token if reserve_last_token is not None else reserve_last_tokens()),
        settle=draw(st.sampled_from(settles)),
        device=device,
    )


@st.composite
def server_configurations(draw, base: ServerOptions) -> ServerOptions:
    """LMCache's defaults (`base`, the shrink-to value) or the configuration this test rotates to
    (fixtures/case/server_configs.py). A fault-injected or tagged server stays as it is (the
    self-checks' bounds are stated for the defaults); so does a build without the flags."""
    cfg = server_configs.for_test(server_configs.current_test())
    if cfg is server_configs.DEFAULT or base.faults or base.tag or not all(caps.has(n) for n in cfg.needs):
        out = base
    else:
        out = draw(st.sampled_from([base, cfg.apply(base)]))
    name = server_configs.name_of(out)
    server_configs.DRAWN[name] += 1
    event(f"server: {name}")
    return out


def reserve_last_tokens() -> st.SearchStrategy[bool]:
    """Both values where the build's scheduler adapter takes `reserve_last_token`
    (fixtures.compat.capabilities), else only the default False."""
    from fixtures.compat import capabilities as caps

    return st.booleans() if caps.has("reserve_last_token") else st.just(False)


@st.composite
def long_prefix_workloads(
    draw,
    *,
    chunk: int = 784,
    min_chunks: int = 100,
    max_chunks: int = 160,
    tps: tuple[int, ...] = (1, 2),
    modes: tuple[str, ...] = ("lmcache_driven",),
    server: ServerOptions = ServerOptions(),
    device: str = "cpu",
) -> Workload:
    """The bug report's shape: one prompt of 100..160 chunks of 784 tokens, stored
    (in chunked-prefill steps or at once), settled, then looked up again: exactly,
    one token short, one token long, or extended by a chunk."""
    n = draw(st.integers(min_chunks, max_chunks))
    length = n * chunk + draw(st.sampled_from([0, -1, 1]))
    layout = draw(tiny_layouts(chunk_size=chunk))
    tp = draw(st.sampled_from(tps))
    steps: tuple[int, ...] = ()
    if draw(st.booleans()):
        step = draw(st.sampled_from([8, 16, 32]))
        steps = tuple(range(step, length // chunk, step))
    store = StoreSpec(PromptSpec(0, length), steps)
    qlen = draw(st.sampled_from([length, length - 1, length + 1, length + chunk]))
    return Workload(
        server=replace(server, chunk_size=chunk),
        tp=tp,
        mode=draw(st.sampled_from(modes)),
        layout=layout,
        stores=(store,),
        query=PromptSpec(0, qlen),
        reserve_last_token=draw(reserve_last_tokens()),
        settle="settled",
        device=device,
    )
