import sys
import time

import pytest

sys.path.insert(0, "/app")
from lru import LRUCache  # noqa: E402


def test_basic():
    c = LRUCache(2)
    c.put(1, "a")
    c.put(2, "b")
    assert c.get(1) == "a"
    c.put(3, "c")          # evicts 2 (1 was used more recently)
    assert c.get(2) == -1
    assert c.get(3) == "c"
    assert c.get(1) == "a"
    assert len(c) == 2


def test_update_refreshes():
    c = LRUCache(2)
    c.put("x", 1)
    c.put("y", 2)
    c.put("x", 10)         # update makes x most recent
    c.put("z", 3)          # evicts y
    assert c.get("y") == -1
    assert c.get("x") == 10
    assert len(c) == 2


def test_capacity_one():
    c = LRUCache(1)
    c.put(1, 1)
    c.put(2, 2)
    assert c.get(1) == -1
    assert c.get(2) == 2


def test_missing():
    assert LRUCache(3).get("nope") == -1


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_fast():
    c = LRUCache(1000)
    start = time.perf_counter()
    for i in range(100_000):
        c.put(i, i)
        c.get(i - 500)
    assert time.perf_counter() - start < 5
    assert len(c) == 1000
    assert c.get(99_999) == 99_999
    assert c.get(0) == -1
