"""Fuzz target: cache keys through every codec the MP server uses.

    .venv/bin/python tests/fuzz/key_codec.py [libFuzzer flags] [corpus dirs | input files]

The first input byte picks a mode; the rest is read by that mode:

0 `ipc_bytes`     raw bytes -> IPCCacheServerKey through the ZMQ transport's payload
                  decoder (mq.msgspec_decode, what the server runs on a payload frame)
                  and get_customized_decoder(IPCCacheServerKey);
1 `objkey_bytes`  raw bytes -> list[ObjectKey] through the transport (p2p payloads);
2 `key_strings`   a string -> every ObjectKey string form the server parses: the fs L2
                  filename, the S3 object name, the raw-block key, EncodedObjectKey's hex;
3 `ipc_struct`    a generated IPCCacheServerKey (and a variant of it, one field changed);
4 `objkey_struct` a generated ObjectKey.

Properties:

* round trips are exact: IPCCacheServerKey through msgspec_encode/msgspec_decode and the
  customized encoder/decoder pair (every field, request_id and request_configs included);
  ObjectKey through EncodedObjectKey, the fs filename, the S3 name, the raw-block key and
  both msgspec paths;
* malformed input is rejected cleanly (_common.CLEAN: the ValueError family, which
  includes msgspec.DecodeError/ValidationError, or TypeError; the fs parser returns None
  as documented) and never with anything else; a decoder that accepts must produce a
  key whose invariants hold (cache_salt without @ / \\ NUL and <= 128 chars, model_name
  without @ for ObjectKey, object_group_id >= 0, field types as declared) and that
  re-encodes to the same bytes;
* validation at the wire equals validation in Python: a field set IPCCacheServerKey(...)
  rejects is rejected by the decoder, one it accepts is decoded to an equal key;
* key identity: IPC keys compare equal exactly when model, world size, worker, tokens,
  start, end and cache_salt are equal (request_id, request_configs, num_kv_readers are
  not identity); ipc_key_to_object_keys gives equal ObjectKeys for equal identities
  (model, world size, worker, salt) and disjoint ones otherwise; a lookup key (worker
  None) expands to exactly the union of its workers' keys, with no duplicates.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys

if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.fuzz import _common

with _common.instrumented(__name__):
    from lmcache.v1.distributed.api import (
        EncodedObjectKey,
        ObjectKey,
        ipc_key_to_object_keys,
    )
    from lmcache.v1.distributed.l2_adapters import fs_l2_adapter, s3_l2_adapter
    from lmcache.v1.multiprocess.custom_types import (
        IPCCacheServerKey,
        get_customized_decoder,
        get_customized_encoder,
    )
    from lmcache.v1.multiprocess.transport.zmq_impl.mq import (
        msgspec_decode,
        msgspec_encode,
    )

    try:  # the raw-block key codec moved under the L2 adapters in 0.5.7
        from lmcache.v1.distributed.l2_adapters.raw_block import key_codec as raw_block
    except ImportError:
        from lmcache.v1.storage_backend.raw_block import key_codec as raw_block

import msgspec

Finding = _common.Finding
SALT_FORBIDDEN = frozenset("@/\\\x00")
SALT_MAX = 128
FS_SEP = fs_l2_adapter._PATH_SLASH_REPLACEMENT  # "-SEP-"
IPC_FIELDS = [f.name for f in dataclasses.fields(IPCCacheServerKey)]
IPC_IDENTITY = [f.name for f in dataclasses.fields(IPCCacheServerKey) if f.compare]
OBJ_IDENTITY = ("model_name", "world_size", "worker_id", "cache_salt")
#: The key's token field: a tuple of ints `token_ids` (to 0.5.6) or `token_bytes`, big-endian
#: uint32 words packed by lmcache.v1.multiprocess.token_codec (0.5.7 on; a length that is not
#: a multiple of 4 must be rejected with ValueError).
TOKENS = "token_bytes" if "token_bytes" in IPC_FIELDS else "token_ids"


def tokens(ids, stray: bytes = b""):
    """Token ids as this build's key holds them; `stray`: bytes after the packed words (only the
    packed form can carry them: a malformed key)."""
    if TOKENS == "token_ids":
        return tuple(ids)
    return b"".join(int(t).to_bytes(4, "big") for t in ids) + stray


def more_tokens(value, t: int = 7):
    """The same tokens with one more after them."""
    return value + ((t,) if TOKENS == "token_ids" else int(t).to_bytes(4, "big"))


def _tokens_ok(value) -> bool:
    return TOKENS == "token_ids" or len(value) % 4 == 0


_ipc_enc, _ipc_dec = get_customized_encoder(IPCCacheServerKey), get_customized_decoder(IPCCacheServerKey)
_obj_enc, _obj_dec = get_customized_encoder(ObjectKey), get_customized_decoder(ObjectKey)
_raw_enc = msgspec.msgpack.Encoder()


def _fields(k) -> dict:
    return {f.name: getattr(k, f.name) for f in dataclasses.fields(k)}


# ---------------------------------------------------------------------------
# Generated keys (from fuzz bytes)
# ---------------------------------------------------------------------------


def _json_value(r: _common.Reader, depth: int = 0):
    """A small msgpack-able value for request_configs (lists, never tuples: msgpack has no tuple)."""
    kind = r.u8() % (8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return bool(r.u8() & 1)
    if kind == 2:
        return r.i64()
    if kind == 3:
        x = msgspec.msgpack.decode(b"\xcb" + r._take(8))  # any float64 bit pattern
        return x if math.isfinite(x) else 0.5
    if kind == 4:
        return r.text(16)
    if kind == 5:
        return r.blob(8)
    if kind == 6:
        return [_json_value(r, depth + 1) for _ in range(r.u8() % 4)]
    return {r.text(8): _json_value(r, depth + 1) for _ in range(r.u8() % 4)}


def ipc_fields(r: _common.Reader) -> dict:
    """IPCCacheServerKey fields: valid-looking with some invalid salts, big world sizes, odd tokens."""
    flags = r.u8()
    ws = 1 + (r.u16() % 600 if flags & 1 else r.u8() % 8)
    worker = None if flags & 2 else r.u16() % ws
    salt = r.text(140)
    if not flags & 4:  # mostly valid salts; flags&4 keeps what the fuzzer wrote
        salt = "".join(c for c in salt if c not in SALT_FORBIDDEN)[:SALT_MAX]
    return dict(
        model_name=r.text(40),
        world_size=ws,
        worker_id=worker,
        **{
            TOKENS: (
                tuple((r.i64() if flags & 8 else r.u32()) for _ in range(r.u8() % 40))
                if TOKENS == "token_ids"
                else tokens([r.u32() for _ in range(r.u8() % 40)], r.blob(3) if flags & 8 else b"")
            )
        },
        start=r.i16(),
        end=r.i16(),
        request_id=r.text(24),
        cache_salt=salt,
        request_configs=({r.text(8): _json_value(r) for _ in range(r.u8() % 4)} if flags & 16 else None),
        num_kv_readers=r.u8(),
    )


def variant(fields: dict, r: _common.Reader) -> dict:
    """The same fields with one changed (which, and how, from the fuzz bytes)."""
    v = dict(fields)
    which = r.u8() % 9
    if which == 0:
        v["model_name"] = v["model_name"] + r.text(4) + "x"
    elif which == 1:
        v["world_size"] = 1 + (v["world_size"] + r.u16()) % 600
        if v["worker_id"] is not None:
            v["worker_id"] %= v["world_size"]
    elif which == 2:
        v["worker_id"] = None if v["worker_id"] is not None else r.u16() % v["world_size"]
    elif which == 3 and v["worker_id"] is not None and v["world_size"] > 1:
        v["worker_id"] = (v["worker_id"] + 1 + r.u16() % (v["world_size"] - 1)) % v["world_size"]
    elif which == 4:
        v["cache_salt"] = (v["cache_salt"] + "s")[-SALT_MAX:] if v["cache_salt"] != "s" else ""
    elif which == 5:
        v["request_id"] = v["request_id"] + "r"
    elif which == 6:
        v["request_configs"] = {"k": r.u8()}
    elif which == 7:
        v[TOKENS] = more_tokens(v[TOKENS], r.u32())
    else:
        v["num_kv_readers"] = (v["num_kv_readers"] + 1) % 256
    return v


def objkey_fields(r: _common.Reader) -> dict:
    flags = r.u8()
    model = r.text(48)
    salt = r.text(140)
    if not flags & 1:  # mostly valid keys; flags&1 keeps what the fuzzer wrote
        model = model.replace("@", "_")
        salt = "".join(c for c in salt if c not in SALT_FORBIDDEN)[:SALT_MAX]
    if flags & 2:  # a model name with the path separators the fs filename rewrites
        model = model[:8] + ("/" if flags & 4 else FS_SEP) + model[8:]
    return dict(
        chunk_hash=r.blob(40),
        model_name=model,
        kv_rank=r.i64(),
        object_group_id=(r.i16() if flags & 8 else r.u8()),
        cache_salt=salt,
    )


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------


def _unclean(where: str, err: Exception) -> None:
    """An exception that is not a clean rejection: a known finding or a new one."""
    if isinstance(err, RecursionError):
        _common.known("deep_nesting_recursion", f"{where}: RecursionError")
        return
    raise Finding(f"{where}: raised {type(err).__name__}: {err} (not a clean rejection)")


def _check_ipc_invariants(k, where: str) -> None:
    f = _fields(k)
    types = dict(model_name=str, world_size=int, start=int, end=int, request_id=str, cache_salt=str, num_kv_readers=int)
    for name, t in types.items():
        if type(f[name]) is not t:
            raise Finding(f"{where}: accepted {name}={f[name]!r} ({type(f[name]).__name__}, declared {t.__name__})")
    if f["worker_id"] is not None and type(f["worker_id"]) is not int:
        raise Finding(f"{where}: accepted worker_id={f['worker_id']!r}")
    if TOKENS == "token_bytes":
        if type(f[TOKENS]) is not bytes or len(f[TOKENS]) % 4:
            raise Finding(
                f"{where}: accepted token_bytes {f[TOKENS][:12]!r} of type {type(f[TOKENS]).__name__}, "
                f"length {len(f[TOKENS])}"
            )
    elif type(f["token_ids"]) is not tuple or any(type(t) is not int for t in f["token_ids"]):
        raise Finding(
            f"{where}: accepted token_ids of type {type(f['token_ids']).__name__} "
            f"{[type(t).__name__ for t in f['token_ids']][:3]}"
        )
    if f["request_configs"] is not None and type(f["request_configs"]) is not dict:
        raise Finding(f"{where}: accepted request_configs={f['request_configs']!r}")
    _check_salt(f["cache_salt"], where)


def _check_salt(salt: str, where: str) -> None:
    bad = SALT_FORBIDDEN & set(salt)
    if bad or len(salt) > SALT_MAX:
        raise Finding(
            f"{where}: accepted an invalid cache_salt {salt[:40]!r} (len {len(salt)}, forbidden {bad or '-'})"
        )


def _check_objkey_invariants(k, where: str) -> None:
    if type(k) is not ObjectKey:
        raise Finding(f"{where}: returned {type(k).__name__}, not ObjectKey")
    if (
        type(k.chunk_hash) is not bytes
        or type(k.model_name) is not str
        or type(k.kv_rank) is not int
        or type(k.object_group_id) is not int
        or type(k.cache_salt) is not str
    ):
        raise Finding(f"{where}: accepted a key with wrong field types: {k!r}")
    if "@" in k.model_name or k.object_group_id < 0:
        raise Finding(f"{where}: accepted an invalid key: {k!r}")
    _check_salt(k.cache_salt, where)


#: The two codec pairs an IPCCacheServerKey goes through: the ZMQ transport's payload
#: codec (the server decodes every IPCCacheServerKey frame with it) and the customized pair.
IPC_CODECS = (
    (
        "transport msgspec_encode/msgspec_decode",
        lambda k: msgspec_encode(k, IPCCacheServerKey),
        lambda b: msgspec_decode(b, IPCCacheServerKey),
    ),
    ("get_customized_encoder/decoder", _ipc_enc.encode, _ipc_dec.decode),
)


def check_ipc_bytes(data: bytes) -> None:
    """Arbitrary bytes as an IPCCacheServerKey payload frame, through both codecs."""
    for name, enc, dec in IPC_CODECS:
        k, err = _common.outcome(dec, data)
        if err is not None:
            if not isinstance(err, _common.CLEAN):
                _unclean(f"IPCCacheServerKey {name}", err)
            continue
        _check_ipc_invariants(k, f"IPCCacheServerKey {name}")
        again = enc(k)
        k2 = dec(again)
        if enc(k2) != again or _fields(k2).keys() != _fields(k).keys() or k2 != k:
            raise Finding(f"IPCCacheServerKey {name}: an accepted key does not survive re-encoding: {k!r} -> {k2!r}")


def check_objkey_bytes(data: bytes) -> None:
    keys, err = _common.outcome(msgspec_decode, data, list[ObjectKey])
    if err is not None:
        if not isinstance(err, _common.CLEAN):
            _unclean("list[ObjectKey] msgspec_decode", err)
        return
    for k in keys:
        _check_objkey_invariants(k, "list[ObjectKey] msgspec_decode")
    again = msgspec_encode(keys, list[ObjectKey])
    if msgspec_decode(again, list[ObjectKey]) != keys:
        raise Finding(f"list[ObjectKey]: accepted keys do not survive re-encoding: {keys!r}")


#: The string forms: (name, format, parse, how parse rejects).
def _fs_parse(s: str):
    return fs_l2_adapter._filename_to_object_key(s)


STRING_FORMS = (
    ("fs filename", fs_l2_adapter._object_key_to_filename, _fs_parse),
    ("S3 object name", s3_l2_adapter._object_key_to_string, s3_l2_adapter._string_to_object_key),
    ("raw-block key", raw_block.object_key_to_string, raw_block.decode_object_key),
)


def check_key_strings(s: str) -> None:
    for name, fmt, parse in STRING_FORMS:
        for text in (s, s + ".data") if name == "fs filename" else (s,):
            k, err = _common.outcome(parse, text)
            if err is not None:
                if name == "fs filename":  # documented: None for anything unparsable
                    raise Finding(
                        f"{name} parser raised {type(err).__name__} on {text!r}: {err} (documented: returns None)"
                    )
                if not isinstance(err, _common.CLEAN):
                    _unclean(f"{name} parser on {text!r}", err)
                continue
            if k is None:
                if name != "fs filename":
                    raise Finding(f"{name} parser returned None for {text!r}")
                continue
            _check_objkey_invariants(k, f"{name} parser on {text!r}")
            back, err = _common.outcome(parse, fmt(k))
            if back != k:
                raise Finding(
                    f"{name}: {text!r} parses to {k!r}, whose own name {fmt(k)!r} parses to "
                    f"{back!r}{f' ({type(err).__name__}: {err})' if err else ''}"
                )
    k, err = _common.outcome(lambda: EncodedObjectKey(s, "m", 0).to_object_key())
    if err is not None and not isinstance(err, _common.CLEAN):
        _unclean(f"EncodedObjectKey.to_object_key on hex {s!r}", err)
    if k is not None and EncodedObjectKey(k.chunk_hash.hex(), "m", 0).to_object_key() != k:
        raise Finding(f"EncodedObjectKey hex {s!r}: its key does not survive to_encoded_object_key again")


def _fs_substitution(k):
    """What the fs filename's '/' <-> '-SEP-' substitution (not an escape) turns key k into."""
    return dataclasses.replace(k, model_name=k.model_name.replace("/", FS_SEP).replace(FS_SEP, "/"))


