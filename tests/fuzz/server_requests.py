"""Fuzz target: the MP server's request decoding, over ZMQ, on a real `lmcache server`.

    .venv/bin/python tests/fuzz/server_requests.py [libFuzzer flags] [corpus dirs | input files]

An input is one ZMQ request from a DEALER socket: its frames joined by FRAME_SEP
(0xC1 0xC1; 0xC1 is the one byte msgpack never uses). The server's ROUTER sees
[identity, *frames]; a well-formed request is [request_uid, operation, *payloads]
(transport/zmq_impl/mq.py), each frame msgpack.

Per input:

1. the same decoding the server runs is run here first (decode_operation,
   unwrap_request_payloads with the operation's RPC payload types: the
   coverage atheris steers by, since the server's own is in another process).
   Local properties: decode_operation raises only TypeError/ValueError (all
   its caller catches), never accepts a bool as an operation id, int payloads
   accept only ints, payload decoding rejects cleanly (_common.CLEAN);
2. the frames are sent to the server, unless they decode into a well-formed
   request that changes state (clear, store, register_*, end_session, ...:
   legitimate requests are allowed to change what a lookup returns), or
   trigger a known finding (LMCACHE_FUZZ_KNOWN=hit sends those too);
3. on the same socket, a noop must be answered within LMCACHE_FUZZ_REPLY_S
   seconds (default 5): the request loop survived and is not hung;
4. every LMCACHE_FUZZ_CHECK_EVERY inputs (default 100) and at the end: the
   server process is alive, /healthcheck answers 200, a prompt stored before
   fuzzing still hits exactly the tokens it hit before (through the real
   scheduler adapter), and a prompt never stored still hits 0. When this
   check fails in atheris mode, the inputs since the last passing check are
   written to <artifact_prefix>window-<n>/ with a command that replays them.

The server: the one at LMCACHE_FUZZ_URL / LMCACHE_FUZZ_HTTP (ci/fuzz.sh starts
it; LMCACHE_FUZZ_SERVER_PID lets the harness check the process), else one
started here for the whole session. Server logging is turned down to
LMCACHE_FUZZ_SERVER_LOG_LEVEL (default CRITICAL): every garbage request logs a
traceback otherwise, and the log write dominates the time per input.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import pathlib
import signal
import sys
import time
import uuid
from dataclasses import dataclass

if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tests.fuzz import _common

with _common.instrumented(__name__):
    from lmcache.v1.multiprocess.rpc import get_rpc_specs
    from lmcache.v1.multiprocess.transport.zmq_impl.mq import (
        encode_request_uid,
        msgspec_decode,
        msgspec_encode,
        unwrap_request_payloads,
    )
    from lmcache.v1.multiprocess.transport.zmq_impl.wire import (
        LEGACY_OPERATION_IDS,
        decode_operation,
        encode_operation,
    )

import msgspec
import zmq

from fixtures.drivers import procs
from fixtures.errors import HarnessError, SuiteError

Finding = _common.Finding
FRAME_SEP = b"\xc1\xc1"
MAX_FRAMES = 16
SPECS = get_rpc_specs()
#: Well-formed requests of these operations are sent: they only read state.
#: Every other operation is sent only when its frames do not decode (garbage).
READ_ONLY = frozenset(
    {"noop", "ping", "get_chunk_size", "get_experimental", "query_prefetch_status", "lookup", "cb_protocol_handshake"}
)
NOOP = encode_operation("noop")
NOOP_REPLY = msgspec.msgpack.encode("OK")
CHUNK = 16
MODEL = "pbt-fuzz-server"
SALT = "fuzz"


class ServerUnresponsive(Finding):
    """The server stopped answering after an input."""


def frames_of(data: bytes) -> list[bytes]:
    return data.split(FRAME_SEP)[:MAX_FRAMES]


def input_of(frames: list[bytes]) -> bytes:
    return FRAME_SEP.join(frames)


# ---------------------------------------------------------------------------
# 1. The server's decoding, mirrored locally
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    send: bool
    why: str


#: msgpack nesting from which the server's request thread (default recursion limit
#: 1000, a few frames deep) raises RecursionError in decode_operation. Measured on
#: the wire format, not with a local decode: Hypothesis raises this process's
#: recursion limit while it runs a test, so a local decode would not raise.
DEEP_NESTING = 900
_FIXED = {
    0xC0: 0,
    0xC2: 0,
    0xC3: 0,
    0xCA: 4,
    0xCB: 8,
    0xCC: 1,
    0xCD: 2,
    0xCE: 4,
    0xCF: 8,
    0xD0: 1,
    0xD1: 2,
    0xD2: 4,
    0xD3: 8,
    0xD4: 2,
    0xD5: 3,
    0xD6: 5,
    0xD7: 9,
    0xD8: 17,
}
_SIZED = {
    0xC4: (1, 0),
    0xC5: (2, 0),
    0xC6: (4, 0),
    0xC7: (1, 1),
    0xC8: (2, 1),
    0xC9: (4, 1),
    0xD9: (1, 0),
    0xDA: (2, 0),
    0xDB: (4, 0),
}  # (length bytes, ext type byte)
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}  # (count bytes, items per count)


def msgpack_depth(data: bytes) -> int:
    """The deepest container nesting in the first msgpack object of `data`
    (iterative; stops where the data is truncated or malformed)."""
    pending = [1]  # items still to read at each open level
    depth = pos = 0
    n = len(data)
    while pending and pos < n:
        pending[-1] -= 1
        b = data[pos]
        pos += 1
        items = 0
        if 0x80 <= b <= 0x8F:
            items = 2 * (b & 0x0F)
        elif 0x90 <= b <= 0x9F:
            items = b & 0x0F
        elif 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _SIZED:
            w, ext = _SIZED[b]
            pos += w + ext + int.from_bytes(data[pos : pos + w], "big")
        elif b in _CONTAINERS:
            w, per = _CONTAINERS[b]
            items = per * int.from_bytes(data[pos : pos + w], "big")
            pos += w
        elif b == 0xC1:
            break
        if items:
            pending.append(items)
            depth = max(depth, len(pending) - 1)
        while pending and pending[-1] == 0:
            pending.pop()
    return depth


def _payload_error(operation: str, err: Exception, payloads: list[bytes]) -> None:
    """A payload decode error that is not a clean rejection: known, or a new finding."""
    if isinstance(err, RecursionError):
        _common.known("deep_nesting_recursion", f"{operation} payload: RecursionError")
    elif isinstance(err, AttributeError) and "module 'torch'" in str(err):
        _common.known("dtype_attribute_error", f"{operation} payload: {err}")
    elif isinstance(err, OverflowError):
        _common.known("int_payload_coercion", f"{operation} payload: OverflowError {err}")
    else:
        raise Finding(
            f"decoding the payloads of {operation!r} raised {type(err).__name__}: {err} "
            f"(not a clean rejection; the server logs it and never answers)"
        )


def mirror(frames: list[bytes]) -> Verdict:
    """Decode the request as the server will, check the local properties, and say
    whether to send it."""
    if len(frames) < 2:
        if _common.avoid_known("single_frame_request"):
            return Verdict(False, "known: single frame")
        return Verdict(True, "single frame")
    _uid, b_op, *payloads = frames
    if b_op == b"":
        return Verdict(True, "stream control")
    if msgpack_depth(b_op) >= DEEP_NESTING:
        if _common.avoid_known("deep_operation_frame"):
            return Verdict(False, "known: deep operation frame")
        return Verdict(True, "deep operation frame")
    operation, err = _common.outcome(decode_operation, b_op)
    if err is not None:
        if isinstance(err, RecursionError):
            if _common.avoid_known("deep_operation_frame"):
                return Verdict(False, "known: deep operation frame")
            return Verdict(True, "deep operation frame")
        if not isinstance(err, (TypeError, ValueError)):
            raise Finding(
                f"decode_operation raised {type(err).__name__}: {err}; the server's request loop "
                f"catches only TypeError/ValueError there, so this frame stops it"
            )
        return Verdict(True, "bad operation")
    raw_op = msgspec.msgpack.decode(b_op)
    if isinstance(raw_op, bool):
        _common.known("bool_operation_id", f"msgpack {raw_op!r} decoded as operation {operation!r}")
    spec = SPECS.get(operation)
    if spec is None:
        return Verdict(True, "unknown operation")
    for payload, cls in zip(payloads, spec.payload_types):
        if cls in (int, bool):
            raw, raw_err = _common.outcome(msgspec.msgpack.decode, payload)
            val, val_err = _common.outcome(msgspec_decode, payload, cls)
            if val_err is None and raw_err is None and not isinstance(raw, int):
                _common.known(
                    "int_payload_coercion",
                    f"{operation}: {type(raw).__name__} {raw!r} accepted as {cls.__name__} {val!r}",
                )
    _, err = _common.outcome(unwrap_request_payloads, payloads, list(spec.payload_types))
    if err is not None:
        if not isinstance(err, _common.CLEAN):
            _payload_error(operation, err, payloads)
        return Verdict(True, "malformed payloads")
    if operation in READ_ONLY:
        return Verdict(True, f"well-formed {operation}")
    return Verdict(False, f"well-formed {operation} (not read-only: not sent)")


# ---------------------------------------------------------------------------
# 2-4. The session on a real server
# ---------------------------------------------------------------------------


class Session:
    """One server, one fuzz socket, one engine holding a stored prompt, for many inputs."""

    def __init__(
        self,
        server,
        ranks=None,
        *,
        check_every: int | None = None,
        reply_s: float | None = None,
        window_dir: str | None = None,
        server_pid: int | None = None,
    ):
        self.server = server
        self.ranks = ranks
        self.check_every = check_every or int(os.environ.get("LMCACHE_FUZZ_CHECK_EVERY", "100"))
        self.reply_s = reply_s or float(os.environ.get("LMCACHE_FUZZ_REPLY_S", "5"))
        self.window_dir = window_dir
        self.server_pid = server_pid
        self.engine = None
        self.ctx = zmq.Context()
        self.sock = None
        self.inputs = 0
        self.window: collections.deque = collections.deque(maxlen=self.check_every)
        self.stats: collections.Counter = collections.Counter()
        self._uids = itertools.count(1 << 40)
        self._windows = 0
        self.broken = False

    # -- set-up ------------------------------------------------------------

    def open(self) -> Session:
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.server.url)
        self.probe("before fuzzing")
        if self.ranks is not None:
            self._open_engine()
        return self

    def _open_engine(self) -> None:
        from fixtures.case.layout import KVLayout
        from fixtures.case.workload import PromptSpec
        from fixtures.drivers.rank_group import RankGroup

        if self.server.chunk_size != CHUNK:
            raise SuiteError(f"the fuzz server must run with chunk size {CHUNK}, not {self.server.chunk_size}")
        self.engine = RankGroup(
            self.ranks,
            self.server,
            tp=1,
            mode="lmcache_driven",
            layout=KVLayout(num_layers=1, kv_heads_per_rank=1, head_dim=4),
            model_name=MODEL,
        )
        self.stored = PromptSpec(90_001, 3 * CHUNK + 5).tokens()  # 3 chunks + a partial one
        self.fresh = PromptSpec(90_002, 3 * CHUNK).tokens()  # never stored by anyone
        blocks = self.engine.alloc(len(self.stored) // CHUNK)
        self.engine.prefill(self.stored[: 3 * CHUNK], blocks)
        (reports,) = self.engine.store(
            f"fuzz-store-{uuid.uuid4().hex[:8]}", self.stored, [(0, 3 * CHUNK, blocks)], SALT
        )
        if not all(r.ok and r.finished for r in reports):
            raise HarnessError(f"the fuzz session could not store its prompt: {reports}")
        deadline = time.monotonic() + 15  # the server commits a store asynchronously
        while (hit := self._lookup(self.stored)) != 3 * CHUNK and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stored_hit = hit
        fresh_hit = self._lookup(self.fresh)
        if self.stored_hit != 3 * CHUNK or fresh_hit != 0:
            raise HarnessError(
                f"before fuzzing: the stored prompt hits {self.stored_hit} (want {3 * CHUNK}), "
                f"the fresh one {fresh_hit} (want 0)"
            )

    def _lookup(self, tokens) -> int:
        rid = f"fuzz-q-{uuid.uuid4().hex[:12]}"
        try:
            return self.engine.lookup(rid, tokens, SALT, timeout=max(10.0, 2 * self.reply_s))
        finally:
            self.engine.finish_request(rid)

    # -- per input ---------------------------------------------------------

    def one_input(self, data: bytes) -> None:
        frames = frames_of(data)
        verdict = mirror(frames)
        self.stats[verdict.why.split(" (")[0]] += 1
        self.inputs += 1
        self.window.append(data)
        if verdict.send:
            self._drain()
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                self._broken(ServerUnresponsive("the server stopped reading requests (send queue full)"))
            self.probe(f"after this input ({len(frames)} frames: {verdict.why})")
        if self.inputs % self.check_every == 0:
            self.deep_check()

    def _drain(self) -> None:
        while self.sock.poll(0):
            self.sock.recv_multipart()

    def probe(self, when: str) -> None:
        """A noop on the fuzz socket (so it queues behind the input) must be answered."""
        b_uid = encode_request_uid(next(self._uids))
        self.sock.send_multipart([b_uid, NOOP])
        deadline = time.monotonic() + self.reply_s
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(int(left * 1000) + 1):
                msg = self.sock.recv_multipart()
                if msg[0] == b_uid and msg[1:] == [NOOP, NOOP_REPLY]:
                    return
        self._broken(
            ServerUnresponsive(
                f"the server did not answer a noop within {self.reply_s:g} s {when}; "
                f"process {'alive' if self._process_alive() else 'DEAD'}, "
                f"/healthcheck {'200' if self.server.is_alive() else 'not answering'}"
            )
        )

    def _process_alive(self) -> bool:
        proc = getattr(self.server, "proc", None)
        if proc is not None:
            return proc.poll() is None
        if self.server_pid:
            return procs._alive(self.server_pid)
        return True  # an external server without a pid: /healthcheck decides

    def deep_check(self, when: str = "") -> None:
        """Alive, healthy, and lookups unchanged by everything sent since the last check."""
        when = when or f"after input {self.inputs}"
        problems = []
        if not self._process_alive():
            problems.append("the server process died")
        elif not self.server.is_alive():
            problems.append("/healthcheck does not answer 200")
        else:
            self.probe(when)
            if self.engine is not None:
                try:
                    hit, fresh = self._lookup(self.stored), self._lookup(self.fresh)
                except HarnessError as e:
                    problems.append(f"a lookup was not answered: {e}")
                else:
                    if hit != self.stored_hit:
                        problems.append(f"the stored prompt now hits {hit} tokens (before fuzzing: {self.stored_hit})")
                    if fresh != 0:
                        problems.append(f"a prompt never stored hits {fresh} tokens")
        if problems:
            self._broken(Finding(f"{when}: " + "; ".join(problems)), window=True)
        self.window.clear()

    def _broken(self, err: Finding, window: bool = False) -> None:
        self.broken = True
        if window and self.window_dir and len(self.window) > 1:
            self._windows += 1
            d = pathlib.Path(self.window_dir) / f"window-{os.getpid()}-{self._windows}"
            d.mkdir(parents=True, exist_ok=True)
            for i, data in enumerate(self.window):
                (d / f"{i:05d}").write_bytes(data)
            err = type(err)(
                f"{err}\nthe {len(self.window)} inputs since the last passing check are in {d}; "
                f"replay them in order: .venv/bin/python tests/fuzz/server_requests.py {d}/*"
            )
        raise err

    def close(self) -> None:
        if self.engine is not None:
            try:
                self.engine.close()
            finally:
                self.engine = None
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        self.ctx.term()


def suite_server(harness, options):
    """harness.server(options) for a pytest test; skips where that is not a server the
    suite started (--lmcache-url): fuzzing sends it garbage and may break it."""
    import pytest

    server = harness.server(options)
    if not server.managed:
        pytest.skip("fuzzing needs a server the suite starts (it sends garbage and may break it), not --lmcache-url")
    return server


# ---------------------------------------------------------------------------
# Seeds, Hypothesis strategy, dictionary
# ---------------------------------------------------------------------------


def _key(tokens, **kw):
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    return IPCCacheServerKey.from_token_ids(
        MODEL, 1, kw.pop("worker_id", None), list(tokens), 0, len(tokens), kw.pop("request_id", "fuzz-seed"), SALT, **kw
    )


def _request(operation: str, *payloads, uid: int = 7, legacy: bool = False) -> list[bytes]:
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: F401

    spec = SPECS[operation]
    op = msgspec.msgpack.encode(LEGACY_OPERATION_IDS[operation]) if legacy else msgspec.msgpack.encode(operation)
    return [encode_request_uid(uid), op] + [msgspec_encode(p, cls) for p, cls in zip(payloads, spec.payload_types)]


def seed_requests() -> dict[str, list[bytes]]:
    """Named seed requests (frame lists): one or more per operation family."""
    import torch
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.multiprocess.custom_types import BlockAllocationRecord
    from lmcache.v1.multiprocess.protocols.server_module import ServerModuleCallRequest

    toks = list(range(1000, 1000 + 2 * CHUNK))
    key = _key(toks)
    wkey = _key(toks, worker_id=0)
    ok = ObjectKey(bytes(32), MODEL, ObjectKey.ComputeKVRank(1, 0, 1, 0), 0, SALT)
    ipc_ext = msgspec.msgpack.encode([msgspec.msgpack.Ext(1, msgspec.msgpack.encode({"type": "cpu_shm"}))])
    return {
        "noop": _request("noop"),
        "noop_legacy_id": _request("noop", legacy=True),
        "get_chunk_size": _request("get_chunk_size"),
        "get_experimental": _request("get_experimental"),
        "ping_none": _request("ping", None),
        "ping_instance": _request("ping", 4242),
        "query_prefetch_status": _request("query_prefetch_status", "fuzz-seed"),
        "wait_prefetch_status": _request("wait_prefetch_status", "fuzz-seed", 0.01),
        "lookup": _request("lookup", key, 1),
        "lookup_legacy_id": _request("lookup", key, 1, legacy=True),
        "free_lookup_locks": _request("free_lookup_locks", key, 1),
        "store": _request("store", wkey, 4242, [[1, 2]], b"evt"),
        "retrieve": _request("retrieve", wkey, 4242, [[1, 2]], b"evt", 0),
        "prepare_store": _request("prepare_store", wkey, 4242),
        "end_session": _request("end_session", "fuzz-seed"),
        "clear": _request("clear", False),
        "unregister_kv_cache": _request("unregister_kv_cache", 4242),
        "register_kv_cache_ext": [
            encode_request_uid(7),
            msgspec.msgpack.encode("register_kv_cache"),
            msgspec.msgpack.encode(4242),
            ipc_ext,
            msgspec.msgpack.encode(MODEL),
            msgspec.msgpack.encode(1),
        ],
        "p2p_lookup_and_lock": _request(
            "p2p_lookup_and_lock", [ok], {0: MemoryLayoutDesc([torch.Size([2, 16, 4])], [torch.float16])}
        ),
        "report_block_allocation": _request(
            "report_block_allocation", 4242, MODEL, [BlockAllocationRecord("r", [1], [5])]
        ),
        "cb_protocol_handshake": _request("cb_protocol_handshake", 1),
        "server_module_call": _request("server_module_call", ServerModuleCallRequest("x.echo", b"hi")),
        "stream_ack": [encode_request_uid(7), b"", b"ack"],
        "unknown_operation": [encode_request_uid(7), msgspec.msgpack.encode("no_such_op")],
        "unknown_legacy_id": [encode_request_uid(7), msgspec.msgpack.encode(11)],
        "bool_operation": [encode_request_uid(7), b"\xc3"],
        "float_int_payload": [
            encode_request_uid(7),
            msgspec.msgpack.encode("cb_protocol_handshake"),
            msgspec.msgpack.encode(7.9),
        ],
        "single_frame": [b"x"],
        "deep_operation_frame": [encode_request_uid(7), b"\x91" * 1100],
    }


def seeds() -> dict[str, bytes]:
    """Named seed inputs for tests/fuzz/corpus/server_requests (written by tests/fuzz/seeds.py)."""
    return {name: input_of(frames) for name, frames in seed_requests().items()}


def inputs():
    """Hypothesis strategy: seed requests mutated the way a fuzzer would, as input bytes."""
    from hypothesis import strategies as st

    seed_list = sorted(seed_requests().items())
    ops = sorted(set(SPECS) | {"no_such_op"})

    @st.composite
    def mutated(draw):
        _, frames = draw(st.sampled_from(seed_list))
        frames = list(frames)
        for _ in range(draw(st.integers(0, 3))):
            how = draw(st.sampled_from(["flip", "truncate", "drop", "dup", "replace", "op", "legacy", "append"]))
            i = draw(st.integers(0, len(frames) - 1))
            if how == "flip" and frames[i]:
                j = draw(st.integers(0, len(frames[i]) - 1))
                frames[i] = frames[i][:j] + bytes([frames[i][j] ^ draw(st.integers(1, 255))]) + frames[i][j + 1 :]
            elif how == "truncate":
                frames[i] = frames[i][: draw(st.integers(0, len(frames[i])))]
            elif how == "drop" and len(frames) > 2:
                del frames[i]
            elif how == "dup" and len(frames) < MAX_FRAMES:
                frames.insert(i, frames[i])
            elif how == "replace":
                frames[i] = draw(st.binary(max_size=24))
            elif how == "op" and len(frames) > 1:
                frames[1] = msgspec.msgpack.encode(draw(st.sampled_from(ops)))
            elif how == "legacy" and len(frames) > 1:
                frames[1] = msgspec.msgpack.encode(draw(st.integers(-1, 40)))
            elif how == "append" and len(frames) < MAX_FRAMES:
                frames.append(draw(st.binary(max_size=24)))
        return input_of([f.replace(FRAME_SEP, b"\xc1") for f in frames])

    return mutated()


def dictionary() -> list[bytes]:
    words = [FRAME_SEP, b"\xc0", b"\xc2", b"\xc3", b"\x90", b"\x80", b"\x91\x91\x91\x91", b"\xa3ack", b"cancel"]
    words += [msgspec.msgpack.encode(op) for op in SPECS]
    words += [msgspec.msgpack.encode(i) for i in LEGACY_OPERATION_IDS.values()]
    words += [
        msgspec.msgpack.encode(w)
        for w in (
            "model_name",
            "world_size",
            "worker_id",
            "token_ids",
            "start",
            "end",
            "request_id",
            "cache_salt",
            "num_kv_readers",
            MODEL,
        )
    ]
    return words


# ---------------------------------------------------------------------------
# atheris mode: one server (ci/fuzz.sh's, or started here) for the whole session
# ---------------------------------------------------------------------------

_SESSION: Session | None = None


def TestOneInput(data: bytes) -> None:
    if _SESSION is None:
        raise SuiteError("server_requests: no fuzz session (run this file as a script, or use the pytest tests)")
    _SESSION.one_input(data)


def _start_session() -> tuple[Session, list]:
    """The server (external or started here), a one-rank pool, the session. Returns what to close."""
    from fixtures.case.server import ServerOptions
    from fixtures.drivers.rank_group import RankPool
    from fixtures.drivers.server import ExternalServer, LMCacheServer

    closers: list = []
    url, http = os.environ.get("LMCACHE_FUZZ_URL"), os.environ.get("LMCACHE_FUZZ_HTTP")
    if bool(url) != bool(http):
        raise SuiteError("LMCACHE_FUZZ_URL and LMCACHE_FUZZ_HTTP go together")
    try:
        if url:
            server = ExternalServer(url, http)
            pid = int(os.environ["LMCACHE_FUZZ_SERVER_PID"]) if os.environ.get("LMCACHE_FUZZ_SERVER_PID") else None
        else:
            # inherited by the server process
            os.environ["LMCACHE_LOG_LEVEL"] = os.environ.get("LMCACHE_FUZZ_SERVER_LOG_LEVEL", "CRITICAL")
            server = LMCacheServer(ServerOptions(chunk_size=CHUNK))
            closers.append(server)
            server.start()
            pid = server.pid
        ranks = RankPool(size=1)
        closers.insert(0, ranks)
        session = Session(server, ranks, window_dir=_common.flag("artifact_prefix", "./"), server_pid=pid)
        closers.insert(0, session)
        session.open()
    except BaseException:
        _close_all(closers, fast=True)
        raise
    pid_file = os.environ.get("LMCACHE_FUZZ_PID_FILE")
    if pid_file:  # for ci/fuzz.sh's clean-up: the processes whose shm segments to sweep
        pathlib.Path(pid_file).write_text("\n".join(str(p) for p in [os.getpid(), pid, *ranks.pids()] if p) + "\n")
    return session, closers


def _close_all(closers: list, *, fast: bool = False) -> None:
    """Close the session, the rank pool and a server started here, in that order.

    fast (after a crash or a failed check, when the server may no longer answer):
    the rank processes are killed instead of unregistering from the server, which
    would wait out their MQ timeouts; their shm segments are swept all the same."""
    for c in closers:
        try:
            if fast and isinstance(c, Session):
                c.engine = None  # its adapters live in the rank processes, killed next
            if fast and hasattr(c, "pids"):
                for pid in c.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            c.close()
        except Exception as e:  # noqa: BLE001  (close the rest regardless)
            print(f"server_requests: closing {type(c).__name__}: {e}", file=sys.stderr)
    closers.clear()
    procs.reap_all()


def _run() -> None:
    global _SESSION
    try:
        _SESSION, closers = _start_session()
    except SuiteError as e:
        sys.exit(f"server_requests: {e}")

    def at_exit() -> None:
        failed = False
        try:
            if not _SESSION.broken:
                _SESSION.deep_check(when=f"at the end ({_SESSION.inputs} inputs)")
                print(
                    f"server_requests: final check passed after {_SESSION.inputs} inputs "
                    f"({', '.join(f'{k}: {v}' for k, v in _SESSION.stats.most_common(6))})",
                    file=sys.stderr,
                    flush=True,
                )
        except Finding as e:
            print(f"server_requests: FINAL CHECK FAILED: {e}", file=sys.stderr, flush=True)
            failed = True
        finally:
            _close_all(closers, fast=_SESSION.broken)
        if failed:
            _common.print_known_tally()
            os._exit(1)

    _common.on_fuzzer_exit(at_exit)
    _common.main(TestOneInput, on_crash=lambda: _close_all(closers, fast=True))


if __name__ == "__main__":
    _run()
