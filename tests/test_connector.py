"""The real LMCacheMPConnector under vLLM's real scheduler, hybrid models, per KV group.

The flow is the bug report's: request 1 computes cold and stores; vLLM's prefix
cache is reset (POST /reset_prefix_cache) or kept; request 2 is served from
LMCache. Checked per rank and per KV group (full attention, sliding window,
GDN recurrent state): fixtures/oracle/connector_invariants.py.

Both implementations of the connector are an axis (`connector`, fixtures.case.connector):
lmcache's own LMCacheMPConnector and vLLM's builtin LMCacheMPConnectorUpstream. The
builtin does not support vLLM's hybrid KV cache manager (vLLM turns it off for it: a
sliding-window model runs its sliding layers as full attention, a GDN model cannot run),
so it runs the attention-only families; where it cannot be constructed against the
installed lmcache, its ids skip with the capability probe's one line.
"""

from dataclasses import replace

import pytest
from hypothesis import given, settings

from fixtures.case.connector import CONNECTORS, ConnectorCase
from fixtures.case.model import ModelShape
from fixtures.case.workload import PromptSpec
from fixtures.compat import capabilities as caps
from fixtures.compat import refusals
from fixtures.drivers.connector import run_case
from fixtures.drivers.devices import KV_DEVICES
from fixtures.drivers.vllm_model import resolved_block_size
from fixtures.errors import HarnessError
from fixtures.observe import event
from fixtures.oracle import connector_invariants as ci
from fixtures.oracle import verdicts
from fixtures.properties import budget
from strategies.hybrid import FAMILIES, connector_cases

pytest.importorskip("vllm", reason="vllm is not installed: run ci/setup.sh")
pytestmark = pytest.mark.connector

LLAMA = ModelShape("llama", 2, ("full", "full"))
GEMMA = ModelShape("gemma3_text", 4, ("sliding", "full", "sliding", "full"), sliding_window=48)
QWEN3_NEXT = ModelShape(
    "qwen3_next", 4, ("gdn", "gdn", "gdn", "full"), num_kv_heads=2, linear_key_heads=2, linear_value_heads=4
)


def on_device(case: ConnectorCase, kv_device: str) -> ConnectorCase:
    """The case with its KV caches on `kv_device` (fixtures.drivers.devices); cuda-tp4 runs the
    attention-only models at TP4 (GDN models keep their TP: one KV head per rank)."""
    d = KV_DEVICES[kv_device]
    tp = case.tp if case.shape.family == "qwen3_next" else d.tp_for(case.tp)
    return replace(case, device=d.device, tp=tp)


def check_case(harness, case: ConnectorCase, names=ci.ALL):
    caps.require(f"connector:{case.connector}")
    try:
        obs = run_case(harness, case)
    except (HarnessError, ValueError) as e:
        refusals.skip_if_refused(e)
        raise
    event(
        f"{case.shape.family} TP{case.tp}: server hit {'>0' if obs.server_hit else '=0'}, "
        f"resumed {'from LMCache' if obs.retrieve_ops else 'locally' if obs.num_computed else 'cold'}"
    )
    for n in set(obs.notes):
        event(f"note: {n}")
    found = ci.judge(obs, names)
    if found:
        verdicts.fail(found, ci.report(obs, found), kind="connector", case=case.to_json(), names=names)
    return obs


#: (family, connector) pairs: every family on lmcache's connector, the attention-only ones on
#: vLLM's builtin (it has no hybrid KV cache manager, which GDN models need)
FAMILY_CONNECTORS = [(f, "lmcache") for f in FAMILIES] + [(f, "vllm_builtin") for f in FAMILIES if f != "qwen3_next"]
assert {c for _, c in FAMILY_CONNECTORS} == set(CONNECTORS)


