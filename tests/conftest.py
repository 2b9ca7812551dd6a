"""The pytest fixtures the tests hold on to: one harness (servers, TP rank processes,
connector engines) per xdist worker, and the real vLLM engines of the engine tier.

Profiles, command-line options, one-line errors and repro files are the root conftest.py's.
"""

from __future__ import annotations


import pytest

from fixtures import settings


@pytest.fixture(scope="session")
def harness(request):
    from fixtures.drivers.rank_group import RankPool
    from fixtures.drivers.harness import Harness
    from fixtures.drivers.server import ExternalServer, ServerPool

    cfg = request.config
    external = None
    if cfg.getoption("--lmcache-url"):
        external = ExternalServer(
            cfg.getoption("--lmcache-url"), cfg.getoption("--lmcache-http"), cfg.getoption("--lmcache-tap")
        )
    h = Harness(ServerPool(external=external, max_running=settings.MAX_SERVERS.get()), RankPool(size=4))
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(scope="session")
def engine_pool(harness):
    """Real vLLM engines (fixtures.drivers.real_engine), one per option set, for this xdist worker.
    Skips with one line when the engine environment (.venv-engine) is not built."""
    from fixtures.drivers.real_engine import EnginePool, skip_reason

    why = skip_reason()
    if why:
        pytest.skip(why)
    pool = EnginePool(harness)
    try:
        yield pool
    finally:
        pool.close()
