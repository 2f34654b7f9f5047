import sys

sys.path.insert(0, "/app")
import mathops  # noqa: E402


def test_add():
    assert mathops.add(2, 3) == 5
    assert mathops.add(-1, 1) == 0
    assert mathops.add(0, 0) == 0

def test_subtract():
    assert mathops.subtract(10, 4) == 6

def test_multiply_and_square():
    assert mathops.multiply(3, 4) == 12
    assert mathops.square(-5) == 25
