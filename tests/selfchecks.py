"""Self-checks: each invariant's property, run against a server with a fault injected.

`hunt()` runs a property's Hypothesis search against a fault-injected server
and returns the shrunk failing case. tests/test_selfchecks.py asserts that
every fault is caught and shrunk to the bound stated here; ci/bench.py reuses
the same table to time the first failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from fixtures import invariants, verdicts
from fixtures.errors import HarnessError
from fixtures.scenario import Workload
from fixtures.server import ServerOptions
from tests.properties import PROPERTIES


@dataclass(frozen=True)
class SelfCheck:
    fault: str
    property: str
    #: what the shrunk case must look like (the bound the shrinker reaches)
    bound: Callable[[Workload], bool]
    bound_text: str
    chunk: int = 16
    strategy_kw: dict = field(default_factory=dict)
    max_examples: int = 300

    @property
    def id(self) -> str:
        return f"{self.fault}->{self.property}"

    def options(self) -> ServerOptions:
        return ServerOptions(chunk_size=self.chunk, faults=(self.fault,))

    def strategy(self):
        kw = dict(self.strategy_kw)
        if self.property != "long_prefix":
            kw.setdefault("chunk", st.just(self.chunk))
            kw.setdefault("modes", ("lmcache_driven",))
        return PROPERTIES[self.property].strategy(server=self.options(), **kw)


def _hit_chunks(w: Workload) -> int:
    return invariants.model_hit(w) // w.server.chunk_size


def _small(w: Workload, max_chunks: int) -> bool:
    """TP1, one store that stores anything (a store of < 1 chunk is a no-op), prompts of
    at most max_chunks chunks (+1 token)."""
    c = w.server.chunk_size
    real = [s for s in w.stores if s.prompt.length >= c]
    return (w.tp == 1 and len(real) == 1 and w.query.length <= max_chunks * c + 1
            and all(s.prompt.length <= max_chunks * c + 1 for s in real))


SELF_CHECKS = [
    SelfCheck("inflate_hit", "hit_accounting",
              lambda w: _small(w, 1) and _hit_chunks(w) == 1,
              "TP1, one store, a 1-chunk prompt looked up"),
    SelfCheck("inflate_hit", "hit_transferred",
              lambda w: _small(w, 1) and _hit_chunks(w) == 1,
              "TP1, one store, a 1-chunk prompt looked up"),
    SelfCheck("chunk_hash_off_by_one", "divergence",
              lambda w: _small(w, 1) and w.query.flips == (w.server.chunk_size - 1,),
              "a 1-chunk prompt whose last token (offset C-1) is changed hits 1 chunk instead of 0"),
    SelfCheck("skip_retrieve_after:2", "hit_transferred",
              lambda w: _small(w, 3) and _hit_chunks(w) == 3,
              "exactly K+1 = 3 chunks hit (the smallest failing length)"),
    SelfCheck("skip_retrieve_after:2", "bytes_moved",
              lambda w: _small(w, 3) and _hit_chunks(w) == 3,
              "exactly K+1 = 3 chunks hit"),
    SelfCheck("swap_retrieved_chunks:1", "bit_identity",
              lambda w: _small(w, 3) and _hit_chunks(w) == 3,
              "exactly 3 chunks hit (chunks 1 and 2 swapped)"),
    SelfCheck("retrieve_overrun", "bit_identity",
              lambda w: _small(w, 1) and _hit_chunks(w) == 1,
              "a 1-chunk hit writes one chunk past its range"),
    SelfCheck("undercount_hit_metric", "counters",
              lambda w: _small(w, 1) and _hit_chunks(w) == 1,
              "a 1-chunk hit booked as C-1 tokens"),
    SelfCheck("skip_retrieve_after:114", "long_prefix",
              lambda w: _hit_chunks(w) == 115 and w.tp == 1,
              "exactly 115 chunks x 784 tokens (the bug report's bracket (114, 128]), TP1",
              chunk=784, max_examples=60),
]


@dataclass
class HuntResult:
    check: SelfCheck
    caught: bool
    minimal: Workload | None
    violations: list[str]
    examples: int
    failing_examples: int
    seconds: float
    seconds_to_first_failure: float | None

    def summary(self) -> str:
        if not self.caught:
            return f"{self.check.id}: NOT caught in {self.examples} examples ({self.seconds:.0f} s)"
        return (f"{self.check.id}: caught after {self.seconds_to_first_failure:.1f} s, shrunk in "
                f"{self.seconds:.0f} s over {self.examples} runs to:\n  "
                + self.minimal.describe().replace("\n", "\n  ")
                + "\n  violations: " + "; ".join(self.violations[:3]))


def search_for_failure(strategy, body: Callable, *, max_examples: int, shrink: bool = True):
    """Run body(example) under Hypothesis until it returns violations; shrink them.
    Returns (caught, [(example, violations)], examples run, seconds, seconds to the first failure)."""
    failures: list[tuple[object, list[str]]] = []
    stats = {"n": 0, "first": None}
    t0 = time.monotonic()

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(x=strategy)
    def search(x):
        stats["n"] += 1
        try:
            found = body(x)
        except AssertionError as e:
            # an assert inside the harness or vLLM is not an invariant's verdict: it must
            # not count as the fault being caught
            raise HarnessError(f"the run itself failed an assertion (not an invariant): {e}") from e
        if found:
            if stats["first"] is None:
                stats["first"] = time.monotonic() - t0
            failures.append((x, [str(v) for v in found]))
            # the broken invariant's own type: Hypothesis shrinks this bug, not another one
            raise verdicts.violation_type(found[0].invariant)(f"{len(found)} violations")

    caught = False
    try:
        search()
    except AssertionError:
        caught = bool(failures)
    except HypothesisException as e:
        caught = bool(failures)
        if not caught:
            print(f"search ended without a failure: {type(e).__name__}: {str(e)[:300]}")
    return caught, failures, stats["n"], time.monotonic() - t0, stats["first"]


def hunt(harness, check: SelfCheck, *, max_examples: int | None = None, shrink: bool = True) -> HuntResult:
    """Search for a failure of check.property on a server with check.fault injected."""
    prop = PROPERTIES[check.property]
    caught, failures, n, secs, first = search_for_failure(
        check.strategy(), lambda w: invariants.check(harness.run(w), prop.invariants),
        max_examples=max_examples or check.max_examples, shrink=shrink)
    minimal, violations = failures[-1] if failures else (None, [])
    return HuntResult(check, caught, minimal, violations, n, len(failures), secs, first)


def shrink_program(run: Callable[[list], object], program: list, *, examples: int) -> list[tuple[type, list, str]]:
    """Hypothesis' search over the subsequences of a state machine's program, and its own
    shrinking: while generating, each step is kept with probability 3/4; shrinking drops
    steps. `run(steps)` raises a verdicts.InvariantViolation when the machine's checks
    fail (fixtures.programs.run_rules skips a step whose precondition no longer holds).

    Returns every failing run as (exception type, steps, message), in order: Hypothesis
    shrinks each distinct failure (exception type) on its own, so the last run of a type
    is that bug's shrunk program. A run that crashes (not an invariant's verdict, e.g. a
    fault-induced failed load that vLLM's scheduler asserts on) is a failure of its own
    type: the caller names it, and it never counts as the fault being caught."""
    failing: list[tuple[type, list, str]] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              report_multiple_bugs=False, print_blob=False, phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(keep=st.lists(st.integers(0, 3).map(bool), min_size=len(program), max_size=len(program)))
    def subsequences(keep):
        steps = [s for s, k in zip(program, keep) if k]
        try:
            run(steps)
        except Exception as e:  # noqa: BLE001  (a crash is a failure of its own type, shrunk apart)
            failing.append((type(e), steps, str(e).split("\nprogram")[0]))
            raise

    try:
        subsequences()
    except Exception:  # noqa: BLE001  (every failing run is in `failing`, with its type)
        pass
    return failing
