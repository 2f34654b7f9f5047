"""A run's checkpoint as a standalone HF model directory (`stacx models export`).

Checkpoints of runs that train a subset of the parameters (``trainer.trainable``) hold only
those tensors. Exporting lays them over the run's base model (the recipe's ``model.path`` from
RunStarted, or an explicit base) and writes a directory that ``resolve_model``, transformers,
SGLang or a teacher (``teacher.path``) load like any checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stacx.hf import read_safetensors, resolve_model
from stacx.train.checkpoint import WEIGHTS_FILE, CheckpointError, version_dir, versions

BASE_SQL = "SELECT config_json FROM run_started ORDER BY _seq DESC LIMIT 1"


def run_base_model(run_dir: Path) -> str:
    """The model the run started from: RunStarted's recipe ``model.path``."""
    from stacx.store.db import connect_run

    con = connect_run(run_dir)
    try:
        rows = con.sql(BASE_SQL).fetchall()
    finally:
        con.close()
    config = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    model = config.get("model", {}) if isinstance(config, dict) else {}
    path = model.get("path") if isinstance(model, dict) else None
    if not isinstance(path, str) or not path:
        raise CheckpointError(f"{run_dir}: RunStarted names no model.path; pass --base")
    return path


def export_hf(
    run_dir: Path, out: Path, *, version: int | None = None, base: str | None = None
) -> Path:
    """Write checkpoint `version` (default: the latest) of `run_dir` as an HF directory `out`."""
    from safetensors.torch import save_file

    have = versions(run_dir)
    if not have:
        raise CheckpointError(f"{run_dir}: no checkpoints under {run_dir / 'checkpoints'}")
    version = have[-1] if version is None else version
    if version not in have:
        raise CheckpointError(f"{run_dir}: no checkpoint v{version}; have {have}")
    base_dir = Path(resolve_model(base or run_base_model(run_dir)))
    state = read_safetensors(base_dir)  # every shard
    trained = read_safetensors(version_dir(run_dir, version) / WEIGHTS_FILE)
    unknown = sorted(set(trained) - set(state))
    if unknown:
        raise CheckpointError(
            f"checkpoint v{version} has tensors the base {base_dir} lacks: {unknown[:3]} "
            "(a different base model? pass --base)"
        )
    mismatched = [n for n, t in trained.items() if t.shape != state[n].shape]
    if mismatched:
        raise CheckpointError(
            f"checkpoint v{version}: shapes differ from the base at {mismatched[:3]}"
        )
    state.update(trained)
    if out.exists():
        raise CheckpointError(f"{out} exists; refusing to overwrite")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(
        base_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json")
    )
    save_file(
        {n: t.contiguous() for n, t in state.items()},
        str(tmp / WEIGHTS_FILE),
        metadata={"format": "pt"},
    )
    (tmp / "stacx-export.json").write_text(
        json.dumps(
            {
                "run_dir": str(run_dir.resolve()),
                "version": version,
                "base": str(base_dir),
                "trained_tensors": len(trained),
            },
            indent=2,
        )
        + "\n"
    )
    tmp.rename(out)
    return out
