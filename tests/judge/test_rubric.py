"""Rubrics (stacx.rubric), pure: parsing with named errors, score normalization and reply
parsing, aggregation and the combination rules; the task loader's and the recipe's hooks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stacx.errors import ConfigError, TaskError
from stacx.harbor.tasks import load_task
from stacx.launch.loader import convert
from stacx.rubric import (
    Combine,
    Criterion,
    aggregate,
    combine,
    normalize,
    parse_reply,
    parse_rubric,
    prompt_messages,
)

ROOT = Path(__file__).resolve().parents[2]
EXPLAIN = ROOT / "recipes" / "tasks" / "explain"

GOOD = """
[judge]
files = ["/app/a.md"]
[[criterion]]
name = "correct"
description = "Is it right?"
weight = 2.0
[[criterion]]
description = "Clear?"
type = "likert"
points = 5
[[criterion]]
name = "coverage"
description = "How much is covered?"
type = "numeric"
min = 0
max = 100
"""


def test_rubric_parses_with_rewardkit_names_and_defaults() -> None:
    r = parse_rubric(GOOD, where="judge.toml")
    assert [c.name for c in r.criterion] == ["correct", "c1", "coverage"]  # unnamed: c<index>
    assert [c.type for c in r.criterion] == ["binary", "likert", "numeric"]
    assert r.scoring.aggregation == "weighted_mean" and r.judge.mode == "batched"
    assert r.combine.rule == "weighted_sum" and r.combine.weights == {"verifier": 0.5, "judge": 0.5}
    assert r.path == "judge.toml"


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (GOOD.replace('type = "likert"', 'type = "scale"'), "$.criterion[1].type"),
        (GOOD.replace("weight = 2.0", "wieght = 2.0"), "$.criterion[0]"),
        (GOOD.replace("points = 5", "points = 1"), "criterion[1].points = 1"),
        (GOOD.replace("max = 100", "max = 0"), "criterion[2].min = 0.0, max = 0.0"),
        (GOOD.replace('files = ["/app/a.md"]', "files = []"), "judge.files"),
        (GOOD.replace('name = "coverage"', 'name = "correct"'), "names repeat"),
        (GOOD + "[scoring]\naggregation = 'mean'\n", "$.scoring.aggregation"),
        (GOOD + "[combine]\nrule = 'max'\n", "$.combine.rule"),
        (GOOD + "[combine]\nweights = { verifer = 1.0 }\n", "combine.weights: ['verifer']"),
        (GOOD + "[combine]\nrule = 'min'\nweights = { judge = 1.0 }\n", "weighted_sum' only"),
        (GOOD + "[judge.x]\n", "unknown field `x` - at `$.judge`"),
        ("[judge\n", "not valid TOML"),
        (GOOD.replace("[judge]", '[judge]\ndecoding = "choices"'), "criterion[2].type = 'numeric'"),
        ("[judge]\nfiles = ['/a']\n", "at least one [[criterion]]"),
    ],
)
def test_bad_rubric_fails_naming_the_file_and_key(edit: str, named: str) -> None:
    with pytest.raises(TaskError) as err:
        parse_rubric(edit, where="/t/tests/judge.toml")
    assert str(err.value).startswith("/t/tests/judge.toml: ")
    assert named in str(err.value)


def test_normalization_is_rewardkits_and_rejects_what_is_off_scale() -> None:
    binary = Criterion(name="b", description="d")
    likert = Criterion(name="l", description="d", type="likert", points=5)
    numeric = Criterion(name="n", description="d", type="numeric", min=0, max=100)
    assert normalize(binary, " Yes, it is.") == 1.0 and normalize(binary, "**no**") == 0.0
    assert normalize(binary, "maybe") is None and normalize(binary, "") is None
    assert normalize(likert, "4") == 0.75 and normalize(likert, "1/5") == 0.0
    assert normalize(likert, "6") is None and normalize(likert, "3.5") is None
    assert normalize(numeric, "25 percent") == 0.25 and normalize(numeric, "150") is None


def test_reply_parsing_takes_name_value_lines_and_names_what_is_missing() -> None:
    r = parse_rubric(GOOD, where="j")
    reply = "correct: yes\n- **c1**: 5\ncoverage = 50\n"
    assert parse_reply(r.criterion, reply) == ({"correct": 1.0, "c1": 1.0, "coverage": 0.5}, "")
    got, problem = parse_reply(r.criterion, "correct: yes\nc1: great")
    assert got == {"correct": 1.0}
    assert (
        "c1 (an integer from 1 to 5)" in problem and "coverage (a number from 0 to 100)" in problem
    )
    # one criterion may be answered by a bare value
    assert parse_reply(r.criterion[:1], "No.") == ({"correct": 0.0}, "")


def test_aggregations() -> None:
    r = parse_rubric(GOOD, where="j")
    scores = {"correct": 1.0, "c1": 0.25, "coverage": 0.5}
    assert aggregate(r, scores) == pytest.approx((2 * 1.0 + 0.25 + 0.5) / 4)
    for agg, expected in (("all_pass", 0.0), ("any_pass", 1.0), ("threshold", 0.0)):
        other = parse_rubric(
            GOOD + f"[scoring]\naggregation = '{agg}'\nthreshold = 0.7\n", where="j"
        )
        assert aggregate(other, scores) == expected, agg
    low = parse_rubric(GOOD + "[scoring]\naggregation = 'threshold'\nthreshold = 0.6\n", where="j")
    assert aggregate(low, scores) == 1.0  # weighted mean 0.6875 >= 0.6


def test_combination_rules() -> None:
    assert combine(Combine(), 1.0, 0.5) == 0.75  # 0.5 x verifier + 0.5 x judge
    assert combine(Combine(weights={"verifier": 0.3, "judge": 0.7}), 0.0, 1.0) == 0.7
    assert combine(Combine(weights={"judge": 1.0}), 1.0, 0.25) == 0.25  # missing weight: 0
    assert combine(Combine(rule="min"), 1.0, 0.25) == 0.25
    assert combine(Combine(rule="min"), 0.0, 0.9) == 0.0
    gated = Combine(rule="verifier_gated", gate=1.0)
    assert combine(gated, 1.0, 0.4) == 0.4  # the judge counts once the verifier passes
    assert combine(gated, 0.5, 0.9) == 0.5  # else the verifier's own reward


def test_prompt_carries_the_task_the_answer_the_reference_and_the_scales() -> None:
    r = parse_rubric(
        GOOD.replace("[judge]", '[judge]\nreference = "REF"\nmax_answer_chars = 5'), where="j"
    )
    (system, user) = prompt_messages(r, r.criterion, "Explain X.", {"/app/a.md": "abcdefgh"})
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert "Explain X." in text and "abcde\n[... cut]" in text and "REF" in text
    assert "- correct (yes or no): Is it right?" in text
    assert "- coverage (a number from 0 to 100)" in text


def test_bundled_set_declares_a_rubric_each() -> None:
    tasks = sorted(d.name for d in EXPLAIN.iterdir() if d.is_dir())
    assert 6 <= len(tasks) <= 10
    for name in tasks:
        t = load_task(EXPLAIN / name)
        assert t.rubric is not None and t.rubric.judge.files == ["/app/answer.md"], name
        assert t.rubric.path == str(EXPLAIN / name / "tests" / "judge.toml")
        assert t.rubric.combine.weights == {"verifier": 0.3, "judge": 0.7}


def _task(tmp_path: Path, extra: str, rubric: str | None = None) -> Path:
    d = tmp_path / "t"
    shutil.copytree(EXPLAIN / "explain-dns", d)
    toml = (d / "task.toml").read_text().replace('rubric = "tests/judge.toml"\n', extra)
    (d / "task.toml").write_text(toml)
    if rubric is not None:
        (d / "tests" / "judge.toml").write_text(rubric)
    return d


@pytest.mark.parametrize(
    ("extra", "rubric", "named"),
    [
        (
            'rubric = "tests/nope.toml"\n',
            None,
            "verifier.stacx.rubric = 'tests/nope.toml': no such",
        ),
        ('rubrik = "tests/judge.toml"\n', None, "verifier.stacx.rubrik: unknown key"),
        (
            'rubric = "tests/judge.toml"\n',
            GOOD.replace("points = 5", "points = 0"),
            "tests/judge.toml: criterion[1].points = 0",
        ),
    ],
)
def test_task_with_a_bad_rubric_declaration_fails_at_load(
    tmp_path: Path, extra: str, rubric: str | None, named: str
) -> None:
    with pytest.raises(TaskError) as err:
        load_task(_task(tmp_path, extra, rubric))
    assert named in str(err.value)


def test_recipe_judge_section_is_checked_at_load(tmp_path: Path) -> None:
    bad = tmp_path / "set.toml"
    bad.write_text(GOOD.replace('type = "numeric"', 'type = "percent"'))
    cases = [
        ({"judge": {"rubric": str(bad), "path": "default"}}, f"judge.rubric: {bad}: "),
        ({"judge": {"rubric": "nope.toml", "path": "default"}}, "judge.rubric = 'nope.toml'"),
        ({"judge": {"rubric": str(bad)}}, "judge.rubric: needs a judge model"),
        ({"judge": {"use": "teacher"}}, "judge.use = 'teacher': needs teacher.path"),
        (
            {
                "judge": {"use": "student"},
                "agent": {"name": "oracle"},
                "algorithm": {"name": "eval"},
            },
            "judge.use = 'student'",
        ),
        ({"judge": {"backend": "openai", "url": "http://x"}}, "backend 'openai' needs both"),
        (
            {
                "judge": {"path": "default"},
                "algorithm": {"name": "dagger"},
                "teacher": {"path": "/t"},
            },
            "[judge] with algorithm.name = 'dagger'",
        ),
    ]
    for data, named in cases:
        with pytest.raises(ConfigError) as err:
            convert({"name": "x", **data})
        assert named in str(err.value), (data, str(err.value))
    good = tmp_path / "ok.toml"
    good.write_text(GOOD)
    r = convert({"name": "x", "judge": {"path": "default", "rubric": str(good)}})
    assert r.judge.enabled and r.judge.rubric == str(good)
