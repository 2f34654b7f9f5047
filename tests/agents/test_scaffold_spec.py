"""Scaffold specs as data: the shipped specs are files, a bad spec fails at load with its key
path and the accepted values, and a scaffold declared only in a user's file (no change to
`stacx/`) runs through `stacx eval` with recorded turns, its exit code, stderr tail and the
gateway's error answers kept in the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stacx.agents.scaffold_spec import ScaffoldSpec, load_spec, resolve, shipped
from stacx.errors import ConfigError
from stacx.sandbox.images import bootstrap_base_image
from stacx.store import db
from tests.agents.conftest import trained_sequences

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_scaffolds_are_spec_files() -> None:
    assert set(shipped()) == {"mini-swe-agent", "openhands-sdk", "terminus-2"}
    mini = resolve("mini-swe-agent")
    assert mini.api == "openai-chat" and "{base_url}" in mini.run
    oh = resolve("openhands-sdk")
    # its Python floor is checked first in the layer, naming the base image a task needs
    check = oh.layer_commands()[0]
    assert "sys.version_info[:2] < (3, 12)" in check and "stacx/base:trixie" in check
    assert "/tmp/stacx/openhands_run.py" in oh.run_files()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "x"\nrun = "go"\ninstal = ["pip install x"]', "unknown field `instal`"),
        ('name = "x"', "missing required field `run`"),
        (
            'name = "x"\nrun = "go"\napi = "grpc"',
            "accepted: openai-chat, openai-completions, anthropic-messages",
        ),
        ('name = "x"\nrun = "go"\n[stops]\ndone = "won"', "stops"),
        ('name = "x"\nrun = "go {modle}"', "unknown placeholder 'modle'; accepted: api_key"),
        ('name = "x"\nrun = "go"\nmin_python = "three"', "min_python = 'three'"),
        ('name = "x"\nrun = "go"\npip = "openai"', "Expected `array`, got `str` - at `pip`"),
        ('name = "x"\nrun = "go\n', "not valid TOML"),
    ],
)
def test_a_bad_spec_fails_at_load_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "my.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"scaffold spec .*my\.toml") as info:
        load_spec(path)
    assert message in str(info.value)


def test_layer_commands_from_packages() -> None:
    spec = ScaffoldSpec(
        name="s",
        run="go",
        pip=["openai==1.*"],
        npm=["@x/cli"],
        apt=["git"],
        install=["{venv}/bin/pip check"],
        min_node="20",
    )
    node, apt, pip, npm, extra = spec.layer_commands()
    assert node.startswith("node -e") and "needs node >= 20" in node
    assert apt.startswith("apt-get update && apt-get install -y --no-install-recommends git")
    assert pip.startswith("python3 -m venv /opt/stacx-s && /opt/stacx-s/bin/pip install")
    assert "'openai==1.*'" in pip and npm == "npm install -g @x/cli"
    assert extra == "/opt/stacx-s/bin/pip check" and spec.interpreter() == "/opt/stacx-s/bin/python"


# A scaffold of the user's own: the official openai client (installed by the spec's pip), a
# call with a model name the gateway does not serve (a 404, recorded), two calls of which the
# second rewrites the history (a summary: a new segment), a trajectory, stderr and exit code 3.
MY_AGENT = """
import argparse, json, pathlib, sys
import openai
p = argparse.ArgumentParser()
for flag in ("base-url", "api-key", "model", "instruction-file", "max-tokens", "out"):
    p.add_argument("--" + flag, required=True)
a = p.parse_args()
client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
try:
    client.models.retrieve("gpt-4o")
except openai.NotFoundError:
    print("no gpt-4o here", file=sys.stderr)
task = pathlib.Path(a.instruction_file).read_text()
history = [{"role": "user", "content": task}]
first = client.chat.completions.create(model=a.model, messages=history,
                                       max_tokens=int(a.max_tokens))
