"""Generate the `drills` task set: many small shell tasks, from templates, in Harbor format.

    python tools/make_drills.py [--out recipes/tasks/drills] [--per-template 6] [--seed 0]

The bundled `basic` set has 26 trivial/easy tasks: too few to train a policy that generalizes,
and every one of them is needed to evaluate it. The drills are the training distribution of the
imitation experiment (recipes/imitation/, tools/imitation_gap.py): 18 skill templates (write, copy, move, delete,
count, sort, grep, head/tail, chmod, sed, ...) with random file names, words and contents, and
several phrasings each. No drill reuses a `basic` task's file names or wording, so `basic` stays
held out. Each task has an oracle solution (one command, absolute paths) and a pytest verifier;
`stacx tasks check recipes/tasks/drills --agent oracle` scores 1.0 on every one.

The output is deterministic in --seed; `tests/tasks/test_drills.py` checks the committed set is
what this script writes.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

NOUNS = tuple(
    "alpha bravo cedar delta ember falcon garnet harbor indigo juniper kettle lantern meadow "
    "nickel orchid pepper quartz raven saffron tundra umber velvet willow yarrow zephyr copper "
    "maple".split()
)
FILE_STEMS = tuple(
    "input items records entries source list notes_a report batch catalog sample table "
    "inventory queue ledger roster manifest".split()
)
DIR_NAMES = tuple("build cache tmpdir staging export assets results archive".split())

TASK_TOML = """version = "1.0"

