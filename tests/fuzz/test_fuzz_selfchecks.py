"""Proof that the fuzz properties can fail: each runs against LMCache with one bug patched in.

A mutant replaces one LMCache function (monkeypatch, this process only) with a
plausibly broken version; the target's structured Hypothesis strategy must then
produce a failing case. A property that passed here would be one that cannot
fail. (The server target's noop probe is shown to catch a dead request loop by
the two request-loop pins in test_fuzz_findings.py; its lookup check is shown
below with a legitimate state change let through.)
"""

from __future__ import annotations

import pytest

from fixtures.compat import capabilities as _caps

# the targets import LMCache modules that moved between releases: skip, in one line, where absent
_caps.require_module("fuzz:chunk_hash", "fuzz:key_codec", "fuzz:server_requests")
from hypothesis import HealthCheck, Phase, given, settings
from lmcache.v1.distributed.api import EncodedObjectKey, ObjectKey
from lmcache.v1.distributed.l2_adapters import fs_l2_adapter
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.token_hasher import TokenHasher

from fixtures.case.server import ServerOptions
from tests.fuzz import chunk_hash, key_codec, server_requests
from tests.fuzz._common import Finding

pytestmark = pytest.mark.fuzz

HUNT = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)

_hash_tokens = TokenHasher.hash_tokens
_compute = TokenHasher.compute_chunk_hashes


def _ignore_last_token(self, tokens, prefix_hash=None):
    return _hash_tokens(self, list(tokens)[:-1], prefix_hash)


def _wrap_to_uint32(self, tokens, prefix_hash=None):
    return _hash_tokens(self, [t & 0xFFFFFFFF if isinstance(t, int) else t for t in tokens], prefix_hash)


def _no_rolling_prefix(self, tokens, prefix_hash=None):
    return _hash_tokens(self, tokens, None)


def _hash_partial_chunk(self, token_ids, prefix_hash=None, start=0, end=None):
    out = _compute(self, token_ids, prefix_hash, start, end)
    n = min(len(token_ids), end) if end is not None else len(token_ids)
    if n > 0 and n % self.chunk_size:
        out.append(_hash_tokens(self, token_ids[n - n % self.chunk_size : n], out[-1] if out else None))
    return out


def _start_one_chunk_early(self, token_ids, prefix_hash=None, start=0, end=None):
    return _compute(self, token_ids, prefix_hash, max(0, start - self.chunk_size), end)


HASH_MUTANTS = {
    "ignore_last_token": ("hash_tokens", _ignore_last_token),
    "wrap_to_uint32": ("hash_tokens", _wrap_to_uint32),
    "no_rolling_prefix": ("hash_tokens", _no_rolling_prefix),
    "hash_partial_chunk": ("compute_chunk_hashes", _hash_partial_chunk),
    "start_one_chunk_early": ("compute_chunk_hashes", _start_one_chunk_early),
}


def _hunt(strategy, body) -> Finding:
    @HUNT
    @given(strategy)
    def run(x):
        body(x)

    with pytest.raises(Finding) as caught:
        run()
    return caught.value


@pytest.mark.parametrize("mutant", sorted(HASH_MUTANTS))
def test_chunk_hash_properties_catch(mutant, monkeypatch):
    attr, fn = HASH_MUTANTS[mutant]
    monkeypatch.setattr(TokenHasher, attr, fn)
    _hunt(chunk_hash.cases(), chunk_hash.check)


KEY_STRATEGIES = {name: (strategy, body) for name, strategy, body in key_codec.strategies()}


_fs_parse = fs_l2_adapter._filename_to_object_key


def _fs_parse_dropping_group(name):
    k = _fs_parse(name)
    return k and ObjectKey(k.chunk_hash, k.model_name, k.kv_rank, 0, k.cache_salt)


KEY_MUTANTS = {
    # the wire decoder stops validating cache_salt
    "salt_not_validated": ("ipc_struct", lambda mp: mp.setattr(IPCCacheServerKey, "__post_init__", lambda self: None)),
    # every worker of a group gets the same kv_rank
    "kv_rank_ignores_worker": (
        "ipc_struct",
        lambda mp: mp.setattr(
            ObjectKey,
            "ComputeKVRank",
            staticmethod(
                lambda world_size, global_rank, local_world_size, local_rank: (
                    (world_size << 24) | (local_world_size << 8)
                )
            ),
        ),
    ),
    # EncodedObjectKey loses the salt
    "encoded_key_drops_salt": (
        "objkey_struct",
        lambda mp: mp.setattr(
            EncodedObjectKey,
            "to_object_key",
            lambda self: ObjectKey(
                bytes.fromhex(self.chunk_hash_hex), self.model_name, self.kv_rank, self.object_group_id
            ),
        ),
    ),
    # the fs filename parser forgets the object group
    "fs_parse_drops_group": (
        "objkey_struct",
        lambda mp: mp.setattr(fs_l2_adapter, "_filename_to_object_key", _fs_parse_dropping_group),
    ),
}


@pytest.mark.parametrize("mutant", sorted(KEY_MUTANTS))
def test_key_codec_properties_catch(mutant, monkeypatch):
    name, patch = KEY_MUTANTS[mutant]
    strategy, body = KEY_STRATEGIES[name]
    patch(monkeypatch)
    _hunt(strategy, body)


def test_server_lookup_check_catches_a_state_change(harness, monkeypatch, tmp_path):
    """Let one well-formed `clear` through: the next periodic check must see the stored
    prompt gone, and keep the inputs since the last passing check for a replay."""
    server = server_requests.suite_server(harness, ServerOptions(chunk_size=server_requests.CHUNK))
    session = server_requests.Session(server, harness.ranks, check_every=2, window_dir=str(tmp_path)).open()
    try:
        monkeypatch.setattr(server_requests, "READ_ONLY", server_requests.READ_ONLY | {"clear"})
        session.one_input(server_requests.input_of(server_requests._request("clear", True)))
        with pytest.raises(Finding, match="the stored prompt now hits 0 tokens") as caught:
            session.one_input(server_requests.seeds()["noop"])  # the 2nd input: the periodic check
    finally:
        session.close()
    (window,) = tmp_path.iterdir()
    assert sorted(p.name for p in window.iterdir()) == ["00000", "00001"]
    assert f"tests/fuzz/server_requests.py {window}/*" in str(caught.value)
