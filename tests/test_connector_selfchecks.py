"""Proof that the connector properties catch faults at the connector boundary.

Two faults (fixtures/faults/__init__.py), each run through test_connector.py's own
strategy and invariants, must be caught and shrink to a small case:

- connector_tells_one_less (client side: vLLM's scheduler-role connector lives
  in this process, so the patch is applied here with faults.active): the
  engine is told N-1 tokens are computed while N are restored -- the bug
  report's 100351 vs 100352.
- recurrent_state_from_previous_chunk (server side, patched into the server
  process): a retrieve restores the GDN state of the chunk before the hit's
  last one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from fixtures import faults, repro
from fixtures.compat import capabilities as caps
from fixtures.compat import refusals
from fixtures.errors import HarnessError
from fixtures.oracle import connector_invariants as ci
from fixtures.selfchecks import search_for_failure

pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
pytestmark = [pytest.mark.connector, pytest.mark.selfcheck]


@dataclass(frozen=True)
class ConnectorSelfCheck:
    fault: str
    invariant: str
    family: str
    bound_text: str
    max_chunks_shrunk: int
    max_examples: int = 40

    @property
    def id(self) -> str:
        return f"{self.fault}->{self.invariant}"

    @property
    def server_side(self) -> bool:
        return faults.REGISTRY[self.fault].where in ("server", "both")

    def strategy(self):
        from fixtures.drivers.vllm_model import resolved_block_size
        from strategies.hybrid import connector_cases

        return connector_cases(
            resolved_block_size,
            families=(self.family,),
            tps=(1, 2),
            max_chunks=8,
            faults=(self.fault,) if self.server_side else (),
        )

    def small(self, case, chunk: int) -> bool:
        return (
            case.tp == 1
            and case.shape.num_layers <= 2
            and max(case.first.length, case.second.length) <= self.max_chunks_shrunk * chunk + 1
        )


CHECKS = [
    ConnectorSelfCheck(
        "connector_tells_one_less",
        "told_equals_restored",
        "llama",
        "TP1, a 1-2 layer llama, prompts of at most 2 chunks (+1 token)",
        2,
    ),
    ConnectorSelfCheck(
        "recurrent_state_from_previous_chunk",
        "restored_bit_identical",
        "qwen3_next",
        "TP1, 2 layers (GDN + full), prompts of at most 3 chunks (+1 token)",
        3,
    ),
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.id)
def test_connector_fault_is_caught_and_shrunk(harness, check):
    from fixtures.drivers.connector import case_server, run_case

    caps.require("connector:lmcache")

    def body(case):
        with faults.active(check.fault if not check.server_side else ""):
            try:
                obs = run_case(harness, case)
            except (HarnessError, ValueError) as e:
                refusals.skip_if_refused(e)  # a build that refuses the layout: one line
                raise
        return ci.judge(obs, (check.invariant,))

    servers = set()
    try:
        caught, failures, n, secs, first = search_for_failure(
            check.strategy().map(lambda c: (servers.add(case_server(c)), c)[1]), body, max_examples=check.max_examples
        )
    finally:
        for opts in servers:
            harness.release(opts)
    assert caught, f"fault {check.fault} was NOT caught by {check.invariant} in {n} cases"
    minimal, violations = failures[-1]
    chunk = case_server(minimal).chunk_size
    text = minimal.describe(chunk)
    print(
        f"\n{check.id}: caught after {first:.1f} s, shrunk in {secs:.0f} s over {n} runs to:\n  "
        + text.replace("\n", "\n  ")
        + "\n  violations: "
        + "; ".join(violations[:2])
    )
    out = os.path.join(repro.repro_dir(), "selfchecks")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, check.id.replace(">", "") + ".json"), "w") as f:
        json.dump(
            {
                "fault": check.fault,
                "invariant": check.invariant,
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
    assert check.small(minimal, chunk), (
        f"{check.fault} was caught but shrank only to:\n{text}\nexpected: {check.bound_text}"
    )
