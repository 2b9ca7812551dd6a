"""Generated cases for the real-engine tier (fixtures.drivers.engine_flow.EngineCase).

Prompt lengths are weighted to exact chunk multiples and +/-1 token; a batch is
1-3 prompts from one shared-prefix family (the same prompt again, a prefix of
it, it extended, or its first k chunks with a new tail); the scheduler's step
(max_num_batched_tokens) is the engine's largest, a chunk multiple, or a size
that does not end on chunk boundaries; settle timing `settled` or `immediate`.
Token ids are drawn from a seeded RNG so a shrunk case is short to print; the
repro stores the ids themselves.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from fixtures.case.engine import EngineCase, EngineOptions

VOCAB = (3, 500)


def lengths(chunk: int, max_chunks: int, min_len: int = 2) -> st.SearchStrategy[int]:
    """Lengths in [min_len, max_chunks x chunk + 1], weighted to exact chunk multiples and +/-1."""
    k = st.integers(max(1, -(-(min_len + 1) // chunk)), max_chunks)
    exact = k.map(lambda n: n * chunk)
    off = st.tuples(k, st.sampled_from((-1, 1))).map(lambda t: t[0] * chunk + t[1])
    anyl = st.integers(max(2, min_len), max_chunks * chunk + 1)
    return st.one_of(exact, off, anyl)


@st.composite
def engine_cases(
    draw,
    engines: tuple[EngineOptions, ...],
    *,
    max_chunks: int = 4,
    max_batch: int = 3,
    steps: bool = True,
    min_len: int = 2,
) -> EngineCase:
    """min_len: the first prompt's least length (the sliding-window property: longer than the window)."""
    eng = draw(st.sampled_from(engines))
    # LMCache's own path, where the engine routes around a known issue (shrinks to the patched one)
    route_arounds = draw(st.sampled_from([True, False])) if eng.route_arounds else True
    if not route_arounds:
        eng = eng.own_path()
    c = eng.chunk
    block = eng.block_size or c
    n0 = draw(lengths(c, max_chunks, min_len))
    seed = draw(st.integers(0, 2**16))
    rng = random.Random(seed)
    base = [rng.randrange(*VOCAB) for _ in range(max_chunks * c + 2)]
    prompts, about = [tuple(base[:n0])], [f"{n0 // c}C{n0 % c - c if n0 % c > c // 2 else n0 % c:+d}"]
    for _ in range(draw(st.integers(0, max_batch - 1))):
        kind = draw(st.sampled_from(("same", "prefix", "extend", "new_tail")))
        if kind == "same":
            prompts.append(prompts[0])
            about.append("same as #0")
        elif kind == "prefix":
            n = draw(st.integers(1, max(1, n0 - 1)))
            prompts.append(tuple(base[:n]))
            about.append(f"prefix of #0 ({n})")
        elif kind == "extend":
            n = draw(st.integers(n0 + 1, max_chunks * c + 2))
            prompts.append(tuple(base[:n]))
            about.append(f"#0 extended to {n}")
        else:
            k = draw(st.integers(0, max(0, n0 // c)))
            tail = draw(st.integers(1, c + 1))
            prompts.append(tuple(base[: k * c]) + tuple(rng.randrange(*VOCAB) for _ in range(tail)))
            about.append(f"first {k} chunks of #0 + {tail} new")
    step = None
    if steps:
        step = draw(
            st.one_of(
                st.none(), st.sampled_from((c, 2 * c)), st.sampled_from((block, c + block, c + 1, 3 * c // 2 + 1))
            )
        )
    settle = draw(st.sampled_from(("settled", "immediate")))
    return EngineCase(
        eng, tuple(prompts), step=step, settle=settle, max_tokens=4, about=tuple(about), route_arounds=route_arounds
    )
