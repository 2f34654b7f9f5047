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


def ev(expr):
    return importlib.import_module("calc").evaluate(expr)


def raises(expr, exc=ValueError):
    try:
        ev(expr)
    except exc:
        return
    raise AssertionError(f"no {exc.__name__} for {expr!r}")


@check
def no_eval():
    import re
    src = Path("/app/calc.py").read_text()
    # re.compile( is fine; a bare or builtins-qualified eval/exec/compile call is not
    found = re.findall(r"(?<![\w.])(?:builtins\.)?(eval|exec|compile)\s*\(", src)
    assert not found, found


@check
def precedence():
    assert ev("2+3*4") == 14
    assert ev("2*3+4") == 10


@check
def parentheses():
    assert ev("(2+3)*4") == 20
    assert ev("2*(3+(4-1))") == 12


@check
def left_associative():
    assert ev("7 - 2 - 1") == 4
    assert ev("8/2/2") == 2


@check
def unary_minus():
    assert ev("-3+5") == 2
    assert ev("-(2+1)*2") == -6
    assert ev("2*-3") == -6


@check
def division_and_types():
    r = ev("10/4")
    assert r == 2.5 and isinstance(r, float)
    r = ev("8/2")
    assert r == 4 and type(r) is int
    assert ev("1.5*2") == 3


@check
def spaces():
    assert ev("  ( 1 +2 ) *  3 ") == 9


@check
def malformed():
    for bad in ["2+", "(1+2", "1 2", "", "2 $ 3", "()", "1+2)"]:
        raises(bad)


@check
def zero_division():
    raises("1/0", ZeroDivisionError)
    raises("5/(2-2)", ZeroDivisionError)


if __name__ == "__main__":
    main()
