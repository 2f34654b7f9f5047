"""Generate the bundled math set recipes/tasks/math/ (answer tasks, stacx.harbor.tasks format).

Three tiers, each a `difficulty`:

- trivial: single-digit addition, "What is 3 + 4?" (all 100 pairs of 0..9);
- easy:    two-digit +, -, * ("What is 47 - 58?"; differences may be negative);
- medium:  multi-step word problems (two or three operations on small numbers).

Every tier is split into train and held-out problems with no problem text in both; the split
is in the file (train.jsonl, heldout.jsonl) and in the id ("train-easy-007"), so a recipe picks
it with `tasks.include = ["train-*"]`. Deterministic: the same seed writes the same bytes, so
the committed files are reproducible::

    python tools/make_arith.py            # writes recipes/tasks/math/{train,heldout}.jsonl
    python tools/make_arith.py --check    # exits 1 if the committed files differ
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "recipes" / "tasks" / "math"
SEED = 20250711
HELDOUT_FRACTION = 0.2
N_EASY = 250
N_MEDIUM = 250

Problem = tuple[str, int]  # (text, answer)

_NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jon")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")


def trivial() -> list[Problem]:
    return [(f"What is {a} + {b}?", a + b) for a in range(10) for b in range(10)]


def easy(rng: random.Random) -> Problem:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    op = rng.choice("+-*")
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return f"What is {a} {op} {b}?", answer


def _gain_loss(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(5, 40), rng.randint(2, 30)
    c = rng.randint(1, a + b)
    text = (
        f"{name} has {a} {item}. {name} gets {b} more and then gives {c} to a friend. "
        f"How many {item} does {name} have now?"
    )
    return text, a + b - c


def _boxes(rng: random.Random) -> Problem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(3, 12), rng.randint(2, 9)
    c = rng.randint(1, a * b - 1)
    text = (
        f"A box holds {a} {item}. {name} fills {b} boxes and then takes out {c} {item}. "
        f"How many {item} are left in the boxes?"
    )
    return text, a * b - c


def _change(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    bill = next(x for x in (20, 50, 100) if x > a * b)
    text = (
        f"{name} buys {a} notebooks at {b} dollars each and pays with a {bill}-dollar bill. "
        f"How many dollars of change does {name} get?"
    )
    return text, bill - a * b


def _reading(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    a, b, c = rng.randint(5, 30), rng.randint(2, 9), rng.randint(1, 40)
    text = (
        f"{name} reads {a} pages a day for {b} days, then reads {c} more pages. "
        f"How many pages has {name} read in total?"
    )
    return text, a * b + c


def _groups(rng: random.Random) -> Problem:
    size, groups, each = rng.randint(2, 6), rng.randint(2, 8), rng.randint(2, 5)
    text = (
        f"There are {size * groups} students in a class. They split into groups of {size}, "
        f"and each group needs {each} markers. How many markers are needed?"
    )
    return text, groups * each


def _half(rng: random.Random) -> Problem:
    name = rng.choice(_NAMES)
    a, b = 2 * rng.randint(5, 50), rng.randint(1, 40)
    text = (
        f"{name} had {a} dollars, spent half of it on a book, and then earned {b} dollars. "
        f"How many dollars does {name} have now?"
    )
    return text, a // 2 + b


MEDIUM: tuple[Callable[[random.Random], Problem], ...] = (
    _gain_loss,
    _boxes,
    _change,
    _reading,
    _groups,
    _half,
)


def medium(rng: random.Random) -> Problem:
    return rng.choice(MEDIUM)(rng)


def unique(rng: random.Random, make: Callable[[random.Random], Problem], n: int) -> list[Problem]:
    """`n` problems with distinct texts (so no problem is in both splits)."""
    seen: dict[str, int] = {}
    while len(seen) < n:
        text, answer = make(rng)
        seen.setdefault(text, answer)
    return list(seen.items())


def build(seed: int = SEED) -> dict[str, list[dict[str, object]]]:
    """split -> records, ordered by tier then index."""
    rng = random.Random(seed)
    tiers = {
        "trivial": trivial(),
        "easy": unique(rng, easy, N_EASY),
        "medium": unique(rng, medium, N_MEDIUM),
    }
    out: dict[str, list[dict[str, object]]] = {"train": [], "heldout": []}
    for tier, problems in tiers.items():
        rng.shuffle(problems)
        cut = round(len(problems) * HELDOUT_FRACTION)
        for split, part in (("heldout", problems[:cut]), ("train", problems[cut:])):
            for i, (text, answer) in enumerate(part):
                out[split].append(
                    {
                        "id": f"{split}-{tier}-{i:03d}",
                        "problem": text,
                        "answer": str(answer),
                        "difficulty": tier,
                    }
                )
    return out


def render(records: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r, sort_keys=False) + "\n" for r in records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    stale = []
    for split, records in build(args.seed).items():
        path = args.out / f"{split}.jsonl"
        text = render(records)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"{path}: {len(records)} problems")
    if stale:
        print(f"stale (rerun tools/make_arith.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
