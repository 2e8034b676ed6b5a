"""Bisection logic (pure): which pairs each round tests and which node the results point at.

The measurement is modelled as a collective runs: a pair is as fast as its slower node.
"""

from __future__ import annotations

from typing import Optional

import pytest

from lingjun_slurm.nodes.nccltests.bisect import Bisection, PairResult, simulate

HEALTHY = 338.8  # GB/s: the recorded 2 x 8 H100 all_reduce peak


def nodes(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


def model(speed: dict[str, float], failing: frozenset[str] = frozenset()):  # type: ignore[no-untyped-def]
    def measure(pair: tuple[str, str]) -> Optional[float]:
        if failing & set(pair):
            return None
        return HEALTHY * min(speed.get(pair[0], 1.0), speed.get(pair[1], 1.0))
    return measure


@pytest.mark.parametrize("n", [4, 6, 7])
def test_one_slow_node_is_found_wherever_it_is(n: int) -> None:
    for slow in nodes(n):
        outcome, rounds = simulate(nodes(n), model({slow: 0.5}))
        assert outcome.slow == [slow], (n, slow, outcome)
        assert outcome.undetermined == [] and set(outcome.good) == set(nodes(n)) - {slow}
        assert rounds <= 2
        # The evidence is the pairs below the threshold that contain the node.
        assert outcome.evidence[slow] and all(slow in r.nodes for r in outcome.evidence[slow])


def test_jobs_per_round_and_round_one_pairs() -> None:
    bis = Bisection(nodes(7))
    assert bis.next_pairs() == [("node1", "node2"), ("node3", "node4"), ("node5", "node6"), ("node7", "node1")]
    outcome, rounds = simulate(nodes(6), model({"node4": 0.6}))
    per_round = [sum(1 for r in outcome.results if r.round == k) for k in (1, 2)]
    assert per_round == [3, 2] and rounds == 2
    # Round 2 re-pairs each member of the slow pair with a different known-good node.
    second = [r.nodes for r in outcome.results if r.round == 2]
    assert second == [("node3", "node1"), ("node4", "node2")]


def test_no_slow_node() -> None:
    for n in (3, 4, 7):
        outcome, rounds = simulate(nodes(n), model({}))
        assert outcome.slow == [] and outcome.undetermined == [] and rounds == 1


def test_three_nodes_test_every_pair() -> None:
    outcome, rounds = simulate(nodes(3), model({"node1": 0.6}))
    assert outcome.slow == ["node1"] and rounds == 1 and len(outcome.results) == 3


def test_two_slow_nodes_in_different_pairs() -> None:
    outcome, _ = simulate(nodes(6), model({"node2": 0.5, "node5": 0.6}))
    assert outcome.slow == ["node2", "node5"] and outcome.undetermined == []


def test_two_slow_nodes_in_the_same_pair() -> None:
    outcome, _ = simulate(nodes(4), model({"node1": 0.5, "node2": 0.55}))
    assert outcome.slow == ["node1", "node2"]


def test_relative_mode_limit_and_absolute_threshold() -> None:
    """Every round-1 pair holding a slow node looks alike relative to each other: an expected figure finds them."""
    measure = model({"node1": 0.5, "node3": 0.5})
    outcome, _ = simulate(nodes(4), measure)
    assert outcome.slow == []  # the documented limit of the relative rule
    outcome, _ = simulate(nodes(4), measure, threshold=300.0)
    assert outcome.slow == ["node1", "node3"] and outcome.threshold == 300.0


def test_relative_threshold_is_a_fraction_of_the_best_pair() -> None:
    outcome, _ = simulate(nodes(4), model({"node4": 0.85}))
    assert outcome.slow == [] and outcome.threshold == pytest.approx(0.8 * HEALTHY)  # 15 % slower is within 20 %
    outcome, _ = simulate(nodes(4), model({"node4": 0.75}))
    assert outcome.slow == ["node4"]
    assert "0.8 x the best pair" in outcome.rule


def test_a_failing_node_counts_as_slow() -> None:
    outcome, _ = simulate(nodes(5), model({}, failing=frozenset({"node2"})))
    assert outcome.slow == ["node2"]
    assert all(r.busbw is None for r in outcome.evidence["node2"])


def test_everything_below_an_absolute_threshold_is_undetermined_and_stops() -> None:
    outcome, rounds = simulate(nodes(6), model({n: 0.5 for n in nodes(6)}), threshold=300.0)
    assert outcome.slow == [] and outcome.undetermined == nodes(6)
    assert rounds == 2  # round 1, then one round of new pairings; then it stops


def test_bad_node_lists() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        Bisection(["a", "b"])
    with pytest.raises(ValueError, match="twice"):
        Bisection(["a", "b", "a"])


def test_record_and_outcome_by_hand() -> None:
    bis = Bisection(nodes(4))
    pairs = bis.next_pairs()
    bis.record([PairResult(pairs[0], 300.0, 1), PairResult(pairs[1], 100.0, 1)])
    good, slow = bis.classify()
    assert good == {"node1", "node2"} and slow == set()
    assert bis.next_pairs() == [("node3", "node1"), ("node4", "node2")]


@pytest.mark.parametrize("n", range(3, 13))
def test_rounds_and_jobs_stay_within_the_documented_bound(n: int) -> None:
    """docs/nccl-tests.md: one slow node takes at most 2 rounds, N/2 + 2 jobs (even N), (N + 1)/2 + 3 (odd N)."""
    bound = n // 2 + 2 if n % 2 == 0 else (n + 1) // 2 + 3
    for slow in nodes(n):
        outcome, rounds = simulate(nodes(n), model({slow: 0.5}))
        assert outcome.slow == [slow] and rounds <= 2 and len(outcome.results) <= bound


def test_pair_scripts_reproduce_their_own_command() -> None:
    from lingjun_slurm.nodes.nccltests.plan import with_options

    base = ("lingjun-slurm", "nccl-test", "--render-only", "/r", "--profile", "tcp", "--nodelist", "n[1-4]")
    assert with_options(base, render_only="/r/round1/n1-n2", nodelist="n1,n2", ops="all_reduce") == (
        "lingjun-slurm", "nccl-test", "--render-only", "/r/round1/n1-n2", "--profile", "tcp", "--nodelist", "n1,n2",
        "--ops", "all_reduce")
