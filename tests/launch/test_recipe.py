"""Recipe schema and loader: key paths and accepted values in errors, --set, diff, bundled recipes."""

from __future__ import annotations

import tomllib
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
        ConfigError, match="unknown role 'trainr'; accepted: engine, rollout, trainer, teacher"
    ):
        roles_for(r)
    # a builder for a role this recipe does not start is fine (one table serves eval and train)
    ev = convert(
        {"name": "x", "algorithm": {"name": "eval"}, "placement": {"builders": {"trainer": "m:f"}}}
    )
    assert [x.name for x in roles_for(ev)] == ["rollout"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundled_recipe_validates(path: Path) -> None:
    overrides = []
    data = tomllib.loads(path.read_text())
    teacher = data.get("teacher", {})
    if data.get("algorithm", {}).get("name") in ("dagger", "aggrevate", "opd") and not (
        teacher.get("path") or teacher.get("url")
    ):
        # a recipe whose header says `--set teacher.path=...`: without it, it must not load
        with pytest.raises(ConfigError, match=r"teacher\.path"):
            load_recipe(path)
        overrides = ["teacher.path=runs/gap/teacher-model"]
    r = load_recipe(path, overrides)
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
    from stacx.launch.launcher import selection

    recipe = convert(
        {"name": "x", "tasks": {"path": "basic", "difficulty": ["trivial"], "exclude": ["*-file"]}}
    )
    ids = [ref.task_id for ref in selection(recipe)[0]]
    assert len(ids) == 8 and not any(i.endswith("-file") for i in ids)
    bad = convert({"name": "x", "tasks": {"path": "basic", "difficulty": ["trival"]}})
    with pytest.raises(ConfigError, match=r"tasks.difficulty: \['trival'\].*accepted: easy"):
        selection(bad)[0]


# ---- cross-checks: a setting the path does not honour, or a combination that cannot work ----


def test_trainer_gpus_must_match_its_world_size() -> None:
    msg = _error({"name": "x", "placement": {"trainer": {"gpus": 4}}})
    assert msg.startswith("r.toml:") and "placement.trainer.gpus = 4" in msg
    assert "trainer.world_size = 1" in msg and "one rank per GPU" in msg
    assert convert({"name": "x", "placement": {"trainer": {"gpus": 1}}}).placement.trainer.gpus == 1
    four = {"name": "x", "trainer": {"world_size": 4}, "placement": {"trainer": {"gpus": 4}}}
    assert convert(four).trainer.world_size == 4


def test_trainer_keys_the_algorithm_decides_are_checked_at_load() -> None:
    msg = _error({"name": "x", "trainer": {"steps_per_iteration": 2}})
    assert "trainer.steps_per_iteration = 2: accepted values are 1 for grpo" in msg
    msg = _error({"name": "x", "algorithm": {"name": "sft"}, "trainer": {"min_ready": 99}})
    assert "trainer.min_ready = 99" in msg
    epochs = {"name": "x", "algorithm": {"name": "sft"}, "trainer": {"steps_per_iteration": 2}}
    assert convert(epochs).trainer.steps_per_iteration == 2


def test_openai_engine_cannot_serve_a_training_run() -> None:
    url = "http://127.0.0.1:1"
    msg = _error({"name": "x", "engine": {"backend": "openai", "url": url}})
    assert "engine.backend = 'openai'" in msg and "weights" in msg
    ok = {"name": "x", "algorithm": {"name": "eval"}, "engine": {"backend": "openai", "url": url}}
    assert convert(ok).engine.backend == "openai"  # eval never loads weights


def test_openai_engine_needs_a_url() -> None:
    msg = _error({"name": "x", "algorithm": {"name": "eval"}, "engine": {"backend": "openai"}})
    assert "engine.url" in msg


@pytest.mark.parametrize("agent", ["oracle", "null"])
@pytest.mark.parametrize("algo", ["grpo", "opd", "dagger", "aggrevate"])
def test_scripted_agent_with_an_on_policy_algorithm_is_rejected(agent: str, algo: str) -> None:
    data = {
        "name": "x",
        "agent": {"name": agent},
        "algorithm": {"name": algo},
        "teacher": {"path": "default"},
    }
    msg = _error(data)
    assert f"agent.name = {agent!r}" in msg and algo in msg


@pytest.mark.parametrize("algo", ["sft", "eval"])
def test_scripted_agent_serves_sft_and_eval(algo: str) -> None:
    r = convert({"name": "x", "agent": {"name": "oracle"}, "algorithm": {"name": algo}})
    assert r.scripted_agent


@pytest.mark.parametrize("algo", ["dagger", "aggrevate", "opd"])
def test_teacher_algorithm_without_a_teacher_is_rejected(algo: str) -> None:
    msg = _error({"name": "x", "algorithm": {"name": algo}})
    assert "teacher.path" in msg and repr(algo) in msg


@pytest.mark.parametrize(
    "key,value",
    [
        ("engine.device", "cuda"),
        ("engine.max_batch", 64),
        ("engine.max_len", 32768),
        ("engine.tp", 2),
        ("model.dtype", "bfloat16"),
    ],
)
def test_server_settings_beside_an_engine_url_are_rejected(key: str, value: object) -> None:
    section, leaf = key.split(".")
    data: dict[str, object] = {"name": "x", "algorithm": {"name": "eval"}}
    data["engine"] = {"backend": "sglang", "url": "http://127.0.0.1:1"}
    data.setdefault(section, {})[leaf] = value  # type: ignore[index]
    msg = _error(data)
    assert f"{key} = {value!r}" in msg and "engine.url" in msg


@pytest.mark.parametrize("key,value", [("tp", 2), ("mem_fraction", 0.5)])
def test_sglang_only_settings_on_the_torch_engine_are_rejected(key: str, value: object) -> None:
    msg = _error({"name": "x", "engine": {"backend": "torch", key: value}})
    assert f"engine.{key} = {value!r}" in msg and "sglang only" in msg


def test_a_paged_kv_cache_is_a_torch_engine_setting() -> None:
    assert convert({"name": "x", "engine": {"kv_cache": "paged"}}).engine.kv_cache == "paged"
    msg = _error({"name": "x", "engine": {"backend": "sglang", "kv_cache": "paged"}})
    assert "engine.kv_cache = 'paged'" in msg and "torch only" in msg
    assert "slots" in _error({"name": "x", "engine": {"kv_cache": "blocks"}})


def test_sglang_server_gets_every_engine_setting() -> None:
    from stacx.launch.engines import sglang_args

    args = sglang_args(
        device="cuda", dtype="bfloat16", max_batch=64, max_len=32768, tp=2, mem_fraction=0.8
    )
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {
        "--tp": "2",
        "--mem-fraction-static": "0.8",
        "--max-running-requests": "64",
        "--context-length": "32768",
        "--device": "cuda",
        "--dtype": "bfloat16",
    }
    auto = sglang_args(device="auto", dtype="auto", max_batch=8, max_len=8192, tp=1, mem_fraction=1)
    assert "--device" not in auto and "--dtype" not in auto


def test_plan_prints_only_settings_the_engine_uses() -> None:
    from stacx.launch.plan import describe

    with_url = convert(
        {
            "name": "x",
            "algorithm": {"name": "eval"},
            "engine": {"backend": "sglang", "url": "http://h:1"},
        }
    )
    (detail,) = [row[4] for row in describe(with_url, roles_for(with_url)) if row[0] == "rollout"]
    assert "http://h:1" in detail and "device=" not in detail
    oracle = convert({"name": "x", "algorithm": {"name": "eval"}, "agent": {"name": "oracle"}})
    (detail,) = [row[4] for row in describe(oracle, roles_for(oracle)) if row[0] == "rollout"]
    assert "no engine" in detail and "device=" not in detail


def test_every_problem_is_reported_at_once() -> None:
    msg = _error({"name": "x", "agent": {"name": "oracle"}, "placement": {"trainer": {"gpus": 2}}})
    assert "placement.trainer.gpus" in msg and "agent.name" in msg
