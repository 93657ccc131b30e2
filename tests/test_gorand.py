"""The Go math/rand port replays Go's own numbers (values printed by Go 1.19, `go run`, and the widely quoted first
value of the default seed 1, 5577006791947779410), so the Alibaba replay shuffles and samples as the FGD simulator."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gorand import Rand  # noqa: E402


def test_int63_and_int_match_go():
    r = Rand(42)
    assert [r.int63() for _ in range(3)] == [3440579354231278675, 608747136543856411, 5571782338101878760]
    r = Rand(1)  # rand.Int() of Go's default seed: the value every "why is my random number always the same" answer quotes
    assert (r.int63(), r.int()) == (5577006791947779410, 8674665223082153551)


def test_intn_perm_shuffle_match_go():
    r = Rand(42)
    assert [r.intn(100) for _ in range(3)] + [r.intn(8152)] == [5, 87, 68, 1382]
    assert Rand(42).perm(10) == [7, 5, 8, 9, 2, 1, 6, 0, 3, 4]
    assert Rand(42).shuffled(list(range(10))) == [2, 5, 7, 9, 6, 8, 1, 4, 0, 3]


def test_the_simulators_sequence_matches_go():
    """rand.Seed(42); rand.Int(); rand.Shuffle(8152 pods); rand.Intn(8152); rand.Perm(5), as Go printed them."""
    r = Rand(42)
    first = r.int()
    pods = r.shuffled(list(range(8152)))
    assert first == 3440579354231278675
    assert pods[:8] == [255, 1685, 6784, 4463, 602, 1564, 3882, 7257]
    assert r.intn(8152) == 3888
    assert r.perm(5) == [4, 0, 1, 2, 3]


def test_negative_seed_and_float64_match_go():
    r = Rand(-7)
    assert r.int63() == 747107023976529931
    assert r.int31n(1000) == 928
    assert r.float64() == 0.7584772492306421
