"""Loading Harbor tasks as Harbor writes them today (schema 1.4): every task that can load
does, a broken one is reported alone, multi-step tasks load their steps, and every task.toml
key is honoured or reported. Pure: no Docker."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from stacx.errors import TaskError
from stacx.harbor.task_network import allowed_hosts, episode_network, network_mode
from stacx.harbor.tasks import discover, discover_all, load_task
from stacx.ports import StepFailed, Verdict
from stacx.rollout.episode import combine_steps
from stacx.sandbox.compose import binds, load_compose
from stacx.sandbox.egress_proxy import host_allowed
from stacx.sandbox.limits import task_limits

FIXTURES = Path(__file__).parent / "fixtures"
MIXED = FIXTURES / "mixed"


def test_a_broken_task_is_reported_alone_with_its_reason() -> None:
    tasks, broken = discover_all(MIXED)
    assert [t.task_id for t in tasks] == ["hello", "two-steps"]
    assert [b.task_id for b in broken] == ["broken"]
    assert "environment.cpus" in broken[0].reason and "task.toml" in broken[0].reason
    with pytest.raises(TaskError, match=r"environment\.cpus"):  # the strict loader still says so
        discover(MIXED)


def test_multi_step_task_loads_its_steps_in_order() -> None:
    task = load_task(MIXED / "two-steps")
    assert [s.step for s in task.step_tasks] == ["create", "extend"]
    create, extend = task.step_tasks
    assert create.instruction.startswith("Create /app/notes.txt")
    assert create.tests_dir == MIXED / "two-steps" / "steps" / "create" / "tests"
    assert extend.solution_dir == MIXED / "two-steps" / "steps" / "extend" / "solution"
    assert create.config.agent.timeout_sec == 60.0
    assert extend.config.verifier.timeout_sec == 30.0
    assert task.has_solution


def test_multi_step_step_without_instruction_is_a_clear_error(tmp_path: Path) -> None:
    shutil.copytree(MIXED / "two-steps", tmp_path / "t")
    (tmp_path / "t" / "steps" / "extend" / "instruction.md").unlink()
    with pytest.raises(TaskError, match=r"step .extend.: missing .*instruction\.md"):
        load_task(tmp_path / "t")


def _task(tmp_path: Path, toml: str, *, compose: bool = False) -> Path:
    d = tmp_path / "t"
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    if compose:
        (d / "environment" / "docker-compose.yaml").write_text(
            "services:\n  db:\n    image: ubuntu:24.04\n    ports: ['5432:5432']\n"
        )
    (d / "tests" / "test.sh").write_text("true\n")
    (d / "instruction.md").write_text("x\n")
    (d / "task.toml").write_text(toml)
    return d


def test_keys_not_honoured_are_reported_with_the_key(tmp_path: Path) -> None:
    toml = """