def check_objkey_struct(fields: dict) -> None:
    k, err = _common.outcome(ObjectKey, **fields)
    violates = (
        "@" in fields["model_name"]
        or fields["object_group_id"] < 0
        or bool(SALT_FORBIDDEN & set(fields["cache_salt"]))
        or len(fields["cache_salt"]) > SALT_MAX
    )
    if err is not None:
        if not isinstance(err, ValueError) or not violates:
            raise Finding(f"ObjectKey({fields}) raised {type(err).__name__}: {err}")
        return
    if violates:
        raise Finding(f"ObjectKey accepted invalid fields {fields}")
    round_trips = [
        ("EncodedObjectKey", lambda: k.to_encoded_object_key().to_object_key()),
        ("customized encoder/decoder", lambda: _obj_dec.decode(_obj_enc.encode(k))),
        ("transport list[ObjectKey]", lambda: msgspec_decode(msgspec_encode([k], list[ObjectKey]), list[ObjectKey])[0]),
    ] + [(name, lambda fmt=fmt, parse=parse: parse(fmt(k))) for name, fmt, parse in STRING_FORMS]
    for name, rt in round_trips:
        back, err = _common.outcome(rt)
        if back != k:
            detail = f"{k!r} -> {back!r}" + (f" ({type(err).__name__}: {err})" if err else "")
            if name == "fs filename" and err is None and back == _fs_substitution(k):
                _common.known("fs_model_name_sep", detail)
                continue
            raise Finding(f"ObjectKey round trip through the {name} is not exact: {detail}")