[metadata]
difficulty = "{difficulty}"
category = "{category}"
tags = [{tags}]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 300.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
allow_internet = false
"""

DOCKERFILE = "FROM python:3.11-slim\nWORKDIR /app\n{copy}"

TEST_SH = """#!/bin/bash
# Verifier: runs /tests/test_outputs.py with pytest; reward 1 if every check passes, else 0.
set +e
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export PYTHONDONTWRITEBYTECODE=1
cd /tests || exit 0
timeout 50 python3 -m pytest -q -p no:cacheprovider test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
"""

SOLVE_SH = """#!/bin/bash
# Oracle: one command, absolute paths.
{command}
"""


@dataclass
class Drill:
    name: str
    instruction: str
    command: str
    checks: str  # the body of test_outputs.py after `from pathlib import Path`
    files: dict[str, str] = field(default_factory=dict)
    difficulty: str = "trivial"
    category: str = "file-operations"
    tags: tuple[str, ...] = ("shell",)


def _lines(rng: random.Random, n: int, words: int = 2) -> list[str]:
    return [
        " ".join(rng.choice(NOUNS) for _ in range(words)) + f" {rng.randint(1, 999)}"
        for _ in range(n)
    ]


def _fname(rng: random.Random, ext: str = "txt") -> str:
    return f"{rng.choice(FILE_STEMS)}_{rng.randint(10, 99)}.{ext}"


def _two_files(rng: random.Random) -> tuple[str, str]:
    a, b = _fname(rng), _fname(rng)
    while b == a:
        b = _fname(rng)
    return a, b


def _pick(rng: random.Random, *phrasings: str) -> str:
    return rng.choice(phrasings)


def _content_check(path: str, expected: str) -> str:
    return (
        f"def test_output():\n    p = Path({path!r})\n    assert p.is_file(), '{path} is missing'\n"
        f"    assert p.read_text().strip() == {expected.strip()!r}\n"
    )


def _lines_check(test: str, path: str, want: list[str], split: str = "splitlines") -> str:
    return f"def test_{test}():\n    assert Path('{path}').read_text().{split}() == {want!r}\n"


def _text_drill(
    name: str, ins: str, command: str, check: str, src: str, lines: list[str], *tags: str
) -> Drill:
    """An easy text-processing drill that reads the lines `lines` from /app/`src`."""
    return Drill(
        name, ins, command, check, {src: "\n".join(lines) + "\n"}, "easy", "text-processing", tags
    )


def write_word(rng: random.Random) -> Drill:
    w, f = rng.choice(NOUNS), _fname(rng)
    ins = _pick(
        rng,
        f"Write the word `{w}` into the file `/app/{f}`.",
        f"Create `/app/{f}` containing only the word `{w}`.",
        f"Put the text `{w}` in a new file named `{f}` inside `/app`.",
    )
    return Drill("write-word", ins, f"echo {w} > /app/{f}", _content_check(f"/app/{f}", w))


def write_number(rng: random.Random) -> Drill:
    n, f = rng.randint(2, 9999), _fname(rng)
    ins = _pick(
        rng,
        f"Save the number `{n}` to `/app/{f}` (just the number).",
        f"Write {n} into a file called `{f}` in `/app`.",
    )
    return Drill("write-number", ins, f"echo {n} > /app/{f}", _content_check(f"/app/{f}", str(n)))


def make_dir(rng: random.Random) -> Drill:
    parts = [rng.choice(DIR_NAMES)] + [rng.choice(NOUNS) for _ in range(rng.randint(0, 2))]
    d = "/app/" + "/".join(parts)
    ins = _pick(
        rng,
        f"Create the directory `{d}`.",
        f"Make a directory at `{d}` (create parent directories as needed).",
    )
    check = f"def test_dir():\n    assert Path({d!r}).is_dir(), '{d} is not a directory'\n"
    return Drill("make-dir", ins, f"mkdir -p {d}", check, tags=("directories", "shell"))


def copy_file(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    text = "\n".join(_lines(rng, 3)) + "\n"
    ins = _pick(
        rng,
        f"Copy `/app/{a}` to `/app/{b}`.",
        f"Make a copy of `/app/{a}` named `/app/{b}`; keep the original.",
    )
    check = (
        f"def test_copy():\n    assert Path('/app/{a}').read_text() == {text!r}\n"
        f"    assert Path('/app/{b}').read_text() == {text!r}\n"
    )
    return Drill("copy-file", ins, f"cp /app/{a} /app/{b}", check, {a: text})


def move_file(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    text = "\n".join(_lines(rng, 2)) + "\n"
    ins = _pick(
        rng,
        f"Rename `/app/{a}` to `/app/{b}`.",
        f"Move the file `/app/{a}` to `/app/{b}`.",
    )
    check = (
        f"def test_move():\n    assert not Path('/app/{a}').exists()\n"
        f"    assert Path('/app/{b}').read_text() == {text!r}\n"
    )
    return Drill("move-file", ins, f"mv /app/{a} /app/{b}", check, {a: text})


def delete_file(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    ins = _pick(
        rng,
        f"Delete the file `/app/{a}`. Leave `/app/{b}` alone.",
        f"Remove `/app/{a}` but keep `/app/{b}`.",
    )
    check = (
        f"def test_delete():\n    assert not Path('/app/{a}').exists()\n"
        f"    assert Path('/app/{b}').is_file()\n"
    )
    return Drill("delete-file", ins, f"rm /app/{a}", check, {a: "old\n", b: "keep\n"})


def touch_file(rng: random.Random) -> Drill:
    f = f"{rng.choice(NOUNS)}.{rng.choice(('lock', 'flag', 'ok', 'marker'))}"
    ins = _pick(
        rng, f"Create an empty file `/app/{f}`.", f"Touch a new empty file named `{f}` in `/app`."
    )
    check = (
        f"def test_empty():\n    p = Path('/app/{f}')\n    assert p.is_file()\n"
        "    assert p.stat().st_size == 0\n"
    )
    return Drill("touch-file", ins, f"touch /app/{f}", check)


def count_lines(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    lines = _lines(rng, rng.randint(4, 30))
    ins = _pick(
        rng,
        f"Write the number of lines of `/app/{a}` into `/app/{b}` (only the number).",
        f"How many lines does `/app/{a}` have? Save just that number to `/app/{b}`.",
    )
    check = _content_check(f"/app/{b}", str(len(lines)))
    return _text_drill("count-lines", ins, f"wc -l < /app/{a} > /app/{b}", check, a, lines, "wc")


def count_words(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    lines = _lines(rng, rng.randint(2, 6), words=rng.randint(1, 4))
    n = sum(len(x.split()) for x in lines)
    ins = _pick(
        rng,
        f"Count the words in `/app/{a}` and write the count (just the number) into `/app/{b}`.",
        f"Save the number of words of `/app/{a}` to `/app/{b}`.",
    )
    check = _content_check(f"/app/{b}", str(n))
    return _text_drill("count-words", ins, f"wc -w < /app/{a} > /app/{b}", check, a, lines, "wc")


def sort_lines(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    words = rng.sample(NOUNS, rng.randint(4, 9))
    ins = _pick(
        rng,
        f"Sort the lines of `/app/{a}` alphabetically and write them to `/app/{b}`.",
        f"Write the lines of `/app/{a}` in sorted (A to Z) order into `/app/{b}`.",
    )
    check = _lines_check("sorted", f"/app/{b}", sorted(words), "split")
    return _text_drill("sort-lines", ins, f"sort /app/{a} > /app/{b}", check, a, words, "sort")


def unique_lines(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    words = rng.sample(NOUNS, rng.randint(3, 6))
    dup = words + rng.choices(words, k=rng.randint(2, 5))
    rng.shuffle(dup)
    ins = _pick(
        rng,
        f"Write the distinct lines of `/app/{a}`, sorted, one per line, into `/app/{b}`.",
        f"Remove duplicate lines from `/app/{a}` (sorted output) and save the result as `/app/{b}`.",
    )
    check = _lines_check("unique", f"/app/{b}", sorted(words), "split")
    command = f"sort -u /app/{a} > /app/{b}"
    return _text_drill("unique-lines", ins, command, check, a, dup, "sort", "uniq")


def grep_lines(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    key = rng.choice(("WARN", "FAIL", "TODO", "OK", "SKIP"))
    lines = [f"{rng.choice((key, 'INFO', 'NOTE'))} {x}" for x in _lines(rng, rng.randint(6, 12), 1)]
    lines[0] = f"{key} {lines[0].split(' ', 1)[1]}"
    want = [x for x in lines if key in x]
    ins = _pick(
        rng,
        f"Write every line of `/app/{a}` that contains `{key}` into `/app/{b}`, in order.",
        f"Copy the lines containing `{key}` from `/app/{a}` to `/app/{b}`.",
    )
    check = (
        f"def test_grep():\n    got = Path('/app/{b}').read_text().splitlines()\n"
        f"    assert got == {want!r}\n"
    )
    return _text_drill(
        "grep-lines", ins, f"grep {key} /app/{a} > /app/{b}", check, a, lines, "grep"
    )


def _head_or_tail(rng: random.Random, head: bool) -> Drill:
    a, b = _two_files(rng)
    lines = _lines(rng, 10)
    n = rng.randint(1, 5)
    first, final, tool = ("first", "first", "head") if head else ("last", "final", "tail")
    ins = _pick(
        rng,
        f"Write the {first} {n} lines of `/app/{a}` into `/app/{b}`.",
        f"Save the {final} {n} lines of `/app/{a}` as `/app/{b}`.",
    )
    check = _lines_check(tool, f"/app/{b}", lines[:n] if head else lines[-n:])
    command = f"{tool} -n {n} /app/{a} > /app/{b}"
    return _text_drill(f"{tool}-lines", ins, command, check, a, lines, tool)


def head_lines(rng: random.Random) -> Drill:
    return _head_or_tail(rng, head=True)


def tail_lines(rng: random.Random) -> Drill:
    return _head_or_tail(rng, head=False)


def chmod_exec(rng: random.Random) -> Drill:
    f = f"{rng.choice(NOUNS)}.sh"
    ins = _pick(
        rng, f"Make `/app/{f}` executable.", f"Give the script `/app/{f}` execute permission."
    )
    check = (
        f"import os\n\ndef test_exec():\n    assert os.access('/app/{f}', os.X_OK)\n"
        f"    assert Path('/app/{f}').read_text() == 'echo hi\\n'\n"
    )
    return Drill(
        "chmod-exec", ins, f"chmod +x /app/{f}", check, {f: "echo hi\n"}, tags=("permissions",)
    )


def replace_word(rng: random.Random) -> Drill:
    f = _fname(rng, "cfg")
    old, new = rng.sample(NOUNS, 2)
    lines = [f"{old} = {rng.randint(1, 9)}", f"name {rng.choice(NOUNS)}", f"# {old} again {old}"]
    ins = _pick(
        rng,
        f"In `/app/{f}`, replace every `{old}` with `{new}` (edit the file in place).",
        f"Edit `/app/{f}` in place so that each occurrence of `{old}` becomes `{new}`.",
    )
    check = _lines_check("sed", f"/app/{f}", [x.replace(old, new) for x in lines])
    command = f"sed -i 's/{old}/{new}/g' /app/{f}"
    return _text_drill("replace-word", ins, command, check, f, lines, "sed")


def append_line(rng: random.Random) -> Drill:
    f, w = _fname(rng), rng.choice(NOUNS)
    lines = _lines(rng, rng.randint(1, 4))
    ins = _pick(
        rng,
        f"Append a line `{w}` to the end of `/app/{f}`.",
        f"Add the line `{w}` at the end of `/app/{f}`, keeping the existing lines.",
    )
    check = _lines_check("append", f"/app/{f}", [*lines, w])
    return Drill("append-line", ins, f"echo {w} >> /app/{f}", check, {f: "\n".join(lines) + "\n"})


def python_print(rng: random.Random) -> Drill:
    f, w = f"{rng.choice(NOUNS)}.py", f"{rng.choice(NOUNS)} {rng.choice(NOUNS)}"
    ins = _pick(
        rng,
        f"Write a Python script `/app/{f}` that prints `{w}`.",
        f"Create `/app/{f}`, a Python program printing exactly `{w}`.",
    )
    check = (
        "import subprocess\n\ndef test_prints():\n"
        f"    out = subprocess.run(['python3', '/app/{f}'], capture_output=True, text=True)\n"
        f"    assert out.stdout.strip() == {w!r}\n"
    )
    return Drill(
        "python-print",
        ins,
        f"echo 'print(\"{w}\")' > /app/{f}",
        check,
        category="programming",
        tags=("python",),
    )


def upper_case(rng: random.Random) -> Drill:
    a, b = _two_files(rng)
    lines = _lines(rng, 3)
    ins = _pick(
        rng,
        f"Write the content of `/app/{a}` in upper case into `/app/{b}`.",
        f"Convert `/app/{a}` to capital letters and save it as `/app/{b}`.",
    )
    check = _lines_check("upper", f"/app/{b}", [x.upper() for x in lines])
    command = f"tr a-z A-Z < /app/{a} > /app/{b}"
    return _text_drill("upper-case", ins, command, check, a, lines, "tr")


TEMPLATES: tuple[Callable[[random.Random], Drill], ...] = (
    write_word,
    write_number,
    make_dir,
    copy_file,
    move_file,
    delete_file,
    touch_file,
    count_lines,
    count_words,
    sort_lines,
    unique_lines,
    grep_lines,
    head_lines,
    tail_lines,
    chmod_exec,
    replace_word,
    append_line,
    python_print,
    upper_case,
)


def write_task(drill: Drill, task_dir: Path) -> None:
    env = task_dir / "environment"
    (env / "files").mkdir(parents=True)
    for name, text in drill.files.items():
        (env / "files" / name).write_text(text)
    copy = "COPY files/ /app/\n" if drill.files else ""
    (env / "Dockerfile").write_text(DOCKERFILE.format(copy=copy))
    if not drill.files:
        (env / "files").rmdir()
    (task_dir / "instruction.md").write_text(drill.instruction + "\n")
    tags = ", ".join(f'"{t}"' for t in drill.tags)
    (task_dir / "task.toml").write_text(
        TASK_TOML.format(difficulty=drill.difficulty, category=drill.category, tags=tags)
    )
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text(SOLVE_SH.format(command=drill.command))
    (task_dir / "tests").mkdir()
    (task_dir / "tests" / "test.sh").write_text(TEST_SH)
    (task_dir / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\n" + drill.checks
    )
    for script in (task_dir / "solution" / "solve.sh", task_dir / "tests" / "test.sh"):
        script.chmod(0o755)


def generate(out: Path, *, per_template: int = 6, seed: int = 0) -> list[str]:
    """Write the set into `out` (replaced); returns the task ids."""
    rng = random.Random(seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ids = []
    for template in TEMPLATES:
        for i in range(per_template):
            drill = template(rng)
            task_id = f"{drill.name}-{i + 1}"
            write_task(drill, out / task_id)
            ids.append(task_id)
    return ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("recipes/tasks/drills"))
    p.add_argument("--per-template", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ids = generate(args.out, per_template=args.per_template, seed=args.seed)
    print(f"{len(ids)} tasks in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
