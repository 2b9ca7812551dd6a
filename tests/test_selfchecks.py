"""Proof that a green run means something: every invariant fails on a real injected fault.

Each case starts a fresh `lmcache server` with one fault patched into its code
(fixtures.faults, via fixtures/inject/sitecustomize.py), runs the property's
own Hypothesis search against it, and asserts that it fails and that the
shrunk case is as small as stated. The shrunk case is printed (-s or -rA).
"""

import json
import os

import pytest

from fixtures import repro
from tests.selfchecks import SELF_CHECKS, hunt


@pytest.mark.selfcheck
@pytest.mark.parametrize("check", SELF_CHECKS, ids=lambda c: c.id)
def test_injected_fault_is_caught_and_shrunk(harness, check, record_property):
    if check.property == "long_prefix":
        pytest.importorskip("torch")
    try:
        result = hunt(harness, check)
    finally:
        harness.release(check.options())
    print("\n" + result.summary())
    record_property("selfcheck", result.summary())
    out = os.path.join(repro.repro_dir(), "selfchecks")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, check.id.replace(">", "").replace(":", "_") + ".json"), "w") as f:
        json.dump({"fault": check.fault, "property": check.property, "caught": result.caught,
                   "examples": result.examples, "seconds": round(result.seconds, 1),
                   "seconds_to_first_failure": result.seconds_to_first_failure,
                   "minimal": result.minimal.to_json() if result.minimal else None,
                   "minimal_text": result.minimal.describe() if result.minimal else None,
                   "violations": result.violations}, f, indent=1)
    assert result.caught, f"fault {check.fault} was NOT caught by property {check.property} in {result.examples} examples"
    assert check.bound(result.minimal), (
        f"fault {check.fault} was caught but shrank only to:\n{result.minimal.describe()}\n"
        f"expected: {check.bound_text}")
