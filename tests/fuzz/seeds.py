"""Write the seed corpora and libFuzzer dictionaries kept in the repo.

    .venv/bin/python -m tests.fuzz.seeds           # rewrite tests/fuzz/corpus/<target>/, tests/fuzz/dicts/<target>.dict
    .venv/bin/python -m tests.fuzz.seeds --check   # exit 1 if they are out of date

Each target builds its seeds from LMCache's own encoders (`seeds()`, named
inputs) and its dictionary from the wire vocabulary (`dictionary()`), so both
follow the installed LMCache. Seed files are named `seed-<name>`; files the
fuzzer adds to fuzz-out/<target>/corpus are never copied here automatically.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from tests.fuzz import _common

TARGETS = ("chunk_hash", "key_codec", "server_requests")
CORPUS = _common.ROOT / "tests" / "fuzz" / "corpus"
DICTS = _common.ROOT / "tests" / "fuzz" / "dicts"


def _module(target: str):
    import importlib

    return importlib.import_module(f"tests.fuzz.{target}")


def dict_text(words: list[bytes]) -> str:
    def esc(b: bytes) -> str:
        return "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\' else f"\\x{c:02x}" for c in b)

    return "".join(f'w{i}="{esc(w)}"\n' for i, w in enumerate(dict.fromkeys(words)))


def wanted() -> dict[pathlib.Path, bytes]:
    files: dict[pathlib.Path, bytes] = {}
    for t in TARGETS:
        m = _module(t)
        for name, data in m.seeds().items():
            files[CORPUS / t / f"seed-{name}"] = data
        files[DICTS / f"{t}.dict"] = dict_text(m.dictionary()).encode()
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only check that the files in the repo are current")
    a = ap.parse_args(argv)
    files = wanted()
    stale = [p for p, data in files.items() if not p.exists() or p.read_bytes() != data]
    extra = [p for t in TARGETS for p in (CORPUS / t).glob("seed-*") if p not in files]
    if a.check:
        for p in stale + extra:
            print(f"out of date: {p.relative_to(_common.ROOT)}", file=sys.stderr)
        return 1 if stale or extra else 0
    for p in extra:
        p.unlink()
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(files[p])
    print(f"{len(files)} seed/dictionary files: {len(stale)} written, {len(extra)} removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
