"""Fuzz target: LMCache's chunk hashing (v1/multiprocess/token_hasher.py).

    .venv/bin/python tests/fuzz/chunk_hash.py [libFuzzer flags] [corpus dirs | input files]

An input is a Case: a chunk size C, a prompt `a`, a second prompt `b` (a
prefix of `a` then other tokens, or `a` with one token changed), a start/end
for compute_chunk_hashes, and optionally some out-of-range tokens put into `a`.

Properties (all relational: nothing is compared with a hash this file computes):

* determinism: the same call twice, and on a second TokenHasher, gives the same list;
* shape: one 32-byte hash per *complete* chunk, len == len(a) // C;
* partial chunks are never hashed: appending < C tokens changes nothing;
* prefix consistency: the hashes of a[:(k+1)*C] are the first k+1 hashes of a;
* rolling: hash_tokens(chunk k, prefix=hash k-1) == hash k, and
  compute_chunk_hashes(a[k*C:], prefix_hash=hash k-1) == the hashes from k on;
* start/end: compute_chunk_hashes(a, start=s, end=e) == [hash k for complete
  chunks k with k*C >= s and (k+1)*C <= e] (the documented chunk range [s, e));
* keys: for every chunk k both prompts have, hash_a[k] == hash_b[k] exactly when
  a[:(k+1)*C] == b[:(k+1)*C] (equal prefixes share keys, different ones never do);
* range: LMCache packs tokens as big-endian uint32 (struct ">I"). A token outside
  [0, 2**32) or not an int, inside the hashed range, must raise a clean error
  (struct.error, ValueError or TypeError); returning hashes (a silent wraparound)
  is a finding. Out-of-range tokens past the hashed range are never looked at.
  (TokenHasher does raise struct.error. End to end that error surfaces inside the
  server's LOOKUP/STORE handler, which never answers: see tests/fuzz/README.md.)
"""

from __future__ import annotations

import pathlib
import struct
import sys
from dataclasses import dataclass, field
from functools import cache

if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.fuzz import _common

with _common.instrumented(__name__):
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

import numpy as np

MAX_TOKENS = 256
MAX_CHUNK = 32
U32 = 2**32
#: Values a token must never be silently hashed as (index into it from fuzz bytes).
ODD_TOKENS = (-1, U32, U32 + 7, 2**63 - 1, -(2**63), 2**64, -(2**31), 3.0, np.int64(-1), np.uint64(U32))
#: How a clean "this token cannot be hashed" looks. From 0.5.7 tokens are packed by
#: lmcache.v1.multiprocess.token_codec.pack_token_ids, whose documented rejection of a token
#: outside uint32 is OverflowError (0.5.6 and before: struct.error from struct.pack(">I")).
CLEAN_TOKEN_ERRORS = (struct.error, ValueError, TypeError, OverflowError)
HASH_LEN = 32  # blake3 digest


@dataclass(frozen=True)
class Case:
    chunk: int
    a: tuple
    b: tuple
    start: int | None = None
    end: int | None = None
    k: int = 0  #: the chunk the rolling/prefix checks resume at
    odd: tuple[tuple[int, int], ...] = field(default=())  #: (position in a, index into ODD_TOKENS)

    def tokens_a(self) -> list:
        a = list(self.a)
        for pos, which in self.odd:
            if 0 <= pos < len(a):
                a[pos] = ODD_TOKENS[which % len(ODD_TOKENS)]
        return a

    # -- fuzz bytes <-> Case ------------------------------------------------

    @classmethod
    def from_bytes(cls, data: bytes) -> Case:
        r = _common.Reader(data)
        chunk = 1 + r.u8() % MAX_CHUNK
        a = tuple(r.u32() for _ in range(r.u16() % (MAX_TOKENS + 1)))
        p = r.u16() % (len(a) + 1)
        if r.u8() & 1 and p < len(a):  # b = a with token p changed
            b = a[:p] + ((a[p] ^ (1 + r.u32() % (U32 - 1))),) + a[p + 1 :]
        else:  # b = a[:p] + other tokens
            b = a[:p] + tuple(r.u32() for _ in range(r.u8() % 64))
        flags = r.u8()
        start = r.i16() if flags & 1 else None
        end = r.i16() if flags & 2 else None
        k = r.u8()
        odd = tuple((r.u16() % (len(a) + 1), r.u8()) for _ in range((flags >> 2) % 4)) if flags & 0x80 else ()
        return cls(chunk, a, b, start, end, k, odd)

    def to_bytes(self) -> bytes:
        """Bytes that from_bytes reads back as this case (b is written as a[:p] + tail)."""
        w = _common.Writer().u8(self.chunk - 1).u16(len(self.a))
        for t in self.a:
            w.u32(t)
        p = 0
        while p < min(len(self.a), len(self.b)) and self.a[p] == self.b[p]:
            p += 1
        tail = self.b[p:]
        w.u16(p).u8(0).u8(len(tail))
        for t in tail:
            w.u32(t)
        flags = (1 if self.start is not None else 0) | (2 if self.end is not None else 0)
        if self.odd:
            flags |= 0x80 | (len(self.odd) << 2)
        w.u8(flags)
        if self.start is not None:
            w.i16(self.start)
        if self.end is not None:
            w.i16(self.end)
        w.u8(self.k)
        for pos, which in self.odd:
            w.u16(pos).u8(which)
        return w.bytes()