@pytest.mark.parametrize("family,connector", FAMILY_CONNECTORS, ids=[f"{f}-{c}" for f, c in FAMILY_CONNECTORS])
def test_engine_is_told_exactly_what_is_restored(harness, family, connector, kv_device):
    """Every invariant, generated layouts of one family, TP 1/2/4, +/- separate object groups."""
    caps.require(f"connector:{connector}")

    @settings(max_examples=budget(2))
    @given(
        case=connector_cases(
            resolved_block_size, families=(family,), connector=connector, **KV_DEVICES[kv_device].strategy_kwargs()
        )
    )
    def prop(case):
        check_case(harness, case)

    prop()


BOUNDARY_LAYOUTS = [
    (LLAMA, 1, False, "lmcache"),
    (LLAMA, 4, False, "lmcache"),
    (GEMMA, 2, False, "lmcache"),
    (QWEN3_NEXT, 2, False, "lmcache"),
    (LLAMA, 1, True, "lmcache"),
    (LLAMA, 4, True, "lmcache"),
    (GEMMA, 2, True, "lmcache"),
    (QWEN3_NEXT, 2, True, "lmcache"),
    (LLAMA, 1, False, "vllm_builtin"),
]


@pytest.mark.parametrize(
    "shape,tp,separate,connector",
    BOUNDARY_LAYOUTS,
    ids=[
        f"{'qwen3next' if s.family == 'qwen3_next' else s.family.split('_')[0]}-tp{tp}-"
        f"{'separate' if sep else 'shared'}-groups" + ("" if c == "lmcache" else f"-{c}")
        for s, tp, sep, c in BOUNDARY_LAYOUTS
    ],
)
@pytest.mark.parametrize("delta", [0, -1, 1], ids=["exact", "minus1", "plus1"])
def test_full_hit_at_chunk_boundaries(harness, shape, tp, delta, separate, connector, kv_device):
    """A prompt of exactly k chunks, one token less, one token more: stored, reset, served again."""
    from fixtures.drivers.vllm_model import resolved_block_size

    n = 3 * resolved_block_size(shape) + delta
    check_case(
        harness,
        on_device(
            ConnectorCase(
                shape,
                tp=tp,
                separate_object_groups=separate,
                connector=connector,
                first=PromptSpec(5, n),
                second=PromptSpec(5, n),
            ),
            kv_device,
        ),
    )


@pytest.mark.long
@pytest.mark.parametrize(
    "shape,tp,mult,chunks,step,connector",
    [
        (LLAMA, 2, 49, 128, 8192, "lmcache"),
        (QWEN3_NEXT, 2, 16, 110, 7680, "lmcache"),
        (LLAMA, 2, 49, 128, 8192, "vllm_builtin"),
    ],
    ids=["llama-784x128", "qwen3next-768x110", "llama-784x128-vllm_builtin"],
)
def test_report_flow_at_100_plus_chunks(harness, shape, tp, mult, chunks, step, connector, kv_device):
    """The report's shape: 128 chunks of 784 tokens (100,352 tokens) on a dense model and
    110 hybrid chunks of 768 on GDN + attention, second pass after reset_prefix_cache.
    The hybrid case prefills 10 chunks a step: with steps that end between chunk
    boundaries (8192) LMCache 0.5.6 restores no GDN state for its hit, pinned in
    tests/test_known_issues.py::test_a_gdn_hit_restores_the_state_vllm_resumes_from."""
    from fixtures.drivers.vllm_model import resolved_block_size

    n = chunks * resolved_block_size(shape) * mult
    case = ConnectorCase(
        shape,
        chunk_multiple=mult,
        separate_object_groups=True,
        tp=tp,
        connector=connector,
        first=PromptSpec(9, n),
        second=PromptSpec(9, n),
        max_num_batched_tokens=step,
    )
    obs = check_case(harness, on_device(case, kv_device))
    # the case really is 100+ chunks (GDN: the hit ends at the last step end before the prompt's last token)
    assert obs.server_hit and obs.server_hit >= 100 * obs.chunk, f"hit {obs.server_hit} < 100 chunks of {obs.chunk}"
