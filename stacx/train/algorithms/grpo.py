"""GRPO: a group of samples per task, each episode's reward centred on its group's (and divided
by the group's std with ``trainer.normalize_std``; the view ``grpo_batch``), clipped policy
gradient against the engine's behavior logprobs. The unit is a group."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stacx.train.algorithms.base import Algorithm
from stacx.train.columns import samples_from_table
from stacx.train.losses import LossOutput, policy_gradient_loss

if TYPE_CHECKING:
    import pyarrow as pa
    from torch import Tensor

    from stacx.train.config import TrainerConfig
    from stacx.train.packing import PackedBatch, Sample


def policy_gradient(
    cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
) -> LossOutput:
    """The clipped policy-gradient loss of every on-policy algorithm (GRPO, RLOO, OPD)."""
    return policy_gradient_loss(
        logprobs_B_T,
        batch.values_R_T["behavior_logprobs"],
        batch.values_R_T["advantages"],
        batch.loss_mask_R_T,
        clip_eps_low=cfg.clip_eps,
        clip_eps_high=cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high,
        # one optimizer step per batch: the pre-update logprobs are these, detached
        old_logprobs_B_T=logprobs_B_T.detach()
        if cfg.tis_cap is not None or cfg.is_mask_band is not None
        else None,
        tis_cap=cfg.tis_cap,
        mask_band=cfg.is_mask_band,
        normalizer=normalizer,
    )


class Grpo(Algorithm):
    name: ClassVar[str] = "grpo"
    installed_agents: ClassVar[bool] = True
    source: ClassVar[str] = "grpo_batch"
    ready_view: ClassVar[str] = "ready_groups"
    complete: ClassVar[str] = "u.complete"
    done: ClassVar[str] = "u.done"
    fresh_only: ClassVar[bool] = True
    per_group: ClassVar[bool] = True
    token_versions: ClassVar[bool] = True
    values: ClassVar[tuple[str, ...]] = ("behavior_logprobs", "advantages")

    def advantage_column(self, cfg: TrainerConfig, table: pa.Table) -> tuple[pa.Table, str]:
        """The source's column holding each row's (episode's) advantage."""
        return table, "advantage_std" if cfg.normalize_std else "advantage"

    def samples(self, cfg: TrainerConfig, table: pa.Table, *, prompt: str | None) -> list[Sample]:
        table, adv = self.advantage_column(cfg, table)
        return samples_from_table(
            table,
            prompt=prompt,
            completion="output_ids",
            token_columns={"behavior_logprobs": "behavior_logprobs"},
            scalar_columns={"advantages": adv},
        )

    def loss(
        self, cfg: TrainerConfig, logprobs_B_T: Tensor, batch: PackedBatch, normalizer: float
    ) -> LossOutput:
        return policy_gradient(cfg, logprobs_B_T, batch, normalizer)


ALGORITHM = Grpo()
