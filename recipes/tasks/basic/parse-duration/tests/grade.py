"""Partial-credit grader: each check is independent; reward = passed / total."""
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, "/app")
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def _alarm(signum, frame):
    raise TimeoutError("check took longer than 5 s")


def main():
    signal.signal(signal.SIGALRM, _alarm)
    passed = 0
    for fn in CHECKS:
        signal.alarm(5)
        try:
            fn()
            passed += 1
            print("PASS", fn.__name__)
        except BaseException as exc:  # noqa: BLE001 - any failure of agent code is a failed check
            print("FAIL", fn.__name__, type(exc).__name__, exc)
        finally:
            signal.alarm(0)
    result = {"reward": round(passed / len(CHECKS), 4), "passed": passed, "total": len(CHECKS)}
    with open("/logs/verifier/reward.json", "w") as f:
        json.dump(result, f)
    print(result)


import importlib


def load():
    return importlib.import_module("duration").parse_duration


def raises(text):
    try:
        load()(text)
    except ValueError:
        return
    raise AssertionError(f"no ValueError for {text!r}")


@check
def single_units():
    p = load()
    assert p("45s") == 45 and p("2m") == 120 and p("3h") == 10800 and p("2d") == 172800


@check
def combined():
    p = load()
    assert p("1h30m") == 5400
    assert p("1d2h3m4s") == 93784


@check
def spaces():
    p = load()
    assert p("1h 30m") == 5400
    assert p("  1d 2h 3m 4s ") == 93784


@check
def returns_int():
    assert type(load()("90s")) is int


@check
def big_numbers():
    assert load()("100h 0m") == 360000


@check
def rejects_empty_and_bare_number():
    raises("")
    raises("   ")
    raises("10")


@check
def rejects_bad_units():
    raises("5x")
    raises("h")
    raises("1h 5")


@check
def rejects_order_and_repeats():
    raises("30m1h")
    raises("1h1h")
    raises("5s 1m")


@check
def rejects_signs_and_fractions():
    raises("-5m")
    raises("1.5h")


if __name__ == "__main__":
    main()
