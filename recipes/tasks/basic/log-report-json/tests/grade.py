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


EXPECTED = {'total': 11, 'errors': 3, 'by_user': {'alice': 4, 'bob': 3, 'carol': 3, 'dave': 1}, 'slowest_path': '/api/report', 'median_ms': 410}


def report():
    data = json.loads(Path("/app/report.json").read_text())
    assert isinstance(data, dict)
    return data


@check
def total():
    assert report()["total"] == EXPECTED["total"]


@check
def errors():
    assert report()["errors"] == EXPECTED["errors"]


@check
def by_user():
    assert report()["by_user"] == EXPECTED["by_user"]


@check
def slowest_path():
    assert report()["slowest_path"] == EXPECTED["slowest_path"]


@check
def median_ms():
    assert abs(float(report()["median_ms"]) - EXPECTED["median_ms"]) < 1e-9


@check
def exact_keys():
    assert sorted(report()) == sorted(EXPECTED)


if __name__ == "__main__":
    main()