@cache
def hasher(chunk: int) -> TokenHasher:
    return TokenHasher(chunk_size=chunk)


def _fail(case: Case, what: str) -> None:
    raise _common.Finding(f"chunk hashing (C={case.chunk}, {len(case.a)} tokens): {what}")


def check(case: Case) -> None:
    """All chunk-hashing properties for one case (raises Finding)."""
    C = case.chunk
    h = hasher(C)
    a = case.tokens_a()
    hashed_len = (min(len(a), case.end) if case.end is not None else len(a)) // C * C
    hashed_len = max(hashed_len, 0)
    odd_in_range = [i for i in range(hashed_len) if not _is_u32(a[i])]
    if odd_in_range:
        got, err = _common.outcome(h.compute_chunk_hashes, a, start=case.start or 0, end=case.end)
        if err is None:
            _fail(
                case,
                f"token {a[odd_in_range[0]]!r} at {odd_in_range[0]} (outside uint32) was hashed "
                f"silently instead of raising: {len(got)} hashes returned",
            )
        if not isinstance(err, CLEAN_TOKEN_ERRORS):
            _fail(case, f"token {a[odd_in_range[0]]!r} raised {type(err).__name__}: {err} (not a clean error)")
        return
    # Out-of-range tokens can only sit past the hashed range here: they must be ignored.
    a_clean = [t if _is_u32(t) else 0 for t in a]

    full = h.compute_chunk_hashes(a_clean)
    if h.compute_chunk_hashes(list(a_clean)) != full or TokenHasher(chunk_size=C).compute_chunk_hashes(a_clean) != full:
        _fail(case, "not deterministic: a second call / a second TokenHasher gave other hashes")
    if len(full) != len(a) // C:
        _fail(case, f"{len(full)} hashes for {len(a)} tokens: expected one per complete chunk ({len(a) // C})")
    if any(not isinstance(x, bytes) or len(x) != HASH_LEN for x in full):
        _fail(case, f"hashes are not {HASH_LEN}-byte strings: {[type(x).__name__ for x in full][:4]}")
    if h.compute_chunk_hashes(a_clean + [7] * ((C - 1 - len(a) % C) % C)) != full:
        _fail(case, "tokens of a partial last chunk changed the hashes")
    n = len(full)
    if n:
        k = case.k % n
        if h.compute_chunk_hashes(a_clean[: (k + 1) * C]) != full[: k + 1]:
            _fail(case, f"not prefix-consistent: hashes of the first {k + 1} chunks alone differ")
        prev = full[k - 1] if k else None
        if h.hash_tokens(a_clean[k * C : (k + 1) * C], prev) != full[k]:
            _fail(case, f"hash_tokens(chunk {k}, prefix=hash {k - 1}) != compute_chunk_hashes()[{k}]")
        if h.compute_chunk_hashes(a_clean[k * C :], prefix_hash=prev) != full[k:]:
            _fail(case, f"resuming at chunk {k} with prefix_hash=hash {k - 1} gives other hashes")

    # The range call runs on `a` as given: any out-of-range token is past the hashed range.
    s, e = (case.start or 0), case.end
    want_idx = [i for i in range(n) if i * C >= s and (e is None or (i + 1) * C <= e)]
    got = h.compute_chunk_hashes(a, start=s, end=e)
    if got != [full[i] for i in want_idx]:
        _fail(
            case,
            f"start={case.start} end={case.end}: got {len(got)} hashes, expected those of chunks {want_idx}"
            + (" (out-of-range tokens sit past the hashed range)" if a != a_clean else ""),
        )

    # 0.5.7 on: the server hashes the packed tokens of IPCCacheServerKey.token_bytes with
    # compute_packed_chunk_hashes; it must give the token-list hashes, for ranges and resumes too
    packed_hashes = getattr(h, "compute_packed_chunk_hashes", None)
    if packed_hashes is not None:
        from lmcache.v1.multiprocess.token_codec import pack_token_ids

        if packed_hashes(pack_token_ids(a_clean), start=s, end=e) != [full[i] for i in want_idx]:
            _fail(
                case,
                f"compute_packed_chunk_hashes(start={case.start}, end={case.end}) != compute_chunk_hashes "
                f"of the same tokens",
            )
        if n and packed_hashes(pack_token_ids(a_clean[k * C :]), prefix_hash=prev) != full[k:]:
            _fail(case, f"compute_packed_chunk_hashes resuming at chunk {k} != compute_chunk_hashes")

    b = list(case.b)
    hb = h.compute_chunk_hashes(b)
    for i in range(min(n, len(hb))):
        same_prefix = a_clean[: (i + 1) * C] == b[: (i + 1) * C]
        if (full[i] == hb[i]) != same_prefix:
            first = next((j for j in range((i + 1) * C) if a_clean[j] != b[j]), None)
            _fail(
                case,
                f"chunk {i}: prefixes {'equal' if same_prefix else f'differ at token {first}'} but "
                f"hashes {'equal' if full[i] == hb[i] else 'differ'}",
            )


