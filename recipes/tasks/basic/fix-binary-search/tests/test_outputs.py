import random
import sys

sys.path.insert(0, "/app")
from search import binary_search, first_index  # noqa: E402


def test_found_everywhere():
    items = [1, 3, 5, 7, 9, 11]
    for i, x in enumerate(items):
        assert binary_search(items, x) == i

def test_absent():
    items = [1, 3, 5, 7]
    for x in [0, 2, 4, 6, 8]:
        assert binary_search(items, x) == -1

def test_small_lists():
    assert binary_search([], 1) == -1
    assert binary_search([4], 4) == 0
    assert binary_search([4], 5) == -1
    assert first_index([], 1) == -1
    assert first_index([4], 4) == 0

def test_first_index_duplicates():
    items = [1, 2, 2, 2, 3, 5, 5]
    assert first_index(items, 2) == 1
    assert first_index(items, 5) == 5
    assert first_index(items, 1) == 0
    assert first_index(items, 4) == -1
    assert first_index(items, 6) == -1

def test_random_against_reference():
    rng = random.Random(7)
    for _ in range(300):
        items = sorted(rng.randint(0, 20) for _ in range(rng.randint(0, 15)))
        target = rng.randint(-1, 21)
        i = binary_search(items, target)
        if target in items:
            assert items[i] == target
            assert first_index(items, target) == items.index(target)
        else:
            assert i == -1
            assert first_index(items, target) == -1