history = [{"role": "user", "content": "Summary: " + (first.choices[0].message.content or "")}]
client.chat.completions.create(model=a.model, messages=history, max_tokens=int(a.max_tokens))
pathlib.Path(a.out).write_text(json.dumps({"info": {"exit_status": "done"}}))
print("my-agent: two calls made", file=sys.stderr)
sys.exit(3)
"""


def my_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "my-agent.toml"
    spec.write_text(
        textwrap.dedent('''\
        name = "my-agent"
        api = "openai-chat"
        pip = ["openai>=1.40"]
        run = """{venv}/bin/python /tmp/stacx/my_agent.py --base-url {base_url} \\
          --api-key {api_key} --model {model} --instruction-file {instruction_file} \\
          --max-tokens {max_tokens} --out {logs_dir}/trajectory.json"""

        [stops]
        done = "submitted"

        [files]
        "/tmp/stacx/my_agent.py" = \'\'\'
        ''')
        + MY_AGENT
        + "'''\n"
    )
    return spec


@pytest.mark.docker
@pytest.mark.model
def test_a_users_scaffold_runs_through_stacx_eval(tmp_path: Path) -> None:
    bootstrap_base_image()
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacx",
            "eval",
            "--agent",
            f"installed:{my_spec(tmp_path)}",
            "--tasks",
            "basic",
            "--include",
            "create-hello-file",
            "--max-new-tokens",
            "8",
            "--run-dir",
            str(run_dir),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    con = db.connect_run(run_dir)
    turns = con.execute(
        "select turn, segment, len(output_ids), engine from turn_generated order by turn"
    ).fetchall()
    # two calls; the second's history is a rewrite of the first: a second segment
    assert [(t[0], t[1]) for t in turns] == [(0, 0), (1, 1)]
    assert all(t[2] > 0 and t[3] == "gateway:torch" for t in turns)
    ((scaffold, code, tail),) = con.execute(
        "select scaffold, exit_code, stderr_tail from scaffold_exited"
    ).fetchall()
    assert (scaffold, code) == ("my-agent", 3)
    assert "no gpt-4o here" in tail and "my-agent: two calls made" in tail
    ((route, status, code_),) = con.execute(
        "select route, status, code from gateway_refused"
    ).fetchall()
    assert (route, status, code_) == ("/v1/models/gpt-4o", 404, "model_not_found")
    (stop, status_), *_ = con.execute("select stop_reason, status from episodes").fetchall()
    assert stop == "submitted" and status_ == "scored"
    request = json.loads(
        con.execute("select request_json from turn_generated where turn = 1").fetchone()[0]
    )
    assert request["messages"][0]["content"].startswith("Summary: ")
    # What a multi-segment episode trains on (docs/scaffolds.md, "Segments"): each segment its own sequence,
    # the episode's outcome on every segment's turns, each row naming its episode and turn.
    grpo = con.execute("select turn, reward, advantage from grpo_batch order by turn").fetchall()
    ((reward,),) = con.execute("select reward from episodes").fetchall()
    assert [(g[0], g[1]) for g in grpo] == [(0, reward), (1, reward)]
    assert grpo[0][2] == grpo[1][2]  # one advantage per episode, broadcast to both segments
    prompts = [
        p for (p,) in con.execute("select prompt_ids from sft_examples order by turn").fetchall()
    ]
    sequences = trained_sequences(con)
    # the rewritten history does not extend the first call: two sequences, never merged
    assert [list(s.prompt_ids) for s in sequences] == prompts
    assert len(sequences) == 2


def test_an_inline_spec_in_the_recipe_is_the_same_spec(tmp_path: Path) -> None:
    """[agent.scaffold_spec]: the spec's keys inline in the recipe, read as the file is."""
    import tomllib

    from stacx.launch.loader import convert
    from stacx.launch.recipe import scaffold_of

    path = my_spec(tmp_path)
    inline = tomllib.loads(path.read_text())
    recipe = convert({"name": "x", "agent": {"name": "installed", "scaffold_spec": inline}})
    assert scaffold_of(recipe.agent) == load_spec(path)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"name": "x", "run": "go", "instal": []},
            "unknown key agent.scaffold_spec.instal; accepted: name, run",
        ),
        (
            {"name": "x", "run": "go", "api": "grpc"},
            "agent.scaffold_spec.api: Invalid enum value 'grpc'; accepted: 'openai-chat'",
        ),
        (
            {"name": "x", "run": "go {modle}"},
            "agent.scaffold_spec.run: unknown placeholder 'modle'; accepted: api_key",
        ),
        (
            {"name": "x", "run": "go", "beside": {"base_image": "b", "pipp": []}},
            "unknown key agent.scaffold_spec.beside.pipp; accepted: base_image, apt, pip, install",
        ),
        ({"run": "go"}, "missing required key agent.scaffold_spec.name"),
    ],
)
def test_a_bad_inline_spec_fails_at_load_naming_the_key_path(
    spec: dict[str, object], message: str
) -> None:
    from stacx.launch.loader import convert

    with pytest.raises(ConfigError) as info:
        convert({"name": "x", "agent": {"name": "installed", "scaffold_spec": spec}})
    assert message in str(info.value)


def test_a_scaffold_named_twice_fails_at_load() -> None:
    from stacx.launch.loader import convert

    raw = {
        "name": "installed",
        "scaffold": "mini-swe-agent",
        "scaffold_spec": {"name": "x", "run": "go"},
    }
    with pytest.raises(
        ConfigError, match=r"agent\.scaffold = 'mini-swe-agent' and agent\.scaffold_spec"
    ):
        convert({"name": "x", "agent": raw})


def test_a_beside_spec_splits_its_commands() -> None:
    """Terminus-2's shipped spec: tmux in the task's layer, harbor in its own image."""
    t2 = resolve("terminus-2")
    assert t2.beside is not None and t2.beside.base_image == "stacx/base:trixie"
    assert t2.layer_commands() == [
        "apt-get update && apt-get install -y --no-install-recommends tmux "
        "&& rm -rf /var/lib/apt/lists/*"
    ]
    (venv,) = t2.beside_commands()
    assert "harbor==0.25.0" in venv and t2.interpreter() == "/opt/stacx-terminus-2/bin/python"
