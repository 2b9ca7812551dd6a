"""Fuzz targets for LMCache 0.5.6's MP server (atheris), also run as Hypothesis tests.

One file per target, each exposing ``TestOneInput(data: bytes)`` and runnable as
``.venv/bin/python tests/fuzz/<target>.py [libFuzzer args]``:

* ``chunk_hash``       TokenHasher.compute_chunk_hashes / hash_tokens
* ``key_codec``        IPCCacheServerKey / ObjectKey through every codec the server uses
* ``server_requests``  raw ZMQ frames sent to a real ``lmcache server``

``test_fuzz_smoke.py`` feeds the same property bodies from Hypothesis,
``test_fuzz_findings.py`` pins what they found in LMCache 0.5.6, and
``test_fuzz_selfchecks.py`` shows each property fails on a deliberately broken
LMCache. ``ci/fuzz.sh`` runs the targets time-boxed; see ``tests/fuzz/README.md``.
"""
