"""Generate the bundled long-tail task set recipes/tasks/longtail/ (Harbor tasks).

Each task is a trivial arithmetic question for the ReTool agent (its final answer in
``\\boxed{}``, written to ``metadata.answer_path``), with a task-specific sandbox time: its
verifier (tests/test.sh) sleeps ``metadata.sandbox_s`` seconds before it checks the answer.
The sleeps are heavy-tailed and fixed per task (the slowest task 20x the median), so a
synchronous GRPO step, which waits for every group of its batch, waits for its slowest task,
while an asynchronous one trains on the groups that are done. The schedule of 32 tasks:

======== ===== =====
sandbox  tasks share
======== ===== =====
1 s      18    56 %
2 s      6     19 %
4 s      4     12 %
10 s     2     6 %
20 s     2     6 %
======== ===== =====

(median 1 s, mean 3.3 s, slowest 20 s). The tasks need no image (the process backend runs
them) and carry an environment/Dockerfile (python:3.11-slim) for the Docker backend. Turn
counts are the agent's (``agent.max_turns``): a model that boxes an answer at once ends in one
turn, one that runs Python first takes more. Deterministic: the same seed writes the same
bytes::

    python tools/make_longtail.py            # writes recipes/tasks/longtail/lt-*/
    python tools/make_longtail.py --check    # exits 1 if the committed files differ
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "recipes" / "tasks" / "longtail"
SEED = 20261202
SCHEDULE = [(1, 18), (2, 6), (4, 4), (10, 2), (20, 2)]  # (sandbox seconds, tasks)

TASK_TOML = """version = "1.0"

[metadata]
difficulty = "trivial"
category = "long-tail"
expected = "{answer}"
sandbox_s = {sleep}
answer_path = "/logs/agent/answer.txt"

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 600.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
allow_internet = false
"""

TEST_SH = """#!/bin/bash
# Verifier: the task's sandbox time ({sleep} s, fixed: the set's long tail), then the answer
# check: reward 1 if /logs/agent/answer.txt holds {answer} (spaces, $ and a trailing .0 ignored).
set +e
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
sleep {sleep}
got=$(tr -d ' \\n\\r$' < /logs/agent/answer.txt 2>/dev/null)
got=${{got%.0}}
if [ "$got" = "{answer}" ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
"""

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\n"


def tasks() -> dict[str, dict[str, str]]:
    """Task name -> {relative file path: content}."""
    rng = random.Random(SEED)
    sleeps = [s for s, n in SCHEDULE for _ in range(n)]
    rng.shuffle(sleeps)
    out: dict[str, dict[str, str]] = {}
    for i, sleep in enumerate(sleeps):
        a, b = rng.randrange(10), rng.randrange(10)
        answer = str(a + b)
        out[f"lt-{i:02d}"] = {
            "instruction.md": f"What is {a} + {b}?\n",
            "task.toml": TASK_TOML.format(answer=answer, sleep=sleep),
            "tests/test.sh": TEST_SH.format(answer=answer, sleep=sleep),
            "solution/solve.sh": f"#!/bin/bash\nmkdir -p /logs/agent\necho {answer} > /logs/agent/answer.txt\n",
            "environment/Dockerfile": DOCKERFILE,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed files differ")
    args = ap.parse_args()
    differ = []
    for name, files in tasks().items():
        for rel, text in files.items():
            path = OUT / name / rel
            if args.check:
                if not path.is_file() or path.read_text() != text:
                    differ.append(str(path))
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if rel.endswith(".sh"):
                path.chmod(0o755)
    if differ:
        print("differ:", *differ, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