def check_ipc_struct(fields: dict, other: dict, chunk_hashes: list[bytes]) -> None:
    chunk_hashes = list(dict.fromkeys(chunk_hashes))  # distinct chunks (as a prompt's rolling hashes are)
    made = []
    for f in (fields, other):
        k, err = _common.outcome(IPCCacheServerKey, **f)
        salt_ok = not (SALT_FORBIDDEN & set(f["cache_salt"])) and len(f["cache_salt"]) <= SALT_MAX
        if (err is None) != (salt_ok and _tokens_ok(f[TOKENS])) or (
            err is not None and not isinstance(err, ValueError)
        ):
            raise Finding(
                f"IPCCacheServerKey(cache_salt={f['cache_salt'][:40]!r}, {TOKENS} of "
                f"{len(f[TOKENS])}) {'accepted' if err is None else f'raised {type(err).__name__}'}"
            )
        # The same fields as a wire map: the decoder must agree with the constructor.
        wire = _raw_enc.encode({n: v for n, v in f.items()})
        dk, derr = _common.outcome(msgspec_decode, wire, IPCCacheServerKey)
        if derr is not None and not isinstance(derr, _common.CLEAN):
            _unclean("IPCCacheServerKey msgspec_decode of a generated map", derr)
            return
        if (dk is None) != (k is None):
            raise Finding(
                f"constructor {'accepts' if k else 'rejects'} but the wire decoder "
                f"{'accepts' if dk else f'rejects ({derr})'} fields {f}"
            )
        if k is None:
            return
        for name, enc, dec in IPC_CODECS:
            back = dec(enc(k))
            if _fields(back) != _fields(k):
                diff = {n: (v, _fields(back)[n]) for n, v in _fields(k).items() if _fields(back)[n] != v}
                raise Finding(f"IPCCacheServerKey round trip through the {name} is not exact: {diff}")
        if _fields(dk) != _fields(k):
            raise Finding(f"decoding the wire map of {f} gave {dk!r}")
        made.append(k)
    k1, k2 = made
    same_identity = all(fields[n] == other[n] for n in IPC_IDENTITY)
    if (k1 == k2) != same_identity or (same_identity and hash(k1) != hash(k2)):
        raise Finding(
            f"IPC key equality: identity fields {'equal' if same_identity else 'differ'} but keys "
            f"compare {'equal' if k1 == k2 else 'unequal'}: {k1!r} vs {k2!r}"
        )

    if any("@" in f["model_name"] for f in (fields, other)):
        # IPCCacheServerKey does not check model_name; ObjectKey rejects '@' (ValueError),
        # so the server refuses such a key when it converts it (inside the handler).
        for k in (k1, k2):
            if "@" in k.model_name:
                _, err = _common.outcome(ipc_key_to_object_keys, k, chunk_hashes or [b"h"], [0])
                if not isinstance(err, ValueError):
                    raise Finding(
                        f"model_name {k.model_name!r} with '@' was turned into ObjectKeys "
                        f"({'no error' if err is None else type(err).__name__})"
                    )
        return
    big = any(f["world_size"] > 255 for f in (fields, other))
    o1, o2 = (ipc_key_to_object_keys(k, chunk_hashes, [0])[0] for k in (k1, k2))
    same_group = all(fields[n] == other[n] for n in ("model_name", "world_size", "cache_salt"))
    w1, w2 = fields["worker_id"], other["worker_id"]
    if same_group and w1 == w2:
        if o1 != o2:
            raise Finding(f"equal (model, world size, worker, salt) but different ObjectKeys: {o1[:1]} vs {o2[:1]}")
    elif same_group and (w1 is None or w2 is None):
        lookup, worker = (o1, o2) if w1 is None else (o2, o1)
        if not set(worker) <= set(lookup):
            raise Finding(f"a worker's ObjectKeys are not among its lookup key's: {worker[:1]} vs {lookup[:2]}")
    elif set(o1) & set(o2):  # another group, or another worker of the same group
        shared = sorted(set(o1) & set(o2), key=repr)[0]
        detail = f"{[fields[n] for n in OBJ_IDENTITY]} vs {[other[n] for n in OBJ_IDENTITY]} share {shared!r}"
        if big:
            _common.known("kv_rank_aliasing", detail)
        else:
            raise Finding(f"different IPC key identities map to the same ObjectKey: {detail}")
    lk = k1.no_worker_id_version()
    expanded = ipc_key_to_object_keys(lk, chunk_hashes, [0])[0]
    union = [
        o
        for w in range(lk.world_size)
        for o in ipc_key_to_object_keys(dataclasses.replace(lk, worker_id=w), chunk_hashes, [0])[0]
    ]
    if sorted(expanded, key=repr) != sorted(union, key=repr) or len(set(expanded)) != len(expanded):
        detail = (
            f"world_size={lk.world_size}: lookup expands to {len(expanded)} keys, "
            f"{len(set(expanded))} distinct; the workers' keys: {len(union)}"
        )
        if lk.world_size > 255:
            _common.known("kv_rank_aliasing", detail)
        else:
            raise Finding(f"lookup key expansion != the union of its workers' keys: {detail}")


