"""What the fuzz targets share: atheris set-up, the input reader, clean-error rules, known findings.

A target file is both a module (imported by the pytest smoke tests, where
atheris need not be installed) and an atheris script::

    from tests.fuzz import _common
    with _common.instrumented(__name__):   # coverage-instrumented only as a script
        from lmcache... import ...
    def TestOneInput(data: bytes) -> None: ...
    if __name__ == "__main__":
        _common.main(TestOneInput)
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import pathlib
import struct
import sys
from collections.abc import Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]

from fixtures.drivers import procs  # noqa: F401  (telemetry off before lmcache is imported)

try:
    import atheris
except ImportError:  # the pytest path must not need it
    atheris = None

MISSING_ATHERIS = "atheris is not installed: run ci/setup.sh"

# ---------------------------------------------------------------------------
# atheris
# ---------------------------------------------------------------------------


def instrumented(module_name: str):
    """Wrap a target's LMCache imports: instrumented for coverage when the target
    runs as an atheris script (`module_name == "__main__"`), plain otherwise
    (pytest, and the spawned rank processes, which import the script as __mp_main__).
    Only `lmcache.*` modules are instrumented; what was imported before stays as is."""
    if module_name != "__main__":
        return contextlib.nullcontext()
    if atheris is None:
        sys.exit(f"{os.path.relpath(sys.argv[0])}: {MISSING_ATHERIS}")
    return atheris.instrument_imports(include=["lmcache"])


_exit_hooks: list[Callable[[], None]] = []
_exit_done = False
_c_exit_cb = None  # keeps the ctypes callback alive


def _run_exit_hooks(*_args) -> None:
    global _exit_done
    if _exit_done:
        return
    _exit_done = True
    for fn in _exit_hooks:
        fn()


def on_fuzzer_exit(fn: Callable[[], None]) -> None:
    """Run fn when the process ends normally, including when libFuzzer ends it.

    libFuzzer ends a run (-max_total_time, -runs, replaying files) with C exit(),
    which skips Python's atexit; a C-level __cxa_atexit handler still runs, with
    the interpreter intact. A crash (an exception from TestOneInput) runs neither:
    targets clean up through main(on_crash=...).
    """
    global _c_exit_cb
    _exit_hooks.append(fn)
    if _c_exit_cb is None:
        import atexit

        atexit.register(_run_exit_hooks)
        cb_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        _c_exit_cb = cb_type(_run_exit_hooks)
        libc = ctypes.CDLL("libc.so.6")
        libc.__cxa_atexit(ctypes.cast(_c_exit_cb, ctypes.c_void_p), None, None)


def main(test_one_input: Callable[[bytes], None], *, on_crash: Callable[[], None] | None = None) -> None:
    """atheris.Setup + Fuzz with sys.argv (libFuzzer flags, corpus dirs or input files)."""
    if atheris is None:
        sys.exit(f"{os.path.relpath(sys.argv[0])}: {MISSING_ATHERIS}")
    entry = test_one_input
    if on_crash is not None:

        def entry(data: bytes) -> None:
            try:
                test_one_input(data)
            except BaseException:
                on_crash()
                raise

    on_fuzzer_exit(print_known_tally)
    atheris.Setup(sys.argv, entry)
    atheris.Fuzz()


def flag(name: str, default: str | None = None) -> str | None:
    """The value of a libFuzzer flag `-name=value` in sys.argv."""
    for a in sys.argv[1:]:
        if a.startswith(f"-{name}="):
            return a.split("=", 1)[1]
    return default


# ---------------------------------------------------------------------------
# Reading structured values out of fuzz bytes (and writing them, for seeds)
# ---------------------------------------------------------------------------


class Reader:
    """Consumes fuzz bytes front to back; past the end it reads zeros (never raises)."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b + b"\0" * (n - len(b))

    def u8(self) -> int:
        return self._take(1)[0]

    def u16(self) -> int:
        return struct.unpack(">H", self._take(2))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self._take(4))[0]

    def i16(self) -> int:
        return struct.unpack(">h", self._take(2))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def blob(self, max_len: int) -> bytes:
        n = self.u16() % (max_len + 1)
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def text(self, max_len: int) -> str:
        return self.blob(max_len).decode("utf-8", "replace")

    def rest(self) -> bytes:
        b = self.data[self.pos :]
        self.pos = len(self.data)
        return b


class Writer:
    """The inverse of Reader (for seeds and readable regression inputs)."""

    def __init__(self):
        self.parts: list[bytes] = []

    def u8(self, v: int) -> Writer:
        self.parts.append(struct.pack(">B", v))
        return self

    def u16(self, v: int) -> Writer:
        self.parts.append(struct.pack(">H", v))
        return self

    def u32(self, v: int) -> Writer:
        self.parts.append(struct.pack(">I", v))
        return self

    def i16(self, v: int) -> Writer:
        self.parts.append(struct.pack(">h", v))
        return self

    def i64(self, v: int) -> Writer:
        self.parts.append(struct.pack(">q", v))
        return self

    def blob(self, b: bytes) -> Writer:
        self.parts.append(struct.pack(">H", len(b)) + b)
        return self

    def text(self, s: str) -> Writer:
        return self.blob(s.encode())

    def raw(self, b: bytes) -> Writer:
        self.parts.append(b)
        return self

    def bytes(self) -> bytes:
        return b"".join(self.parts)


