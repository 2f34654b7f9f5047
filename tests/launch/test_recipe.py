"""Recipe schema and loader: key paths and accepted values in errors, --set, diff, bundled recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.errors import ConfigError
from stacx.launch.loader import (
    apply_overrides,
    convert,
    diff,
    load_recipe,
    parse_value,
    to_dict,
    to_toml,
)
from stacx.launch.plan import roles_for
from stacx.launch.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(
    p
    for p in (ROOT / "recipes").rglob("*.toml")
    if "tasks" not in p.relative_to(ROOT / "recipes").parts
)


def _error(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as info:
        convert(data, source="r.toml")
    return str(info.value)


def test_unknown_key_names_path_and_accepted_keys() -> None:
    msg = _error({"name": "x", "trainer": {"stepz": 2}})
    assert "unknown key trainer.stepz" in msg
    assert "steps" in msg.split("accepted:")[1]
    assert msg.startswith("r.toml:")


def test_unknown_top_level_section() -> None:
    msg = _error({"name": "x", "trainr": {}})
    assert "unknown key trainr" in msg and "trainer" in msg


def test_wrong_type_names_path() -> None:
    msg = _error({"name": "x", "tasks": {"group_size": "four"}})
    assert "tasks.group_size" in msg and "int" in msg


def test_choice_lists_accepted_values() -> None:
    msg = _error({"name": "x", "algorithm": {"name": "ppo"}})
    assert "algorithm.name" in msg
    for value in ("grpo", "sft", "dagger", "aggrevate", "opd", "eval"):
        assert repr(value) in msg


def test_nested_section_wrong_type() -> None:
    msg = _error({"name": "x", "placement": {"rollout": {"gpus": "all"}}})
    assert "placement.rollout.gpus" in msg


def test_set_values_parse_as_toml_literals() -> None:
    assert parse_value("2") == 2
    assert parse_value("1e-5") == 1e-5
    assert parse_value("true") is True
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value('"x y"') == "x y"
    assert parse_value("/some/path") == "/some/path"  # not a TOML literal: the string
    assert parse_value("none") is None


def test_set_overrides_nested_keys(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('name = "r"\n[trainer]\nsteps = 5\n')
    r = load_recipe(f, ["trainer.steps=2", "tasks.group_size=3", "model.path=/ckpt/x"])
    assert (r.trainer.steps, r.tasks.group_size, r.model.path) == (2, 3, "/ckpt/x")


def test_opd_knobs_reach_the_trainer_from_algorithm_imitation(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('name = "r"\n[algorithm]\nname = "opd"\n[teacher]\npath = "default"\n')
    r = load_recipe(
        f, ["algorithm.imitation.opd_discount=1.0", "algorithm.imitation.opd_grpo_weight=0.5"]
    )
    assert (r.trainer.opd_discount, r.trainer.opd_grpo_weight) == (1.0, 0.5)
    assert not r.trainer.opd_center
    assert load_recipe(f, ["algorithm.imitation.opd_center=true"]).trainer.opd_center
    with pytest.raises(ConfigError, match=r"trainer\.opd_discount = 0\.5 contradicts"):
        load_recipe(f, ["algorithm.imitation.opd_discount=1.0", "trainer.opd_discount=0.5"])
    with pytest.raises(ConfigError, match=r"algorithm\.imitation\.opd_discount = 2\.0"):
        load_recipe(f, ["algorithm.imitation.opd_discount=2.0"])


def test_set_typo_fails_like_a_file_typo(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('name = "r"\n')
    with pytest.raises(ConfigError, match=r"unknown key trainer\.stepz"):
        load_recipe(f, ["trainer.stepz=2"])
    with pytest.raises(ConfigError, match=r"expected key\.path=value"):
        load_recipe(f, ["trainer.steps"])
    with pytest.raises(ConfigError, match="name is a value, not a table"):
        apply_overrides({"name": "r"}, ["name.x=1"])


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such recipe file"):
        load_recipe(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(bad)


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    f = tmp_path / "my_run.toml"
    f.write_text("")
    assert load_recipe(f).name == "my_run"


def test_recipe_is_frozen() -> None:
    r = convert({"name": "x"})
    with pytest.raises(AttributeError):
        r.name = "y"  # type: ignore[misc]


def test_resolved_recipe_round_trips_through_printed_toml(tmp_path: Path) -> None:
    r = convert({"name": "x", "trainer": {"steps": 7}, "tasks": {"include": ["a", "b"]}})
    printed = tmp_path / "printed.toml"
    printed.write_text(to_toml(to_dict(r)))
    assert load_recipe(printed) == r


def test_diff_lists_changed_leaves() -> None:
    a = to_dict(convert({"name": "x"}))
    b = to_dict(convert({"name": "x", "trainer": {"steps": 9}, "agent": {"max_turns": 1}}))
    lines = diff(a, b)
    assert any(line.startswith("trainer.steps: ") and line.endswith("-> 9") for line in lines)
    assert any(line.startswith("agent.max_turns:") for line in lines)
    assert len(lines) == 2


def test_unknown_role_in_builders() -> None:
    r = convert({"name": "x", "placement": {"builders": {"trainr": "m:f"}}})
    with pytest.raises(
        ConfigError, match="unknown role 'trainr'; accepted: rollout, trainer, teacher"
    ):
        roles_for(r)
    # a builder for a role this recipe does not start is fine (one table serves eval and train)
    ev = convert(
        {"name": "x", "algorithm": {"name": "eval"}, "placement": {"builders": {"trainer": "m:f"}}}
    )
    assert [x.name for x in roles_for(ev)] == ["rollout"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundled_recipe_validates(path: Path) -> None:
    r = load_recipe(path)
    assert isinstance(r, Recipe)
    roles = {x.name for x in roles_for(r)}
    assert "rollout" in roles
    assert ("trainer" in roles) == (not r.is_eval)
    assert ("teacher" in roles) == (r.algorithm.name in ("dagger", "opd"))


def test_recipe_matrix_is_complete() -> None:
    names = {p.relative_to(ROOT / "recipes").as_posix() for p in RECIPES}
    for algo in ("sft", "grpo", "dagger", "aggrevate", "opd"):
        for size in ("tiny", "4b", "8b"):
            assert f"swe/{algo}_{size}.toml" in names
    assert "quickstart.toml" in names
    assert any(n.startswith("eval/") for n in names)


def test_agent_format_lists_accepted_values() -> None:
    msg = _error({"name": "x", "agent": {"format": "xml"}})
    assert "agent.format" in msg and "'tool_call'" in msg and "'bash'" in msg


def test_task_filters_by_difficulty_and_name_the_bad_value() -> None:
    from stacx.launch.launcher import select_tasks

    recipe = convert(
        {"name": "x", "tasks": {"path": "basic", "difficulty": ["trivial"], "exclude": ["*-file"]}}
    )
    ids = [ref.task_id for ref in select_tasks(recipe)]
    assert len(ids) == 8 and not any(i.endswith("-file") for i in ids)
    bad = convert({"name": "x", "tasks": {"path": "basic", "difficulty": ["trival"]}})
    with pytest.raises(ConfigError, match=r"tasks.difficulty: \['trival'\].*accepted: easy"):
        select_tasks(bad)
