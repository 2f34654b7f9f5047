import sys

import pytest

sys.path.insert(0, "/app")
from listutils import chunks  # noqa: E402


def test_uneven():
    assert chunks([1, 2, 3, 4, 5, 6, 7], 3) == [[1, 2, 3], [4, 5, 6], [7]]

def test_exact_multiple():
    assert chunks([1, 2, 3, 4, 5, 6], 2) == [[1, 2], [3, 4], [5, 6]]

def test_single_chunk():
    assert chunks([1, 2, 3], 3) == [[1, 2, 3]]
    assert chunks([1, 2], 5) == [[1, 2]]

def test_empty():
    assert chunks([], 3) == []

def test_size_one():
    assert chunks(["a", "b"], 1) == [["a"], ["b"]]

def test_bad_size():
    with pytest.raises(ValueError):
        chunks([1, 2], 0)
