"""Proof that the engine tier's differential properties catch real faults and shrink them.

Each fault (fixtures/faults/__init__.py) runs under test_engine.py's own strategy and checks, on an
engine + server of its own, and must be caught and shrunk to the stated bound:

- skip_retrieve_after:1 (server, lmcache_driven): a retrieve silently transfers only its first chunk;
- engine_driven_skip_retrieve_after:1 (server, engine_driven): a retrieve hands the worker only
  its first chunk's shm slot, and the worker copies only that one;
- connector_tells_one_less (in the engine process, where vLLM's scheduler-side
  LMCacheMPConnector lives): vLLM is told N-1 tokens while N are loaded.

Each server fault patches one transfer path, so it runs in that transfer mode: lmcache_driven
(the server writes into the engine's KV cache) or engine_driven (the worker copies from the
server's shm slots).

Not here, on purpose: swap_retrieved_chunks:1 (chunks 1 and 2 land in each other's
blocks). The engine's output does not change (not caught in 30 cases; a lone 193- and
256-token prompt give warm == cold bit for bit): keys carry their position (RoPE is
applied before they are cached) and every query vLLM computes after a hit comes after
all restored positions, so attention over the restored keys is a sum over (key, value)
pairs that does not depend on which slot holds which chunk. Only the connector tier's
byte-level bit identity (tests/test_selfchecks.py) can see it.
"""

from __future__ import annotations

import json
import os

import pytest

from fixtures import repro
from fixtures.drivers.engine_flow import run_engine_case
from fixtures.oracle.engine import check
from fixtures.selfchecks import ENGINE_SELF_CHECKS, search_for_failure
from strategies.engine import engine_cases
from tests.test_engine import started

pytestmark = [pytest.mark.engine, pytest.mark.selfcheck]


# Shrunk cases the self-checks found, kept as fixed examples of the plain property
# (tests/test_engine.py runs them on every run; see docs/tier-engine.md, "Self-checks").


@pytest.mark.parametrize("sc", ENGINE_SELF_CHECKS, ids=lambda c: c.id)
def test_engine_fault_is_caught_and_shrunk(engine_pool, sc):
    opts = sc.options()
    started(engine_pool, opts)  # a build that refuses the layout: one line

    def body(case):
        return check(run_engine_case(engine_pool, case), sc.checks)

    try:
        caught, failures, n, secs, first = search_for_failure(
            engine_cases((opts,), max_chunks=4, max_batch=2), body, max_examples=sc.max_examples
        )
    finally:
        engine_pool.release(opts)
    assert caught, f"fault {sc.fault} was NOT caught by {sc.checks} in {n} cases"
    minimal, violations = failures[-1]
    text = minimal.describe()
    print(
        f"\n{sc.id}: caught after {first:.1f} s, shrunk in {secs:.0f} s over {n} runs to:\n  "
        + text.replace("\n", "\n  ")
        + "\n  violations: "
        + "; ".join(violations[:2])
    )
    out = os.path.join(repro.repro_dir(), "selfchecks")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "engine-" + sc.id.replace(">", "").replace(":", "_") + ".json"), "w") as f:
        json.dump(
            {
                "fault": sc.fault,
                "checks": sc.checks,
                "examples": n,
                "seconds": round(secs, 1),
                "seconds_to_first_failure": first,
                "minimal": minimal.to_json(),
                "minimal_text": text,
                "violations": violations,
            },
            f,
            indent=1,
        )
    assert sc.small(minimal), f"{sc.fault} was caught but shrank only to:\n{text}\nexpected: {sc.bound_text}"