def _is_u32(t) -> bool:
    return type(t) in (int, np.int64, np.uint64, np.int32, np.uint32) and 0 <= int(t) < U32


def TestOneInput(data: bytes) -> None:
    check(Case.from_bytes(data))


# ---------------------------------------------------------------------------
# Hypothesis strategy (structured cases) and seeds
# ---------------------------------------------------------------------------


def cases():
    from hypothesis import strategies as st

    u32 = st.one_of(st.integers(0, 15), st.integers(0, U32 - 1), st.sampled_from([U32 - 1, 2**31]))

    @st.composite
    def build(draw):
        C = draw(st.one_of(st.sampled_from([1, 2, 4, 16]), st.integers(1, MAX_CHUNK)))
        a = tuple(draw(st.lists(u32, max_size=6 * C + 2)))
        kind = draw(st.sampled_from(["flip", "flip_edge", "prefix", "same"]))
        if kind.startswith("flip") and a:
            if kind == "flip_edge":  # the first or last token of some chunk
                k = draw(st.integers(0, max(0, len(a) - 1) // C))
                p = min(len(a) - 1, k * C + draw(st.sampled_from([0, C - 1])))
            else:
                p = draw(st.integers(0, len(a) - 1))
            b = a[:p] + ((a[p] + draw(st.integers(1, 5))) % U32,) + a[p + 1 :]
        elif kind == "prefix":
            p = draw(st.integers(0, len(a)))
            b = a[:p] + tuple(draw(st.lists(u32, max_size=2 * C + 1)))
        else:
            b = a
        bound = st.one_of(st.none(), st.integers(-C, len(a) + C), st.integers(0, len(a) // C + 1).map(lambda k: k * C))
        odd = draw(
            st.one_of(
                st.just(()),
                st.lists(
                    st.tuples(st.integers(0, max(len(a), 1)), st.integers(0, len(ODD_TOKENS) - 1)),
                    min_size=1,
                    max_size=2,
                ).map(tuple),
            )
        )
        return Case(C, a, b, draw(bound), draw(bound), draw(st.integers(0, 255)), odd)

    return build()


def seeds() -> dict[str, bytes]:
    """Named seed inputs for tests/fuzz/corpus/chunk_hash (written by tests/fuzz/seeds.py)."""
    a = tuple(range(100, 148))  # 3 chunks of 16
    return {
        "three_chunks_flip_last": Case(16, a, a[:15] + (9,) + a[16:]).to_bytes(),
        "three_chunks_prefix_plus_tail": Case(16, a + (1, 2, 3), a[:32] + (5,) * 20).to_bytes(),
        "start_end_aligned": Case(16, a, a, start=16, end=48).to_bytes(),
        "start_end_unaligned": Case(4, a[:30], a[:30], start=3, end=21, k=2).to_bytes(),
        "chunk1": Case(1, (0, 1, U32 - 1), (0, 1, U32 - 2)).to_bytes(),
        "odd_token_in_range": Case(4, a[:8], a[:8], odd=((2, 1),)).to_bytes(),
        "odd_token_in_tail": Case(4, a[:9], a[:9], odd=((8, 0),)).to_bytes(),
        "odd_token_past_end": Case(4, a[:12], a[:12], end=8, odd=((9, 7),)).to_bytes(),
        "empty": Case(16, (), ()).to_bytes(),
    }


def dictionary() -> list[bytes]:
    return [struct.pack(">I", v) for v in (0, 1, 15, 16, U32 - 1, 2**31)] + [b"\x80", b"\x81", b"\x83"]


if __name__ == "__main__":
    _common.main(TestOneInput)