MODES = ("ipc_bytes", "objkey_bytes", "key_strings", "ipc_struct", "objkey_struct")


def TestOneInput(data: bytes) -> None:
    r = _common.Reader(data)
    mode = MODES[r.u8() % len(MODES)]
    if mode == "ipc_bytes":
        check_ipc_bytes(r.rest())
    elif mode == "objkey_bytes":
        check_objkey_bytes(r.rest())
    elif mode == "key_strings":
        check_key_strings(r.rest().decode("utf-8", "replace"))
    elif mode == "ipc_struct":
        f = ipc_fields(r)
        hashes = [r.blob(32) or b"\x00" for _ in range(1 + r.u8() % 3)]
        check_ipc_struct(f, variant(f, r), hashes)
    else:
        check_objkey_struct(objkey_fields(r))


# ---------------------------------------------------------------------------
# Hypothesis strategies, seeds, dictionary
# ---------------------------------------------------------------------------


def strategies():
    """Structured Hypothesis inputs: (name, strategy, body)."""
    from hypothesis import strategies as st

    salt_ok = st.text(st.characters(blacklist_characters="@/\\\x00"), max_size=12)
    salt_any = st.one_of(salt_ok, st.sampled_from(["a@b", "x/y", "\\", "\x00", "s" * 129]))
    json_leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.binary(max_size=8),
    )
    json = st.recursive(
        json_leaf,
        lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=4), c, max_size=3)),
        max_leaves=6,
    )

    @st.composite
    def ipc(draw):
        ws = draw(st.one_of(st.integers(1, 8), st.integers(1, 600)))
        f = dict(
            model_name=draw(st.text(max_size=12)),
            world_size=ws,
            worker_id=draw(st.one_of(st.none(), st.integers(0, ws - 1))),
            **{TOKENS: tokens(draw(st.lists(st.integers(0, 2**32 - 1), max_size=20)))},
            start=draw(st.integers(-16, 64)),
            end=draw(st.integers(-16, 64)),
            request_id=draw(st.text(max_size=8)),
            cache_salt=draw(salt_any),
            request_configs=draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=6), json, max_size=3))),
            num_kv_readers=draw(st.integers(0, 8)),
        )
        other = dict(f)
        field = draw(st.sampled_from(IPC_FIELDS))
        if field == "world_size":
            other["world_size"] = draw(st.integers(1, 600))
            if other["worker_id"] is not None:
                other["worker_id"] %= other["world_size"]
        elif field == "worker_id":
            other["worker_id"] = draw(st.one_of(st.none(), st.integers(0, ws - 1)))
        elif field == "cache_salt":
            other["cache_salt"] = draw(salt_ok)
        elif field == TOKENS:
            other[TOKENS] = more_tokens(f[TOKENS])
        elif field in ("start", "end", "num_kv_readers"):
            other[field] = f[field] + 1
        elif field == "request_configs":
            other[field] = {"x": 1}
        else:
            other[field] = f[field] + "_"
        hashes = draw(st.lists(st.binary(min_size=1, max_size=32), min_size=1, max_size=3))
        return f, other, hashes

    objkey = st.fixed_dictionaries(
        dict(
            chunk_hash=st.binary(max_size=32),
            model_name=st.one_of(st.text(max_size=16), st.sampled_from(["org/model", f"org{FS_SEP}model", "a@b"])),
            kv_rank=st.integers(-(2**63), 2**63 - 1),
            object_group_id=st.integers(-2, 300),
            cache_salt=salt_any,
        )
    )
    return [
        ("ipc_struct", ipc(), lambda x: check_ipc_struct(*x)),
        ("objkey_struct", objkey, check_objkey_struct),
        (
            "key_strings",
            st.one_of(
                st.text(max_size=40),
                st.builds(lambda *p: "@".join(p), *[st.text("0123456789abcdefxX-@/ _", max_size=10)] * 4),
            ),
            check_key_strings,
        ),
    ]


