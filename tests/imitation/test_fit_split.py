"""The offline fitter (teacher builder, gap experiment) and the train / held-out split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stacx.imitation.fit import fit
from stacx.imitation.split import split_tasks
from stacx.inference.models import resolve_model
from stacx.train.packing import Sample


def test_split_is_deterministic_disjoint_and_stable_under_additions() -> None:
    ids = [f"task-{i}" for i in range(40)]
    train, held = split_tasks(ids)
    assert split_tasks(list(reversed(ids))) == (train, held)
    assert set(train).isdisjoint(held) and sorted(train + held) == sorted(ids)
    assert 10 <= len(held) <= 30  # about half
    train2, held2 = split_tasks([*ids, "new-task"])
    assert set(held) <= set(held2) and set(train) <= set(train2)  # nobody moved
    assert split_tasks(ids, seed=1) != (train, held)


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from stacx.inference.models import default_model_dir, prepare_default_model

    prepare_default_model()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    path = tmp_path / "tiny"
    LlamaForCausalLM(config).save_pretrained(str(path))
    AutoTokenizer.from_pretrained(str(default_model_dir())).save_pretrained(str(path))
    return path


def test_sft_fit_lowers_the_loss_and_writes_a_loadable_checkpoint(
    tiny_model: Path, tmp_path: Path
) -> None:
    samples = [Sample([1, 2, 3, 4], [5, 6, 7]), Sample([8, 9], [10, 11, 12, 13])]
    out = tmp_path / "out"
    losses = fit(str(tiny_model), samples, out, steps=30, batch_size=2, lr=1e-2)
    assert losses[-1] < 0.5 * losses[0]
    assert resolve_model(out) == str(out.resolve())
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(out))  # loads as plain HF


def test_trainable_layers_leaves_lower_layers_and_embeddings_unchanged(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    fit(str(tiny_model), [Sample([1, 2, 3], [4, 5])], out, steps=3, lr=1e-2, trainable_layers=1)
    before = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.2.", "model.norm.")) for k in changed)


def test_a_snapshot_at_step_n_is_the_n_step_fit(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    samples = [Sample([1, 2, 3, 4], [5, 6, 7]), Sample([8, 9], [10, 11, 12, 13]), Sample([3], [2])]
    snap = tmp_path / "snap2"
    fit(str(tiny_model), samples, tmp_path / "long", steps=4, batch_size=2, lr=1e-2,
        snapshots={2: snap})
    fit(str(tiny_model), samples, tmp_path / "short", steps=2, batch_size=2, lr=1e-2)
    at_2 = AutoModelForCausalLM.from_pretrained(str(snap)).state_dict()
    short = AutoModelForCausalLM.from_pretrained(str(tmp_path / "short")).state_dict()
    final = AutoModelForCausalLM.from_pretrained(str(tmp_path / "long")).state_dict()
    assert all(torch.equal(at_2[k], short[k]) for k in short)
    assert any(not torch.equal(at_2[k], final[k]) for k in final)


def test_opd_samples_keep_aligned_rows_with_per_token_advantages() -> None:
    import pyarrow as pa

    from stacx.imitation.fit import samples_for

    table = pa.table(
        {
            "episode_id": ["a", "b"],
            "turn": [0, 0],
            "prompt_ids": [[1, 2], [3, 4]],
            "output_ids": [[5, 6], [7]],
            "student_logprobs": [[-1.0, -2.0], [-1.0]],
            "advantages": [[0.5, -0.25], None],
            "aligned": [True, False],
        }
    )
    (sample,) = samples_for(table, "opd")
    assert list(sample.completion_ids) == [5, 6]
    assert sample.token_values == {"behavior_logprobs": [-1.0, -2.0], "advantages": [0.5, -0.25]}
