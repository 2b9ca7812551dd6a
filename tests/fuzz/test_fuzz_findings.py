"""What the fuzz targets found in LMCache 0.5.6, pinned as minimal regression cases.

Each case runs a target's own property body on the minimal input with known
findings switched to "hit" (tests.fuzz._common.KNOWN), and is
`xfail(strict=True)`: it fails today for the stated reason, and turns the suite
red the day LMCache changes the behaviour, so the pin and the matching
`_common.known(...)` step-over can go.

Related, pinned elsewhere: tests/test_known_issues.py::test_retrieve_past_the_prompt_is_answered
(an exception inside a blocking handler is never answered). The two
request-loop findings below are worse: after one bad request the server
answers nothing at all, while /healthcheck keeps reporting 200.
"""

from __future__ import annotations

import msgspec
import pytest

from fixtures.compat import capabilities as _caps

# the targets import LMCache modules that moved between releases: skip, in one line, where absent
_caps.require_module("fuzz:key_codec", "fuzz:server_requests")

from fixtures.case.server import ServerOptions
from fixtures.compat.known_issues import known_issue

#: the builds each finding is known to hold on (fixtures.compat.known_issues; measured by ci/matrix.sh)
FUZZ_KNOWN_ON: dict[str, str] = {}
#: every finding here, unless FUZZ_KNOWN_ON says otherwise: found on 0.5.6; on 0.5.7rc2 (ci/matrix.sh)
#: each fails with the same type and the same finding name and message (the one-frame
#: and deep-frame requests: the same assert and the same uncaught RecursionError, moved into
#: MessageQueueServer._handle_request), so the range was widened, not guessed
FUZZ_DEFAULT_ON = ">=0.5.6,<=0.5.7rc2"
from tests.fuzz import _common, key_codec, server_requests
from tests.fuzz._common import KNOWN, KnownFinding
from tests.fuzz.server_requests import FRAME_SEP, ServerUnresponsive

pytestmark = pytest.mark.fuzz

#: A server of its own for the cases that break it (released afterwards): options no
#: other test uses, so the pool never hands the shared chunk-16 server to them.
VICTIM = ServerOptions(chunk_size=16, l1_size_gb=0.0625, tag="fuzz-victim")
UID = msgspec.msgpack.encode(7)


def _xfail(name: str, raises=KnownFinding):
    builds = FUZZ_KNOWN_ON.get(name, FUZZ_DEFAULT_ON)
    return known_issue(builds, raises=raises, reason=f"LMCache {builds}: {KNOWN[name]}")


def _break_and_probe(harness, data: bytes) -> None:
    """Send one input to a fresh server, then require that a noop is still answered."""
    session = server_requests.Session(server_requests.suite_server(harness, VICTIM), reply_s=2.0).open()
    try:
        with _common.hit_known():
            session.one_input(data)
    finally:
        session.close()
        harness.release(VICTIM)


# -- the request loop ---------------------------------------------------------


@_xfail("single_frame_request", raises=ServerUnresponsive)
def test_one_frame_request_does_not_stop_the_server(harness):
    _break_and_probe(harness, b"x")  # one frame: [identity, b"x"] at the ROUTER


@_xfail("deep_operation_frame", raises=ServerUnresponsive)
def test_deeply_nested_operation_frame_does_not_stop_the_server(harness):
    _break_and_probe(harness, UID + FRAME_SEP + b"\x91" * 1000)  # [[[[...]]]] as the operation


def _mirror(*frames: bytes) -> None:
    """The server's own decoding of one request, with the target's local properties."""
    with _common.hit_known():
        server_requests.mirror(list(frames))


@_xfail("bool_operation_id")
def test_msgpack_bool_is_not_an_operation_id():
    _mirror(UID, b"\xc3")  # decode_operation(b"\xc3") == "register_kv_cache"


@_xfail("int_payload_coercion")
def test_int_payload_accepts_only_integers():
    _mirror(UID, msgspec.msgpack.encode("cb_protocol_handshake"), msgspec.msgpack.encode(7.9))  # decoded as 7


@_xfail("dtype_attribute_error")
def test_unknown_dtype_name_is_rejected_cleanly():
    layout = msgspec.msgpack.encode({0: {"shapes": [[1]], "dtypes": ["no_such_dtype"]}})
    _mirror(UID, msgspec.msgpack.encode("p2p_lookup_and_lock"), msgspec.msgpack.encode([]), layout)


# -- keys ---------------------------------------------------------------------


@_xfail("deep_nesting_recursion")
def test_deeply_nested_request_configs_is_rejected_cleanly():
    key = {
        "model_name": "m",
        "world_size": 1,
        "worker_id": 0,
        key_codec.TOKENS: key_codec.tokens(()),
        "start": 0,
        "end": 0,
        "request_id": "r",
    }
    wire = msgspec.msgpack.encode(key)
    wire = bytes([wire[0] + 1]) + wire[1:] + msgspec.msgpack.encode("request_configs") + b"\x81\xa1a" + b"\x91" * 1000
    with _common.hit_known():
        key_codec.check_ipc_bytes(wire)


@_xfail("fs_model_name_sep")
def test_fs_filename_round_trip_keeps_the_model_name():
    with _common.hit_known():
        key_codec.check_objkey_struct(
            dict(chunk_hash=b"\x01", model_name="a-SEP-b", kv_rank=0, object_group_id=0, cache_salt="")
        )


@_xfail("kv_rank_aliasing")
def test_workers_of_one_group_get_distinct_object_keys():
    worker0 = {
        "model_name": "m",
        "world_size": 257,
        "worker_id": 0,
        key_codec.TOKENS: key_codec.tokens(()),
        "start": 0,
        "end": 0,
        "request_id": "r",
        "cache_salt": "",
        "request_configs": None,
        "num_kv_readers": 1,
    }
    with _common.hit_known():
        key_codec.check_ipc_struct(worker0, dict(worker0, worker_id=256), [b"h"])
