"""Find slow nodes with 2-node all_reduce tests (pure: which pairs to test next, what the results mean).

A collective runs at the pace of its slowest member, so a pair is as fast as its slower node.

- Round 1 tests disjoint pairs in the order given (node1+node2, node3+node4, ...). With an odd
  count the last node is paired with the first one (that job waits for the first pair's nodes).
  With 3 nodes all 3 pairs are tested: one pair alone gives no baseline to compare with.
- A pair is good when its busbw reaches the threshold: the expected figure when there is one
  (--expect), else REL_FACTOR x the best pair measured so far. A node is good when it is in a good
  pair; it is slow when it is in a pair below the threshold with a good node. Other nodes are
  undetermined, and the next round pairs each of them with a known-good node (a different one
  for each when there are enough, so the jobs run side by side).
- When no node is good yet (every pair below an absolute threshold), one more round tries new
  pairings among them; if that finds no good pair either, the cause is not one node (the fabric,
  the configuration or the threshold) and the search stops.

Relative mode finds nodes slower than the best pair. It cannot see a problem shared by every
pair of round 1 (e.g. 2 slow nodes of 4 in different pairs): give --expect for an absolute one.
A failed pair job counts as below the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

REL_FACTOR = 0.8

Pair = tuple[str, str]


@dataclass(frozen=True)
class PairResult:
    nodes: Pair
    busbw: Optional[float]  # GB/s; None when the job failed or printed no table
    round: int
    detail: str = ""  # job id, state, file: shown as evidence


@dataclass
class Outcome:
    slow: list[str]
    good: list[str]
    undetermined: list[str]
    threshold: Optional[float]
    rule: str
    results: list[PairResult]
    evidence: dict[str, list[PairResult]] = field(default_factory=dict)


class Bisection:
    def __init__(self, nodes: Sequence[str], *, threshold: Optional[float] = None, rel: float = REL_FACTOR) -> None:
        if len(set(nodes)) != len(nodes):
            raise ValueError("the node list names a node twice")
        if len(nodes) < 3:
            raise ValueError(f"bisection needs at least 3 nodes, got {len(nodes)}")
        self.nodes = list(nodes)
        self.absolute = threshold
        self.rel = rel
        self.results: list[PairResult] = []
        self.round = 0
        self._cross_round_done = False

    # --- classification -------------------------------------------------------------------
    def threshold(self) -> Optional[float]:
        if self.absolute is not None:
            return self.absolute
        values = [r.busbw for r in self.results if r.busbw is not None]
        return self.rel * max(values) if values else None

    def rule(self) -> str:
        if self.absolute is not None:
            return f"busbw >= {self.absolute:g} GB/s (the expected figure)"
        th = self.threshold()
        best = f" = {th:.2f} GB/s" if th is not None else ""
        return f"busbw >= {self.rel:g} x the best pair{best}"

    def _ok(self, r: PairResult, th: Optional[float]) -> bool:
        return r.busbw is not None and th is not None and r.busbw >= th

    def classify(self) -> tuple[set[str], set[str]]:
        """(good, slow) from every result so far."""
        th = self.threshold()
        good = {n for r in self.results if self._ok(r, th) for n in r.nodes}
        slow = set()
        for r in self.results:
            if self._ok(r, th):
                continue
            a, b = r.nodes
            if b in good and a not in good:
                slow.add(a)
            if a in good and b not in good:
                slow.add(b)
        return good, slow

    def _tested(self) -> set[frozenset[str]]:
        return {frozenset(r.nodes) for r in self.results}

    # --- planning -------------------------------------------------------------------------
    def next_pairs(self) -> list[Pair]:
        """The pairs of the next round ([] when there is nothing left to learn)."""
        if self.round == 0:
            pairs = self._first_round()
        else:
            good, slow = self.classify()
            unknown = [n for n in self.nodes if n not in good and n not in slow]
            if not unknown:
                return []
            goods = [n for n in self.nodes if n in good]
            pairs = self._with_good(unknown, goods) if goods else self._cross(unknown)
        if pairs:
            self.round += 1
        return pairs

    def _first_round(self) -> list[Pair]:
        n = self.nodes
        if len(n) == 3:
            return [(n[0], n[1]), (n[1], n[2]), (n[2], n[0])]
        pairs = [(n[i], n[i + 1]) for i in range(0, len(n) - 1, 2)]
        if len(n) % 2:
            pairs.append((n[-1], n[0]))
        return pairs

    def _with_good(self, unknown: list[str], goods: list[str]) -> list[Pair]:
        tested = self._tested()
        pairs: list[Pair] = []
        for i, node in enumerate(unknown):
            # A different good partner for each when possible, so the jobs can run side by side.
            order = goods[i % len(goods):] + goods[:i % len(goods)]
            partner = next((g for g in order if frozenset((node, g)) not in tested), None)
            if partner is not None:
                pairs.append((node, partner))
        return pairs

    def _cross(self, unknown: list[str]) -> list[Pair]:
        if self._cross_round_done:
            return []
        self._cross_round_done = True
        tested = self._tested()
        pairs: list[Pair] = []
        free = list(unknown)
        while free:
            a = free.pop(0)
            b = next((x for x in free if frozenset((a, x)) not in tested), None)
            if b is not None:
                free.remove(b)
                pairs.append((a, b))
        return pairs

    def record(self, results: Sequence[PairResult]) -> None:
        self.results.extend(results)

    def outcome(self) -> Outcome:
        good, slow = self.classify()
        th = self.threshold()
        evidence = {n: [r for r in self.results if n in r.nodes and not self._ok(r, th)] for n in slow}
        return Outcome(slow=[n for n in self.nodes if n in slow], good=[n for n in self.nodes if n in good],
                       undetermined=[n for n in self.nodes if n not in good and n not in slow], threshold=th,
                       rule=self.rule(), results=list(self.results), evidence=evidence)


def simulate(nodes: Sequence[str], measure: Callable[[Pair], Optional[float]], *,
             threshold: Optional[float] = None, max_rounds: int = 20) -> tuple[Outcome, int]:
    """Run a bisection with measure(pair) standing in for the jobs: (outcome, rounds used)."""
    bis = Bisection(nodes, threshold=threshold)
    while bis.round < max_rounds:
        pairs = bis.next_pairs()
        if not pairs:
            break
        bis.record([PairResult(p, measure(p), bis.round) for p in pairs])
    return bis.outcome(), bis.round
