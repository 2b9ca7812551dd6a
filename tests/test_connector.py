"""The real LMCacheMPConnector under vLLM's real scheduler, hybrid models, per KV group.

The flow is the bug report's: request 1 computes cold and stores; vLLM's prefix
cache is reset (POST /reset_prefix_cache) or kept; request 2 is served from
LMCache. Checked per rank and per KV group (full attention, sliding window,
GDN recurrent state): fixtures/oracle/connector_invariants.py.
"""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.case.connector import ConnectorCase
from fixtures.case.model import ModelShape
from fixtures.case.workload import PromptSpec
from fixtures.drivers.connector import run_case
from fixtures.drivers.devices import KV_DEVICES
from fixtures.observe import event
from fixtures.oracle import connector_invariants as ci
from fixtures.oracle import verdicts
from fixtures.properties import budget
from strategies.hybrid import FAMILIES, connector_cases

pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
pytestmark = pytest.mark.connector

LLAMA = ModelShape("llama", 2, ("full", "full"))
GEMMA = ModelShape("gemma3_text", 4, ("sliding", "full", "sliding", "full"), sliding_window=48)
QWEN3_NEXT = ModelShape("qwen3_next", 4, ("gdn", "gdn", "gdn", "full"), num_kv_heads=2, linear_key_heads=2,
                        linear_value_heads=4)


def on_device(case: ConnectorCase, kv_device: str) -> ConnectorCase:
    """The case with its KV caches on `kv_device` (fixtures.drivers.devices); cuda-tp4 runs the
    attention-only models at TP4 (GDN models keep their TP: one KV head per rank)."""
    d = KV_DEVICES[kv_device]
    tp = case.tp if case.shape.family == "qwen3_next" else d.tp_for(case.tp)
    return replace(case, device=d.device, tp=tp)


def check_case(harness, case: ConnectorCase, names=ci.ALL):
    obs = run_case(harness, case)
    event(f"{case.shape.family} TP{case.tp}: server hit {'>0' if obs.server_hit else '=0'}, "
          f"resumed {'from LMCache' if obs.retrieve_ops else 'locally' if obs.num_computed else 'cold'}")
    for n in set(obs.notes):
        event(f"note: {n}")
    found = ci.check(obs, names)
    if found:
        verdicts.fail(found, ci.report(obs, found), kind="connector", case=case.to_json(), names=names)
    return obs


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=budget(2))
@given(data=st.data())
def test_engine_is_told_exactly_what_is_restored(harness, family, kv_device, data):
    """Every invariant, generated layouts of one family, TP 1/2/4, +/- separate object groups."""
    kw = KV_DEVICES[kv_device].strategy_kwargs()
    check_case(harness, data.draw(connector_cases(families=(family,), **kw), label="case"))


@pytest.mark.parametrize("shape,tp", [(LLAMA, 1), (LLAMA, 4), (GEMMA, 2), (QWEN3_NEXT, 2)],
                         ids=["llama-tp1", "llama-tp4", "gemma3-tp2", "qwen3next-tp2"])
@pytest.mark.parametrize("delta", [0, -1, 1], ids=["exact", "minus1", "plus1"])
@pytest.mark.parametrize("separate", [False, True], ids=["shared-groups", "separate-groups"])
def test_full_hit_at_chunk_boundaries(harness, shape, tp, delta, separate, kv_device):
    """A prompt of exactly k chunks, one token less, one token more: stored, reset, served again."""
    from fixtures.drivers.vllm_model import resolved_block_size

    n = 3 * resolved_block_size(shape) + delta
    check_case(harness, on_device(ConnectorCase(shape, tp=tp, separate_object_groups=separate,
                                                first=PromptSpec(5, n), second=PromptSpec(5, n)), kv_device))


@pytest.mark.long
@pytest.mark.parametrize("shape,tp,mult,chunks,step", [(LLAMA, 2, 49, 128, 8192), (QWEN3_NEXT, 2, 16, 110, 7680)],
                         ids=["llama-784x128", "qwen3next-768x110"])
def test_report_flow_at_100_plus_chunks(harness, shape, tp, mult, chunks, step, kv_device):
    """The report's shape: 128 chunks of 784 tokens (100,352 tokens) on a dense model and
    110 hybrid chunks of 768 on GDN + attention, second pass after reset_prefix_cache.
    The hybrid case prefills 10 chunks a step: with steps that end between chunk
    boundaries (8192) LMCache 0.5.6 restores no GDN state for its hit, pinned in
    tests/test_known_issues.py::test_a_gdn_hit_restores_the_state_vllm_resumes_from."""
    from fixtures.drivers.vllm_model import resolved_block_size

    n = chunks * resolved_block_size(shape) * mult
    case = ConnectorCase(shape, chunk_multiple=mult, separate_object_groups=True, tp=tp,
                         first=PromptSpec(9, n), second=PromptSpec(9, n), max_num_batched_tokens=step)
    obs = check_case(harness, on_device(case, kv_device))
    # the case really is 100+ chunks (GDN: the hit ends at the last step end before the prompt's last token)
    assert obs.server_hit and obs.server_hit >= 100 * obs.chunk, f"hit {obs.server_hit} < 100 chunks of {obs.chunk}"
