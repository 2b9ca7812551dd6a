"""The property bodies, shared by the tests, the self-checks and the benchmark.

A property test draws a typed case (a Workload), runs it (`observe`) and judges
the invariants it names (`judge`, fixtures.invariants). On a violation it records a
repro (fixtures.repro) and raises the first broken invariant's own exception type
(fixtures.verdicts) with a readable report.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hypothesis import settings, target
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st

from fixtures import invariants, verdicts
from fixtures.devices import KV_DEVICES
from fixtures.observe import event
from fixtures.scenario import Observation, Workload
from strategies import long_prefix_workloads, workloads


def budget(weight: float = 1.0) -> int:
    """Examples for a property: the active profile's max_examples x weight."""
    return max(1, int(round(settings.default.max_examples * weight)))


def bucket(n: int) -> str:
    for lim in (0, 1, 4, 16, 64, 128):
        if n <= lim:
            return f"<={lim}"
    return ">128"


def on(w: Workload, kv_device: str, mode: str | None = None) -> Workload:
    """The drawn case as it runs here: KV caches on `kv_device` (fixtures.devices: "cpu",
    "cuda", "cuda-tp4" runs every case at TP4) and, when given, in transfer mode `mode`
    (the tests' parameter; the case strategies draw every case in one mode)."""
    d = KV_DEVICES[kv_device]
    return replace(w, device=d.device, tp=d.tp_for(w.tp), mode=mode or w.mode)


def observe(harness, w: Workload) -> Observation:
    """Run the workload on the real server and ranks; label it for Hypothesis' statistics
    and steer the search (target) toward long hits and many bytes moved."""
    obs = harness.run(w)
    c = w.server.chunk_size
    event(f"query chunks {bucket(w.query.length // c)}, hit chunks {bucket(obs.hit // c)}")
    event(f"TP{w.tp} {w.mode} settle={w.settle}")
    for k in obs.known:
        event(f"known LMCache 0.5.6 discrepancy: {k}")
    if currently_in_test_context():
        target(obs.hit // c, label="hit chunks")
        target(sum(r.bytes_written for r in obs.retrieves), label="bytes moved")
    return obs


def judge(obs: Observation, *names: str) -> None:
    """Judge the named invariants (fixtures.invariants); the first broken one raises its own
    type (fixtures.verdicts) with every violation in the report, and a repro is written."""
    found = invariants.check(obs, names)
    if found:
        verdicts.fail(found, invariants.report(obs, found), kind="workload", case=obs.workload.to_json(), names=names)


def check_workload(harness, w: Workload, names: tuple[str, ...]) -> Observation:
    obs = observe(harness, w)
    judge(obs, *names)
    return obs


@dataclass(frozen=True)
class Property:
    """An invariant set and the strategy that feeds it."""

    name: str
    invariants: tuple[str, ...]
    strategy: Callable[..., st.SearchStrategy[Workload]]
    doc: str

    def check(self, harness, w: Workload) -> Observation:
        return check_workload(harness, w, self.invariants)

    def on(self, kv_device: str, **kw) -> st.SearchStrategy[Workload]:
        """The property's strategy with the KV caches on `kv_device` (fixtures.devices:
        "cpu", "cuda", "cuda-tp4"); the one switch between the CPU and the GPU path."""
        return self.strategy(**KV_DEVICES[kv_device].strategy_kwargs(), **kw)


PROPERTIES = {
    p.name: p
    for p in [
        Property("hit_accounting", ("hit_accounting",), workloads,
                 "hit == C x leading stored chunks; multiples and +/-1 token; never more than stored"),
        Property("never_stored", ("hit_accounting",), lambda **kw: workloads(query_kinds=("fresh",), **kw),
                 "a prompt nobody stored hits 0"),
        Property("divergence", ("hit_accounting", "bit_identity"),
                 lambda **kw: workloads(query_kinds=("flipped",), **kw),
                 "a token changed in chunk k gives exactly k chunks, and those restore bit-exactly"),
        Property("hit_transferred", ("hit_transferred",), workloads,
                 "tokens reported hit == tokens whose blocks the retrieve wrote, every rank"),
        Property("bytes_moved", ("bytes_moved",), workloads,
                 "bytes landed == hit x bytes/token == the server's MP_*_END figures"),
        Property("bit_identity", ("bit_identity",), workloads,
                 "restored blocks torch.equal the stored KV; nothing outside the range changes"),
        Property("counters", ("counters",), workloads,
                 "server counter deltas == what the engine side saw"),
        Property("long_prefix", invariants.ALL, long_prefix_workloads,
                 "100-160 chunks x 784 tokens round-trip, every invariant"),
    ]
}