def seeds() -> dict[str, bytes]:
    """Named seed inputs for tests/fuzz/corpus/key_codec (written by tests/fuzz/seeds.py)."""
    key = IPCCacheServerKey.from_token_ids(
        "Qwen/Qwen3-8B",
        2,
        1,
        list(range(32)),
        0,
        32,
        "req-1",
        "tenant",
        request_configs={"lmcache.tag": "x", "n": [1, 2.5, None]},
    )
    okey = ObjectKey(bytes(range(32)), "Qwen/Qwen3-8B", ObjectKey.ComputeKVRank(2, 1, 2, 1), 1, "tenant")
    w = _common.Writer
    ipc_struct = (
        w()
        .u8(MODES.index("ipc_struct"))
        .u8(16)
        .u8(1)
        .u16(0)
        .text("salt")
        .text("org/model")
        .u8(3)
        .u32(1)
        .u32(2)
        .u32(3)
        .i16(0)
        .i16(16)
        .text("req")
        .u8(1)
        .text("k")
        .u8(4)
        .text("v")
        .u8(1)
        .u8(1)
        .blob(bytes(32))
        .u8(3)
        .bytes()
    )
    return {
        "ipc_key_msgpack": bytes([0]) + msgspec_encode(key, IPCCacheServerKey),
        "ipc_key_lookup_msgpack": bytes([0]) + msgspec_encode(key.no_worker_id_version(), IPCCacheServerKey),
        "objkey_list_msgpack": bytes([1]) + msgspec_encode([okey, okey], list[ObjectKey]),
        "fs_filename": bytes([2]) + fs_l2_adapter._object_key_to_filename(okey).encode(),
        "s3_name": bytes([2]) + s3_l2_adapter._object_key_to_string(okey).encode(),
        "raw_block_key": bytes([2]) + raw_block.object_key_to_string(okey).encode(),
        "ipc_struct": ipc_struct,
        "objkey_struct": w()
        .u8(MODES.index("objkey_struct"))
        .u8(2)
        .text("org/model")
        .text("t")
        .blob(b"\x01\x02")
        .i64(16908545)
        .u8(0)
        .bytes(),
        # found by this target: '/' next to '-SEP-' does not survive the fs filename
        "objkey_fs_sep_slash": w()
        .u8(MODES.index("objkey_struct"))
        .u8(0)
        .text("a-SEP/-b")
        .text("")
        .blob(b"")
        .i64(0)
        .u8(0)
        .bytes(),
    }


def dictionary() -> list[bytes]:
    words = [f.encode() for f in IPC_FIELDS] + [
        b"chunk_hash",
        b"model_name",
        b"kv_rank",
        b"object_group_id",
        b"@",
        b"/",
        b"\\",
        b"\x00",
        FS_SEP.encode(),
        b".data",
        b"0x",
        b"%2F",
        b"%40",
    ]
    return (
        words
        + [msgspec.msgpack.encode(f) for f in IPC_FIELDS]
        + [b"\x91" * 8, b"\xc0", b"\xc3", b"\xcb", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff"]
    )


if __name__ == "__main__":
    _common.main(TestOneInput)