# ---------------------------------------------------------------------------
# Clean rejections
# ---------------------------------------------------------------------------

#: A malformed input is rejected *cleanly* when the decoder raises one of these:
#: the ValueError family (msgspec.DecodeError and msgspec.ValidationError are
#: ValueErrors; so are UnicodeDecodeError and the ValueErrors of
#: ObjectKey/IPCCacheServerKey.__post_init__) or TypeError. This is also what the
#: server's request loop itself catches around decode_operation. Anything else
#: (RecursionError, AttributeError, OverflowError, KeyError, AssertionError,
#: MemoryError, SystemError, ...) is a finding, and so is accepting a value the
#: type does not allow (a wrong-but-accepted key).
CLEAN = (ValueError, TypeError)


def outcome(fn: Callable, *args, **kwargs):
    """(result, None) or (None, exception) for fn(*args, **kwargs)."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (classified by the caller)
        return None, e


class Finding(AssertionError):
    """A property violation: LMCache misbehaved on this input."""


# ---------------------------------------------------------------------------
# Known findings: LMCache 0.5.6 problems these targets found, pinned as xfails in
# test_fuzz_findings.py. By default a target steps over them (counts them and
# carries on, or keeps such an input away from the server) so a fuzzing session
# is not stopped by the same problem on every run. LMCACHE_FUZZ_KNOWN=hit makes
# them fail like any other finding (that is how the pins reproduce them).
# ---------------------------------------------------------------------------

KNOWN = {
    "single_frame_request": "a request of one ZMQ frame trips `assert len(msg) >= 3` in "
    "MessageQueueServer._main_loop; the request thread dies, the server never "
    "answers again, /healthcheck stays 200",
    "deep_operation_frame": "an operation frame nested ~1000 msgpack levels deep raises RecursionError "
    "in decode_operation, which the request loop does not catch (it catches "
    "TypeError/ValueError): the request thread dies as above",
    "bool_operation_id": "decode_operation accepts msgpack true as legacy operation id 1 "
    "(register_kv_cache): isinstance(True, int)",
    "int_payload_coercion": "an int-typed payload is decoded untyped then int()-coerced: a float is "
    "truncated (7.9 -> 7), a str or bin of digits accepted ('7', b' 7 '), "
    "inf raises OverflowError",
    "deep_nesting_recursion": "msgspec raises RecursionError (not DecodeError) for a payload nested "
    "~1000 levels deep, e.g. inside IPCCacheServerKey.request_configs",
    "dtype_attribute_error": "a MemoryLayoutDesc dtype name torch lacks raises AttributeError from "
    "getattr(torch, name) in the customized decoder's dec_hook",
    "fs_model_name_sep": "the fs L2 filename writes '/' in a model name as '-SEP-' and reads every "
    "'-SEP-' back as '/' (a substitution, not an escape): models 'a-SEP-b' and 'a/b' "
    "share L2 files, and 'a-SEP/-b' reads back as 'a/SEP--b'",
    "kv_rank_aliasing": "ObjectKey.ComputeKVRank ORs world_size/worker_id into 8-bit fields unchecked: "
    "with world_size > 255, different workers get the same kv_rank (same ObjectKey)",
}

_tally: collections.Counter = collections.Counter()
_mode_override: str | None = None


def known_mode() -> str:
    mode = _mode_override or os.environ.get("LMCACHE_FUZZ_KNOWN", "skip")
    if mode not in ("skip", "hit"):
        raise SystemExit(f"LMCACHE_FUZZ_KNOWN={mode!r}: use 'skip' (default) or 'hit'")
    return mode


class KnownFinding(Finding):
    """A violation matching a pinned LMCache 0.5.6 finding (raised in 'hit' mode)."""


def known(name: str, detail: str) -> None:
    """This input shows known finding `name`: count it (skip mode) or raise (hit mode)."""
    if known_mode() == "hit":
        raise KnownFinding(f"[{name}] {KNOWN[name]}; here: {detail}")
    _tally[name] += 1


def avoid_known(name: str) -> bool:
    """Whether to keep an input that triggers known finding `name` away from the
    server (skip mode; counted) or send it and let the remote checks see it (hit mode)."""
    KNOWN[name]
    if known_mode() == "hit":
        return False
    _tally[name] += 1
    return True


@contextlib.contextmanager
def hit_known() -> Iterator[None]:
    """Treat known findings as failures inside this block (the regression pins)."""
    global _mode_override
    old, _mode_override = _mode_override, "hit"
    try:
        yield
    finally:
        _mode_override = old


def known_tally() -> dict[str, int]:
    return dict(_tally)


def print_known_tally() -> None:
    if _tally:
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(_tally.items()))
        print(
            f"known LMCache 0.5.6 findings stepped over (LMCACHE_FUZZ_KNOWN=hit to stop on them): {parts}",
            file=sys.stderr,
            flush=True,
        )
