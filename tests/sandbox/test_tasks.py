"""Harbor task parsing: the full task.toml, unknown keys kept, clear errors; task sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.errors import TaskError
from stacx.harbor.jsonl_tasks import read_jsonl, write_jsonl
from stacx.harbor.tasks import discover, load_task, parse_task_config, resolve_env
from stacx.sandbox.images import extra_certificates, split_pem_bundle

from .conftest import FIXTURES, make_task

FULL = """
schema_version = "1.1"
source = "some-dataset"

[task]
name = "acme/hello"
description = "say hello"
keywords = ["x"]

[metadata]
difficulty = "hard"
tags = ["a", "b"]

[verifier]
timeout_sec = 30
user = "tester"
[verifier.env]
MODE = "strict"

[agent]
timeout_sec = 60.5
user = 1000

[environment]
build_timeout_sec = 100
cpus = 2
memory_mb = 512
storage_mb = 1024
gpus = 0
allow_internet = false
[environment.env]
TOKEN = "${STACX_TEST_TOKEN:-none}"
[environment.healthcheck]
command = "true"
retries = 5

[solution.env]
HINT = "1"
"""


def test_full_task_toml_parses_every_section() -> None:
    cfg, unknown = parse_task_config(FULL)
    assert unknown == {}
    assert cfg.schema_version == "1.1" and cfg.source == "some-dataset"
    assert cfg.task is not None and cfg.task.name == "acme/hello"
    assert cfg.metadata == {"difficulty": "hard", "tags": ["a", "b"]}
    assert (cfg.verifier.timeout_sec, cfg.verifier.user, cfg.verifier.env) == (
        30.0,
        "tester",
        {"MODE": "strict"},
    )
    assert (cfg.agent.timeout_sec, cfg.agent.user) == (60.5, 1000)
    env = cfg.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.allow_internet) == (2, 512, 1024, False)
    assert env.healthcheck is not None and env.healthcheck.retries == 5
    assert cfg.solution.env == {"HINT": "1"}


def test_defaults_match_harbor() -> None:
    cfg, _ = parse_task_config("")
    assert cfg.verifier.timeout_sec == 600.0
    assert (cfg.environment.cpus, cfg.environment.memory_mb) == (1, 2048)
    assert cfg.environment.allow_internet is True
    assert cfg.agent.timeout_sec is None


def test_unknown_keys_are_kept_with_their_path_not_fatal() -> None:
    cfg, unknown = parse_task_config(
        'version = "1.0"\nfuture = 1\n[environment]\nmemory_mb = 100\ndocker_compose = true\n'
        "[brand_new]\nx = 2\n"
    )
    assert cfg.schema_version == "1.0" and cfg.environment.memory_mb == 100
    assert unknown == {"future": 1, "environment.docker_compose": True, "brand_new": {"x": 2}}


def test_deprecated_size_spellings() -> None:
    cfg, _ = parse_task_config('[environment]\nmemory = "1G"\nstorage = "512M"\n')
    assert (cfg.environment.memory_mb, cfg.environment.storage_mb) == (1024, 512)


def test_wrong_type_names_file_and_key_path() -> None:
    with pytest.raises(TaskError, match=r"x/task.toml.*environment\.memory_mb"):
        parse_task_config('[environment]\nmemory_mb = "lots"\n', where="x/task.toml")


def test_invalid_toml_names_the_file() -> None:
    with pytest.raises(TaskError, match=r"t\.toml: not valid TOML"):
        parse_task_config("[environment\n", where="t.toml")


def test_missing_test_sh_is_named(tmp_path: Path) -> None:
    d = make_task(tmp_path, "t1", test_sh="true")
    (d / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"missing tests/test\.sh"):
        load_task(d)


def test_third_party_fixture_task_loads() -> None:
    task = load_task(FIXTURES / "others-csv-report")
    assert task.task_id == "others-csv-report" and task.has_solution
    assert task.config.environment.allow_internet is False
    assert task.config.environment.memory_mb == 256
    assert task.unknown == {
        "environment.docker_compose": False,
    }
    assert task.config.metadata["custom_field"] == "kept, not fatal"


def test_prepare_round_trips_through_jsonl(tmp_path: Path) -> None:
    make_task(tmp_path / "set", "b-task", test_sh="true", toml="[agent]\ntimeout_sec = 5\n")
    make_task(tmp_path / "set", "a-task", test_sh="true", toml="[weird]\nk = 1\n")
    tasks = discover(tmp_path / "set")
    assert [t.task_id for t in tasks] == ["a-task", "b-task"]
    write_jsonl(tasks, tmp_path / "tasks.jsonl")
    assert read_jsonl(tmp_path / "tasks.jsonl") == tasks
    assert tasks[0].unknown == {"weird": {"k": 1}}


def test_duplicate_task_ids_are_refused(tmp_path: Path) -> None:
    make_task(tmp_path / "set" / "x", "same", test_sh="true")
    make_task(tmp_path / "set" / "y", "same", test_sh="true")
    with pytest.raises(TaskError, match="duplicate task id 'same'"):
        discover(tmp_path / "set")


def test_env_templates_resolve_from_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACX_T_KEY", "abc")
    monkeypatch.delenv("STACX_T_MISSING", raising=False)
    env = {"A": "${STACX_T_KEY}", "B": "x-${STACX_T_MISSING:-dflt}", "C": "plain"}
    assert resolve_env(env, where="verifier.env") == {"A": "abc", "B": "x-dflt", "C": "plain"}
    with pytest.raises(TaskError, match=r"verifier.env.D: \$\{STACX_T_MISSING\}"):
        resolve_env({"D": "${STACX_T_MISSING}"}, where="verifier.env")


PEM_A = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
PEM_B = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n"


def test_extra_host_certificates_are_those_missing_from_stock() -> None:
    host = f"# comment\n{PEM_A}\n{PEM_B}"
    assert split_pem_bundle(host) == [PEM_A, PEM_B]
    assert extra_certificates(host, stock_bundle=PEM_A) == [PEM_B]


def test_select_by_pattern_difficulty_and_limit() -> None:
    from stacx.harbor.tasks import load_tasks, select

    basic = load_tasks(Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "basic")
    ids = [t.task_id for t in select(basic, include=["create-*"], exclude=["create-nested-*"])]
    assert ids == ["create-empty-flag-file", "create-hello-file"]
    trivial = select(basic, difficulty=["trivial"])
    assert len(trivial) == 13 and {t.config.metadata["difficulty"] for t in trivial} == {"trivial"}
    assert len(select(basic, difficulty=["trivial", "easy"], limit=20)) == 20
    with pytest.raises(TaskError, match=r"tasks.include: \['nope-\*'\] match no task id"):
        select(basic, include=["nope-*"])
    with pytest.raises(TaskError, match=r"difficulty: \['expert'\].*accepted: easy, hard, medium"):
        select(basic, difficulty=["expert"], where="tasks")
    with pytest.raises(TaskError, match="no task left"):
        select(basic, include=["create-hello-file"], exclude=["create-*"])
