"""A small offline fitter: rows of a training view -> a few optimizer steps -> an HF checkpoint.

Used by the teacher builder (``make_teacher``: SFT on oracle demonstrations) and by the
gap-closure experiment (``tools/imitation_gap.py``: SFT on ``dagger_dataset``, the OPD
per-token policy gradient on ``opd_batch``). It is built from the trainer's pure parts
(``stacx.train``: packing, packed logprobs, losses), so the math is the trainer's; what it does
not have is the trainer actor's lifecycle (readiness, weight publishing, resume). Runs that
train inside ``stacx run`` use the trainer actor.

Guarantees: deterministic sample order for a given seed (epochs of a seeded permutation); the
output directory is a complete HF checkpoint (weights, config, generation config, tokenizer),
written to a temporary sibling and renamed, so ``resolve_model(out)`` never sees half of one.
Limits: float32 on CPU (or the given device); the whole dataset is held in memory.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import torch

from stacx.train.forward import packed_token_logprobs
from stacx.train.losses import LossOutput, policy_gradient_loss, sft_loss
from stacx.train.packing import Sample, pack

Objective = Literal["sft", "opd"]


def samples_for(
    table: pa.Table, objective: Objective, opd_discount: float = 0.0, opd_center: bool = False
) -> list[Sample]:
    """Training samples from view rows: ``sft`` takes sft_examples/dagger_dataset rows,
    ``opd`` takes opd_batch rows (aligned ones only; ``opd_discount`` and ``opd_center`` as
    the trainer's)."""
    from stacx.train.batches import opd_advantage_lists, samples_from_table

    if objective == "sft":
        return samples_from_table(table, loss_mask="loss_mask")
    aligned = opd_advantage_lists(
        table.filter(pc.field("aligned")), discount=opd_discount, center=opd_center
    )
    return samples_from_table(
        aligned,
        completion="output_ids",
        token_columns={"behavior_logprobs": "student_logprobs", "advantages": "advantages"},
    )


def fit(
    model_path: str,
    samples: Sequence[Sample],
    out_dir: Path,
    *,
    objective: Objective = "sft",
    steps: int = 10,
    batch_size: int = 8,
    lr: float = 5e-5,
    seed: int = 0,
    device: str = "cpu",
    log_every: int = 0,
    trainable_layers: int | None = None,
    snapshots: Mapping[int, Path] | None = None,
) -> list[float]:
    """Train a copy of `model_path` for `steps` steps on `samples`; save it to `out_dir`.

    ``snapshots`` maps a step number to a directory where the model after that many steps is
    saved too (a learning curve without retraining: the learning rate is constant and the
    sample order depends on `seed` only, so step n of a longer fit is the n-step fit).

    ``trainable_layers = k`` trains only the last k decoder layers and the final norm (the
    embeddings, tied to the head in SmolLM2, stay frozen): autograd then stops at layer
    ``L - k``, which makes a step several times cheaper on CPU. Returns every step's loss.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stacx.inference.models import dtype_kwarg, resolve_model

    if not samples:
        raise ValueError("fit: no samples")
    path = resolve_model(model_path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, **dtype_kwarg(torch.float32))
    model = model.to(torch.device(device))  # type: ignore[arg-type]  # transformers' stub
    model.train()
    if trainable_layers is not None:
        _freeze_below(model, trainable_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    order: list[int] = []
    rng = random.Random(seed)
    losses = []
    for step in range(steps):
        batch: list[Sample] = []
        while len(batch) < min(batch_size, len(samples)):
            if not order:
                order = list(range(len(samples)))
                rng.shuffle(order)
            batch.append(samples[order.pop()])
        # One sample per forward, gradients accumulated: attention memory stays O(one sequence)
        # (sdpa's math path on CPU keeps [heads, T, T] per layer for backward), and the
        # token-level mean over the whole batch is kept by a shared normalizer.
        n_loss_tokens = float(sum(_n_loss_tokens(s) for s in batch))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for sample in batch:
            packed = pack([sample], sample.n_positions).to(device)
            logprobs = packed_token_logprobs(model, packed)
            out = _loss(objective, logprobs, packed.values_R_T, packed.loss_mask_R_T, n_loss_tokens)
            out.loss.backward()
            total += float(out.loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(total)
        if snapshots and step + 1 in snapshots:
            save_checkpoint(model, AutoTokenizer.from_pretrained(path), snapshots[step + 1])
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"fit step {step + 1}/{steps}: {objective} loss {total:.4f}", flush=True)
    save_checkpoint(model, AutoTokenizer.from_pretrained(path), out_dir)
    return losses


def _loss(
    objective: Objective,
    logprobs: torch.Tensor,
    values: dict[str, torch.Tensor],
    mask: torch.Tensor,
    normalizer: float,
) -> LossOutput:
    if objective == "sft":
        return sft_loss(logprobs, mask, normalizer)
    return policy_gradient_loss(
        logprobs, values["behavior_logprobs"], values["advantages"], mask, normalizer=normalizer
    )


def _freeze_below(model: torch.nn.Module, k: int) -> None:
    decoder = model.get_decoder()  # type: ignore[operator]
    layers = list(decoder.layers)
    if not 1 <= k <= len(layers):
        raise ValueError(f"trainable_layers = {k}: the model has {len(layers)} decoder layers")
    for p in model.parameters():
        p.requires_grad_(False)
    for module in [*layers[-k:], decoder.norm]:
        for p in module.parameters():
            p.requires_grad_(True)


def _n_loss_tokens(sample: Sample) -> int:
    mask = sample.loss_mask
    return sum(mask) if mask is not None else len(sample.completion_ids)


def save_checkpoint(model: torch.nn.Module, tokenizer: object, out_dir: Path) -> Path:
    """Write an HF checkpoint atomically (temp sibling, then rename over `out_dir`)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(str(tmp))  # type: ignore[operator]
        tokenizer.save_pretrained(str(tmp))  # type: ignore[attr-defined]
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


# ---- samples as files, trained-tensor deltas (fitting on another machine) ---------------------


def write_samples(samples: Sequence[Sample], path: Path) -> None:
    """One JSON object per sample (prompt_ids, completion_ids, loss_mask, token_values)."""
    with Path(path).open("w") as f:
        for s in samples:
            f.write(
                json.dumps(
                    {
                        "prompt_ids": list(s.prompt_ids),
                        "completion_ids": list(s.completion_ids),
                        "loss_mask": None if s.loss_mask is None else list(s.loss_mask),
                        "token_values": {k: list(v) for k, v in s.token_values.items()},
                    }
                )
                + "\n"
            )


def read_samples(path: Path) -> list[Sample]:
    out = []
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        out.append(Sample(d["prompt_ids"], d["completion_ids"], d["token_values"], d["loss_mask"]))
    return out


def write_delta(
    base_dir: Path,
    trained_dir: Path,
    out_dir: Path,
    max_bytes: int = 15 << 20,
    dtype: torch.dtype | None = None,
) -> int:
    """Save the tensors of `trained_dir` that differ from `base_dir`, in safetensors shards of at
    most `max_bytes` each (a partial fine-tune travels as a few small files). Returns the count."""
    from safetensors.torch import load_file, save_file

    base = _state(base_dir, load_file)
    trained = _state(trained_dir, load_file)
    changed = {k: v for k, v in trained.items() if k in base and not torch.equal(v, base[k])}
    out_dir.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    size, index = 0, 0
    for key in sorted(changed):
        t = changed[key].to(dtype or changed[key].dtype).contiguous()
        if shard and size + t.numel() * t.element_size() > max_bytes:
            save_file(shard, str(out_dir / f"delta-{index}.safetensors"))
            shard, size, index = {}, 0, index + 1
        shard[key] = t
        size += t.numel() * t.element_size()
    if shard:
        save_file(shard, str(out_dir / f"delta-{index}.safetensors"))
    return len(changed)


def apply_delta(base_model: str, delta_dir: Path, out_dir: Path) -> Path:
    """`base_model` with the tensors of `delta_dir` replaced, saved as a full HF checkpoint."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stacx.inference.models import dtype_kwarg, resolve_model

    path = resolve_model(base_model)
    model = AutoModelForCausalLM.from_pretrained(path, **dtype_kwarg(torch.float32))
    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(delta_dir).glob("delta-*.safetensors")):
        state.update(load_file(str(f)))
    missing = sorted(set(state) - set(model.state_dict()))
    if missing:
        raise ValueError(f"{delta_dir}: tensors {missing[:3]} are not in {path}")
    model.load_state_dict(state, strict=False)
    return save_checkpoint(model, AutoTokenizer.from_pretrained(path), out_dir)


def _state(model_dir: Path, load_file: object) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))  # type: ignore[operator]
    return state


def main(argv: list[str] | None = None) -> int:
    """``python -m stacx.imitation.fit``: fit from a samples file, optionally write a delta."""
    p = argparse.ArgumentParser(prog="python -m stacx.imitation.fit")
    p.add_argument("--model", required=True, help="base checkpoint dir, or 'default'")
    p.add_argument("--samples", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--delta", type=Path, help="also write the changed tensors here")
    p.add_argument("--delta-dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--objective", choices=["sft", "opd"], default="sft")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--trainable-layers", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    losses = fit(
        a.model,
        read_samples(a.samples),
        a.out,
        objective=a.objective,
        steps=a.steps,
        batch_size=a.batch_size,
        lr=a.lr,
        seed=a.seed,
        device=a.device,
        trainable_layers=a.trainable_layers,
        log_every=max(1, a.steps // 20),
    )
    print(json.dumps({"losses": losses}))
    if a.delta is not None:
        from stacx.inference.models import resolve_model

        n = write_delta(
            Path(resolve_model(a.model)), a.out, a.delta, dtype=getattr(torch, a.delta_dtype)
        )
        print(f"delta: {n} tensors -> {a.delta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
