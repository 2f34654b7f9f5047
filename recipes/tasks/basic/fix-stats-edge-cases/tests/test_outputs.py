import sys

sys.path.insert(0, "/app")
from stats import mean, median  # noqa: E402


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([5]) == 5

def test_mean_empty():
    assert mean([]) == 0.0

def test_median_odd():
    assert median([3, 1, 2]) == 2

def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5
    assert median([10, 20]) == 15

def test_median_empty():
    assert median([]) == 0.0

def test_median_does_not_modify_input():
    data = [3, 1, 2]
    median(data)
    assert data == [3, 1, 2]