schema_version = "1.4"
[verifier.continuous]
enabled = true
[environment]
gpus = 1
mcp_servers = [{name = "search", transport = "sse", url = "http://x/sse"}]
surprise = 3
"""
    task = load_task(_task(tmp_path, toml, compose=True))
    notes = "\n".join(task.notes)
    for key in (
        "verifier.continuous",
        "environment.surprise",
        "environment.gpus",
        "environment.mcp_servers",
        "['search']",
        "docker-compose.yaml: services.db.ports: ignored",
    ):
        assert key in notes, key


def test_an_unknown_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    toml = "[verifier]\ntimeout_secs = 5\n[agent]\nzzz = 1\n[environment]\nbuild_timeout = 9\n"
    assert load_task(_task(tmp_path, toml)).notes == [
        "agent.zzz: unknown key, ignored",  # nothing near: no guess
        "environment.build_timeout: unknown key, ignored (did you mean 'build_timeout_sec'?)",
        "verifier.timeout_secs: unknown key, ignored (did you mean 'timeout_sec'?)",
    ]


def test_network_policy_per_phase_and_the_deprecated_flag(tmp_path: Path) -> None:
    t = load_task(
        _task(
            tmp_path,
            '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
        )
    )
    assert (network_mode(t, "agent"), network_mode(t, "verifier")) == ("no-network", "public")
    assert task_limits(t).allow_internet is False
    legacy = load_task(_task(tmp_path / "b", "[environment]\nallow_internet = false\n"))
    assert network_mode(legacy, "agent") == "no-network"


def test_allowlist_loads_with_its_hosts_per_phase(tmp_path: Path) -> None:
    t = load_task(
        _task(
            tmp_path,
            '[environment]\nnetwork_mode = "no-network"\n'
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n',
        )
    )
    assert episode_network(t) == ({"allowlist", "no-network"}, ["pypi.org"])
    assert allowed_hosts(t, "agent") == ["pypi.org"]


@pytest.mark.parametrize(
    ("toml", "why"),
    [
        (
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n'
            '[verifier]\nnetwork_mode = "public"\n',
            r"'allowlist' in one phase and 'public'",
        ),
        (
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n'
            '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["b.org"]\n',
            r"different allowed_hosts",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://a.org/x"]\n',
            r"each entry is a host name",
        ),
    ],
)
def test_allowlist_the_docker_backend_cannot_enforce_is_refused(
    tmp_path: Path, toml: str, why: str
) -> None:
    with pytest.raises(TaskError, match=why):
        load_task(_task(tmp_path, toml))


def test_allowlist_with_compose_services_is_refused(tmp_path: Path) -> None:
    compose = '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.org"]\n'
    with pytest.raises(TaskError, match=r"allowlist' with a docker-compose.yaml"):
        load_task(_task(tmp_path, compose, compose=True))


def test_allowed_hosts_matching() -> None:
    allowed = ["pypi.org", "*.pythonhosted.org", "172.17.0.1:8080", "[::1]:80"]
    assert host_allowed("PyPI.org", 443, allowed) and host_allowed("pypi.org.", 80, allowed)
    assert host_allowed("files.pythonhosted.org", 443, allowed)
    assert not host_allowed("pythonhosted.org", 443, allowed)  # a wildcard is subdomains only
    assert not host_allowed("evilpypi.org", 443, allowed)
    assert not host_allowed("pypi.org.evil.com", 443, allowed)
    assert host_allowed("172.17.0.1", 8080, allowed)
    assert not host_allowed("172.17.0.1", 8081, allowed)
    assert host_allowed("::1", 80, allowed) and not host_allowed("::1", 81, allowed)
    assert not host_allowed("pypi.org", 443, [])  # none listed: no egress


def test_bad_network_mode_names_the_accepted_values(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"agent\.network_mode = .off.; accepted: public, no-netw"):
        load_task(_task(tmp_path, '[agent]\nnetwork_mode = "off"\n'))


def test_reward_strategies_and_min_reward_gate() -> None:
    task = load_task(MIXED / "two-steps")
    steps = [("create", Verdict(reward=1.0, metrics={"a": 1.0})), ("extend", Verdict(reward=0.0))]
    mean = combine_steps(task, steps)
    assert mean.reward == 0.5 and mean.metrics["a"] == 0.5
    assert mean.metrics["step.extend.reward"] == 0.0
    final_task = msgspec.structs.replace(
        task, config=msgspec.structs.replace(task.config, multi_step_reward_strategy="final")
    )
    final = combine_steps(final_task, steps)
    assert final.reward == 0.0
    assert task.step_passes("create", Verdict(reward=1.0))
    assert not task.step_passes("create", Verdict(reward=0.5))  # min_reward = 1.0
    # a step that could not start, as Harbor scores it: out of the mean, "final" has no result
    failed = StepFailed("extend", "RuntimeError", "Step 'extend' setup.sh exited with code 1: x")
    ran = steps[:1]
    assert combine_steps(task, ran, failed).reward == 1.0
    none = combine_steps(final_task, ran, failed)
    assert none.reward == 0.0
    assert none.metrics == {"step.create.reward": 1.0, "step.create.a": 1.0}
    assert none.output.endswith(
        "[step extend]\nRuntimeError: Step 'extend' setup.sh exited with code 1: x"
    )
    assert combine_steps(task, [], failed).reward == 0.0  # the first step failed


def test_selection_schedules_a_broken_task_when_selected(tmp_path: Path) -> None:
    from stacx.errors import ConfigError
    from stacx.launch.launcher import selection
    from stacx.launch.loader import load_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'name = "r"\n[tasks]\npath = "{MIXED}"\ninclude = ["broken", "hello"]\n'
        '[agent]\nname = "oracle"\n[algorithm]\nname = "eval"\n'
    )
    refs, skipped, notes = selection(load_recipe(recipe, []))
    assert [r.task_id for r in refs] == ["broken", "hello"] and skipped == []
    assert any(n.startswith("task broken: cannot be loaded:") for n in notes)
    with pytest.raises(ConfigError, match=r"match no task id; accepted: broken, hello, two-steps"):
        selection(load_recipe(recipe, ['tasks.include=["nope"]']))


def _compose_task(tmp_path: Path, compose: str) -> Path:
    d = _task(tmp_path, 'schema_version = "1.4"\n')
    (d / "environment" / "data").mkdir()
    (d / "environment" / "docker-compose.yaml").write_text(compose)
    return d


@pytest.mark.parametrize(
    ("volume", "error"),
    [
        (
            "/etc:/host-etc",
            r"services\.db\.volumes\[0\]: host path '/etc' is outside the task's "
            r"environment dir",
        ),
        ("../tests:/t", r"services\.db\.volumes\[0\]: host path '\.\./tests' is outside"),
        ("~/.ssh:/k", r"services\.db\.volumes\[0\]: host path '~/\.ssh' is outside"),
        ("/cache", r"services\.db\.volumes\[0\] = '/cache': SOURCE:TARGET"),
        ("undeclared:/x", r"services\.db\.volumes\[0\]: volume 'undeclared' is not declared"),
        ("./data:/d:z", r"services\.db\.volumes\[0\] = './data:/d:z': mode 'z'; accepted: ro, rw"),
        ("./missing:/d", r"host path '\./missing' does not exist"),
    ],
)
def test_compose_volumes_other_than_named_or_inside_the_task_are_refused_at_load(
    tmp_path: Path, volume: str, error: str
) -> None:
    d = _compose_task(
        tmp_path, f"services:\n  db:\n    image: ubuntu:24.04\n    volumes: [{volume!r}]\n"
    )
    with pytest.raises(TaskError, match=error):
        load_task(d)


def test_compose_volume_options_are_refused_and_good_volumes_load(tmp_path: Path) -> None:
    d = _compose_task(
        tmp_path,
        "services:\n  db:\n    image: ubuntu:24.04\n"
        "    volumes: [shared:/s]\nvolumes:\n  shared:\n    external: true\n",
    )
    with pytest.raises(TaskError, match=r"volumes\.shared\.external: volume options"):
        load_task(d)
    shutil.rmtree(d)
    d = _compose_task(
        tmp_path,
        "services:\n  db:\n    image: ubuntu:24.04\n    ports: ['1:1']\n"
        "    volumes: [shared:/s, './data:/d:ro']\n  main:\n    volumes:\n"
        "      - {type: volume, source: shared, target: /s, read_only: true}\n"
        "volumes:\n  shared:\n",
    )
    task = load_task(d)  # no note for volumes; ports still reported
    assert [n for n in task.notes if "docker-compose" in n] == [
        "docker-compose.yaml: services.db.ports: ignored"
    ]
    services, _ = load_compose(d / "environment" / "docker-compose.yaml")
    assert binds(services["db"], {"shared": "ep-shared"}) == {
        "ep-shared": "/s",
        str((d / "environment" / "data").resolve()): "/d:ro",
    }
    assert binds(services["main"], {"shared": "ep-shared"}) == {"ep-shared": "/s:ro"}


def test_a_stacx_bug_while_loading_fails_the_task_alone_or_crashes_in_strict_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task file's fault is a TaskError; any other exception while loading is STACX's bug:
    with STACX_STRICT it propagates (a traceback), without it the one task is unloadable."""
    from stacx.harbor import tasks as tasks_module
    from stacx.harbor.tasks import discover_all

    _task(tmp_path / "set", "")

    def buggy(*_args: object) -> list[str]:
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(tasks_module, "task_notes", buggy)
    monkeypatch.setenv("STACX_STRICT", "1")
    with pytest.raises(AttributeError):
        discover_all(tmp_path / "set")
    monkeypatch.delenv("STACX_STRICT")
    loaded, broken = discover_all(tmp_path / "set")
    assert loaded == [] and [b.task_id for b in broken] == ["t"]
    assert "a STACX bug, not the task's (AttributeError: 'str' object" in broken[0].reason
