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


def mod():
    return importlib.import_module("roman")


def raises(fn, arg):
    try:
        fn(arg)
    except ValueError:
        return
    raise AssertionError(f"no ValueError for {arg!r}")


REF = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 900: "CM",
       1994: "MCMXCIV", 2024: "MMXXIV", 3999: "MMMCMXCIX", 444: "CDXLIV", 58: "LVIII"}


@check
def to_roman_known():
    for n, s in REF.items():
        assert mod().to_roman(n) == s, (n, s)


@check
def to_roman_range():
    m = mod()
    raises(m.to_roman, 0)
    raises(m.to_roman, 4000)
    raises(m.to_roman, -3)


@check
def from_roman_known():
    for n, s in REF.items():
        assert mod().from_roman(s) == n, (n, s)


@check
def roundtrip_all():
    m = mod()
    for n in range(1, 4000):
        assert m.from_roman(m.to_roman(n)) == n


@check
def from_roman_rejects_noncanonical():
    m = mod()
    for bad in ["IIII", "IC", "VX", "MMMM", "IIV", "XXXX", "DD", "VV"]:
        raises(m.from_roman, bad)


@check
def from_roman_rejects_junk():
    m = mod()
    for bad in ["", "abc", "iv", "X I", "12"]:
        raises(m.from_roman, bad)


if __name__ == "__main__":
    main()
