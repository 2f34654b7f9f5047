"""A run's checkpoint as a standalone HF model directory (`stacx models export`): a partial
checkpoint (``trainer.trainable``) is laid over the run's base model; a LoRA checkpoint is exported
as its PEFT adapter directory, or with ``merged`` merged into the base (a plain HF model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stacx.hf import read_safetensors, resolve_model
from stacx.train.checkpoint import WEIGHTS_FILE, CheckpointError, version_dir, versions
from stacx.train.lora import ADAPTER_CONFIG, ADAPTER_FILE

BASE_SQL = "SELECT config_json FROM run_started ORDER BY _seq DESC LIMIT 1"


def run_base_model(run_dir: Path) -> str:
    """The model the run started from: RunStarted's recipe ``model.path``."""
    from stacx.store.db import connect_run

    with connect_run(run_dir) as con:
        rows = con.sql(BASE_SQL).fetchall()
    config = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    model = config.get("model", {}) if isinstance(config, dict) else {}
    path = model.get("path") if isinstance(model, dict) else None
    if not isinstance(path, str) or not path:
        raise CheckpointError(f"{run_dir}: RunStarted names no model.path; pass --base")
    return path


def export_hf(
    run_dir: Path,
    out: Path,
    *,
    version: int | None = None,
    base: str | None = None,
    merged: bool = False,
) -> Path:
    """Write checkpoint `version` (default: the latest) of `run_dir` as an HF directory `out` (LoRA:
    the adapter, or with `merged` the merged model)."""
    from safetensors.torch import save_file

    have = versions(run_dir)
    if not have:
        raise CheckpointError(f"{run_dir}: no checkpoints under {run_dir / 'checkpoints'}")
    version = have[-1] if version is None else version
    if version not in have:
        raise CheckpointError(f"{run_dir}: no checkpoint v{version}; have {have}")
    if out.exists():
        raise CheckpointError(f"{out} exists; refusing to overwrite")
    base_dir = Path(resolve_model(base or run_base_model(run_dir)))
    source = version_dir(run_dir, version)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    if (source / ADAPTER_CONFIG).is_file():
        _export_adapter(source, tmp, base_dir, version, merged=merged)
        tmp.rename(out)
        return out
    if merged:
        raise CheckpointError(
            f"checkpoint v{version} is not a LoRA adapter: --merged applies to LoRA runs"
        )
    state = read_safetensors(base_dir)  # every shard
    trained = read_safetensors(source / WEIGHTS_FILE)
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
    shutil.copytree(
        base_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json")
    )
    tensors = {n: t.contiguous() for n, t in state.items()}
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    _provenance(tmp, run_dir, version, base_dir, trained_tensors=len(trained))
    tmp.rename(out)
    return out


def _provenance(tmp: Path, run_dir: Path, version: int, base_dir: Path, **more: object) -> None:
    record = {"run_dir": str(run_dir.resolve()), "version": version, "base": str(base_dir), **more}
    (tmp / "stacx-export.json").write_text(json.dumps(record, indent=2) + "\n")


def _export_adapter(source: Path, tmp: Path, base_dir: Path, version: int, *, merged: bool) -> None:
    """A LoRA checkpoint as its adapter directory `tmp`, or merged into the base (peft)."""
    run_dir = source.parent.parent
    if merged:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        from stacx.hf import LOAD_LOCK

        shutil.copytree(
            base_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors*", "*.gguf", "config.json")
        )
        with LOAD_LOCK:
            model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype="auto")
        lm = PeftModel.from_pretrained(model, str(source)).merge_and_unload()
        lm.save_pretrained(str(tmp))
        _provenance(tmp, run_dir, version, base_dir, merged_adapter=True)
    else:
        tmp.mkdir(parents=True)
        shutil.copyfile(source / ADAPTER_FILE, tmp / ADAPTER_FILE)
        config = json.loads((source / ADAPTER_CONFIG).read_text())
        config["base_model_name_or_path"] = str(base_dir)  # where peft finds the base
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        _provenance(tmp, run_dir, version, base_dir, adapter=True)
