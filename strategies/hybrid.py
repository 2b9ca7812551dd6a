"""Hybrid model layouts and connector cases (fixtures.drivers.connector).

A model shape decides vLLM's KV cache groups: how many, of which kind (full
attention, sliding window, GDN recurrent state), their block sizes (vLLM's
hybrid page alignment picks the GDN models' block), window sizes and state
sizes. Shrinks toward a one-layer dense llama at TP 1 with a 1-chunk prompt.

On CPU, LMCache 0.5.6 serves hybrid GDN models over its SHM transfer path only
when every KV view is contiguous: one KV head per rank, head_dim 16
(tests/test_known_issues.py pins the rest: a clean ValueError at registration).
Sliding windows shorter than the LMCache chunk are whole multiples of the block
size (LMCache's KVLayerGroupsManager requires it; tests/test_known_issues.py pins
that the server never answers a registration it rejects for this).
"""

from __future__ import annotations

from typing import Callable

from hypothesis import strategies as st

from fixtures.case.connector import ConnectorCase
from fixtures.case.model import ModelShape
from fixtures.case.workload import PromptSpec

FAMILIES = ("llama", "gemma3_text", "qwen3_next")


def _kinds(draw, n: int, a: str, b: str) -> tuple[str, ...]:
    """n layer kinds with at least one of each of a and b."""
    kinds = list(draw(st.lists(st.sampled_from([a, b]), min_size=n, max_size=n)))
    if a not in kinds:
        kinds[0] = a
    if b not in kinds:
        kinds[-1] = b
    return tuple(kinds)


@st.composite
def model_shapes(draw, families: tuple[str, ...] = FAMILIES, tps: tuple[int, ...] = (1, 2, 4)):
    """(ModelShape, tp): layer kinds, heads, head dim, window, GDN state size, block size."""
    family = draw(st.sampled_from(families))
    if family == "qwen3_next":
        tp = draw(st.sampled_from([t for t in tps if t in (1, 2)] or [1]))
        n = draw(st.integers(2, 4))
        return ModelShape(
            family,
            n,
            _kinds(draw, n, "gdn", "full"),
            num_kv_heads=tp,  # one KV head per rank (see module doc)
            head_dim=16,
            linear_key_heads=draw(st.sampled_from([1, 2])),
            linear_value_heads=4 if tp == 2 else draw(st.sampled_from([2, 4])),
            linear_head_dim=16,
            block_size=16,  # vLLM's page alignment replaces it (48 or 80 here)
            mamba_cache_mode=draw(st.sampled_from(["align", "none"])),  # "all": vLLM rejects it
        ), tp
    tp = draw(st.sampled_from(tps))
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([16, 32]))
    block = draw(st.sampled_from([16, 32]))
    if family == "llama":
        n = draw(st.integers(1, 3))
        return ModelShape(family, n, ("full",) * n, num_kv_heads=heads, head_dim=head_dim, block_size=block), tp
    n = draw(st.integers(2, 4))
    return ModelShape(
        family,
        n,
        _kinds(draw, n, "sliding", "full"),
        num_kv_heads=heads,
        head_dim=head_dim,
        block_size=block,
        sliding_window=draw(st.sampled_from([block, 2 * block, 3 * block, 100])),
    ), tp


SECOND = ("same", "one_less", "one_more", "extended", "prefix", "flipped")


@st.composite
def connector_cases(
    draw,
    block_size_of: Callable[[ModelShape], int],
    families: tuple[str, ...] = FAMILIES,
    tps: tuple[int, ...] = (1, 2, 4),
    min_chunks: int = 0,
    max_chunks: int = 24,
    chunk_multiples: tuple[int, ...] = (1, 3),
    resets: tuple[bool, ...] = (True, True, False),
    faults: tuple[str, ...] = (),
    device: str = "cpu",
    connector: str = "lmcache",
):
    """One run of the report's flow on one model (`block_size_of`: vLLM's scheduler block size for
    a shape, fixtures.drivers.vllm_model.resolved_block_size, passed in so that no strategy builds
    a vLLM config itself): request 1 of n chunks (+0/-1/+1 or
    any tail), then request 2 = the same prompt, one token less or more, extended by a
    chunk, a prefix of it, or it with one token changed in chunk k."""
    shape, tp = draw(model_shapes(families, tps))
    mult = draw(st.sampled_from(chunk_multiples))
    chunk = block_size_of(shape) * mult
    n = draw(st.integers(min_chunks, max_chunks))
    tail = draw(st.one_of(st.sampled_from([0, -1, 1]), st.integers(0, chunk - 1)))
    length = max(1, n * chunk + tail)
    seed = draw(st.integers(0, 3))
    first = PromptSpec(seed, length)
    kind = draw(st.sampled_from(SECOND))
    if kind == "same":
        second = first
    elif kind == "one_less":
        second = PromptSpec(seed, max(1, length - 1))
    elif kind == "one_more":
        second = PromptSpec(seed, length + 1)
    elif kind == "extended":
        second = PromptSpec(seed, length + chunk)
    elif kind == "prefix":
        second = PromptSpec(seed, draw(st.integers(1, length)))
    else:
        k = draw(st.integers(0, max(0, length - 1) // chunk))
        pos = min(length - 1, k * chunk + draw(st.one_of(st.sampled_from([0, chunk - 1]), st.integers(0, chunk - 1))))
        second = PromptSpec(seed, length, (pos,))
    return ConnectorCase(
        shape=shape,
        chunk_multiple=mult,
        separate_object_groups=draw(separate_object_groups()),
        tp=tp,
        first=first,
        second=second,
        reset_prefix_cache=draw(st.sampled_from(resets)),
        # GDN models: one chunk a step, so every chunk boundary is a step end (where vLLM
        # keeps a recurrent state): 0.5.6 restores no state for a hit that ends anywhere
        # else (tests/test_known_issues.py::test_a_gdn_hit_restores_the_state_vllm_resumes_from)
        max_num_batched_tokens=chunk if shape.is_hybrid else draw(st.sampled_from([2048, 256])),
        max_tokens=draw(st.sampled_from([1, 2])),
        faults=faults,
        device=device,
        connector=connector,
        # LMCache's own path as well as the route-arounds (shrinks toward the route-arounds)
        route_arounds=draw(st.sampled_from([True, False])),
    )


def separate_object_groups() -> st.SearchStrategy[bool]:
    """Both values where the build's server has `--separate-object-groups`
    (fixtures.compat.capabilities), else only False (LMCache 0.5.0 keeps one group)."""
    from fixtures.compat import capabilities as caps

    return st.booleans() if caps.has("separate_object_groups") else st.just(False)
