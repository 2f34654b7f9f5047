import sys

import pytest

sys.path.insert(0, "/app")
from inventory import Inventory  # noqa: E402


def test_add_accumulates():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple", 2)
    assert inv.items == {"apple": 5}

def test_add_rejects_nonpositive():
    with pytest.raises(ValueError):
        Inventory().add("x", 0)

def test_remove_deletes_empty():
    inv = Inventory()
    inv.add("pear", 2)
    inv.remove("pear", 1)
    assert inv.items == {"pear": 1}
    inv.remove("pear", 1)
    assert inv.items == {}

def test_remove_too_many():
    inv = Inventory()
    inv.add("fig", 1)
    with pytest.raises(ValueError):
        inv.remove("fig", 2)
    with pytest.raises(ValueError):
        inv.remove("kiwi", 1)

def test_total_value():
    inv = Inventory()
    inv.add("a", 2)
    inv.add("b", 3)
    assert inv.total_value({"a": 1.5, "b": 2}) == 9

def test_low_stock_strict_and_sorted():
    inv = Inventory()
    inv.add("zucchini", 1)
    inv.add("carrot", 5)
    inv.add("beet", 2)
    inv.add("apple", 3)
    assert inv.low_stock(3) == ["beet", "zucchini"]
