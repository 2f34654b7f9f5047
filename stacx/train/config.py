"""The trainer's configuration: one frozen, validated Struct (the recipe's ``[trainer]`` table).
Every field has a default (``TrainerConfig()`` is a tiny GRPO run); bad values and unknown keys fail
at load with a :class:`~stacx.errors.ConfigError` naming ``trainer.<field>``. ``algorithm`` names a
module of ``stacx.train.algorithms``, which checks the name and the keys that depend on it
(``algorithm_for``): this module knows no algorithm. ``filter`` is a SQL boolean over the source
view's columns, applied before readiness is counted.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from stacx.errors import ConfigError

MODES: Final = ("sync", "async")
DTYPES: Final = ("auto", "float32", "bfloat16", "float16")
OPTIMIZERS: Final = ("adamw", "sgd")


LORA_TARGETS: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The recipe's ``[trainer.lora]`` table: train a LoRA adapter (peft) instead of the weights.

    Each module whose name ends in one of ``target_modules`` (and, when ``trainer.trainable``
    is set, whose ``.weight`` matches it) gets ``W + (alpha / rank) * B @ A``; only A and B are
    trained, checkpointed and synced to engines (stacx.train.lora)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    # names of linear modules (their last name component: q_proj, ..., down_proj)
    target_modules: list[str] = msgspec.field(default_factory=lambda: list(LORA_TARGETS))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class TrainerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the trainer learns from the log. Field names are the recipe's ``[trainer]`` keys."""

    algorithm: str = "grpo"
    model: str = "default"  # what resolve_model() accepts: "default", an HF dir, a hub id
    steps: int = 1  # optimizer steps = weight versions published; the trainer stops after them
    mode: str = "sync"  # sync: train on current-version samples only; async: within max_staleness
    # optimizer
    optimizer: str = "adamw"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping
    warmup_steps: int = 0  # linear warmup of lr over the first steps
    # regex over parameter names: only matches are trained and checkpointed (the rest stays the
    # base model's); "" trains every parameter
    trainable: str = ""
    # [trainer.lora]: train a LoRA adapter; a weight version is then the adapter (None: off)
    lora: LoraConfig | None = None
    # batches
    batch_groups: int = 4  # grpo: groups per step
    batch_episodes: int = 8  # other algorithms: units (episodes) per step
    min_ready: int | None = None  # units that must be ready before a step; None: a full batch
    # optimizer steps per rollout iteration (sft, dagger: epochs over the aggregate dataset
    # after each roll-in; the scheduler starts iteration i once version i * this is published)
    steps_per_iteration: int = 1
    grad_accumulation: int = 1  # at least this many micro-batches per step
    max_tokens: int = 4096  # token positions per micro-batch (a longer sample gets its own)
    # samples with one prompt (a GRPO group) forward it once (packing.pack_shared): ~n times
    # fewer positions for short completions; mask-based attention only (ignored under varlen)
    share_prompts: bool = True
    # the turns of one chain (each prompt extends the previous turn's prompt + output, as
    # stored) train as ONE sequence (batches.chain_sequences; loss on the model's tokens
    # only): cost linear in turns, same logprobs and gradients as a sample per turn
    pack_episodes: bool = True
    # policy gradient
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # None: clip_eps (symmetric)
    tis_cap: float | None = None  # truncated importance sampling weight cap; None: off
    # IcePop-style token masking: tokens whose trainer/engine probability ratio
    # exp(trainer logprob - behavior logprob) leaves [low, high] get no gradient; None: off
    is_mask_band: tuple[float, float] | None = None
    normalize_std: bool = True  # grpo: divide the group-centred reward by the group std
    # opd (derived from algorithm.imitation): advantages recomputed from the view's logprobs
    opd_discount: float = 0.0  # 0: per-token log ratio; 1: summed over the turn's later tokens
    opd_grpo_weight: float = 0.0  # weight of the episode's GRPO advantage added to every token
    opd_center: bool = False  # subtract the batch's mean log-ratio advantage (a baseline)
    max_staleness: int = 0  # async: oldest usable sample, in weight versions behind the trainer
    # readiness of imitation units (derived from the recipe's teacher / algorithm.imitation):
    # the actors whose turns DAgger's teacher labels, and AggreVaTe's branches per parent
    label_actors: list[str] = msgspec.field(default_factory=lambda: ["student", "teacher"])
    branches: int = 2
    # data
    source: str = ""  # view to read; "" = the algorithm's default (see module docstring)
    filter: str = ""  # SQL boolean over the source's columns; "" = the algorithm's default
    # checkpoints
    save_every: int = 0  # keep every n-th version's checkpoint for good (0: none beyond keep_last)
    keep_last: int = 3  # newest checkpoints kept (the latest is always kept; 0 keeps all)
    # write a durable checkpoint of every n-th version only (and of the last); the others reach
    # the engines from memory, and a rerun after a crash redoes them from the log
    checkpoint_every: int = 1
    # write checkpoints in a writer thread while the next steps run (engines get each version
    # from the in-memory snapshot at once); a version whose write would find the previous one
    # still under way is not written (the next due one is); the last version is always written
    # before it is published. Needs inprocess_handoff and local placement
    background_checkpoint: bool = False
    # placement
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    seed: int = 0
    # also hand new weights over without the file: in memory to engines of this process, by
    # CUDA IPC / shared memory to other processes of the node (Ray placement)
    inprocess_handoff: bool = True
    # distributed (stacx.train.distributed): ranks of the one trainer, FSDP2-sharded; on GPU one
    # GPU each (placement.trainer.gpus), gloo processes on CPU. 1 with fsdp = false: no group.
    world_size: int = 1
    fsdp: bool = False  # shard with FSDP2 even at world_size 1 (always on when world_size > 1)
    activation_checkpointing: bool = False  # recompute decoder layers in backward (memory)
    # FSDP only: keep fp32 master weights and optimizer state, compute in `dtype` (bf16 on
    # CUDA) and reduce gradients in fp32 (MixedPrecisionPolicy)
    mixed_precision: bool = False
    # the fast step on CUDA (ignored on CPU): packed varlen attention (stacx.train.attention)
    # and torch.compile of the decoder layers; the chunked lm_head is always used
    fast: bool = True
    compile: bool = True  # with fast on CUDA: torch.compile the decoder layers
    dist_timeout_s: float = 600.0  # a collective waiting longer than this fails the step

    def __post_init__(self) -> None:
        # runs on construction and on msgspec decode/convert, so an embedding recipe Struct
        # validates its [trainer] table without calling anything
        validate(self)

    @property
    def sharded(self) -> bool:
        """Whether the trainer runs as an FSDP2 process group (stacx.train.distributed)."""
        return self.world_size > 1 or self.fsdp

    @property
    def staleness_limit(self) -> int:
        """Sync mode trains on samples of the current weights only."""
        return 0 if self.mode == "sync" else self.max_staleness


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def config_error(key: str, value: object, accepted: str) -> ConfigError:
    """The error for ``trainer.<key> = value``, naming the accepted values."""
    return ConfigError(f"trainer.{key} = {value!r}: accepted values are {accepted}")


def validate(cfg: TrainerConfig) -> TrainerConfig:
    """Check values msgspec's types cannot express, but for those that depend on the algorithm
    (``stacx.train.algorithms.algorithm_for``); returns ``cfg`` unchanged."""
    _check_ranges(cfg)
    if cfg.background_checkpoint and not cfg.inprocess_handoff:
        raise config_error(
            "background_checkpoint",
            True,
            "false unless trainer.inprocess_handoff (engines get a version before its file)",
        )
    if cfg.mixed_precision and not cfg.sharded:
        raise config_error(
            "mixed_precision", True, "false unless the trainer shards (world_size > 1 or fsdp)"
        )
    if cfg.min_ready is not None and cfg.min_ready < 1:
        raise config_error("min_ready", cfg.min_ready, "an integer >= 1, at most the batch size")
    if cfg.weight_decay < 0:
        raise config_error("weight_decay", cfg.weight_decay, "a float >= 0")
    if not all(0 <= b < 1 for b in cfg.betas):
        raise config_error("betas", list(cfg.betas), "two floats in [0, 1)")
    if cfg.max_grad_norm is not None and not cfg.max_grad_norm > 0:
        raise config_error(
            "max_grad_norm", cfg.max_grad_norm, "a float > 0, or omitted for no clipping"
        )
    if not 0 <= cfg.clip_eps < 1:
        raise config_error("clip_eps", cfg.clip_eps, "a float in [0, 1)")
    if cfg.clip_eps_high is not None and cfg.clip_eps_high < 0:
        raise config_error("clip_eps_high", cfg.clip_eps_high, "a float >= 0")
    if cfg.tis_cap is not None and not cfg.tis_cap > 0:
        raise config_error("tis_cap", cfg.tis_cap, "a float > 0, or omitted for no TIS correction")
    if cfg.is_mask_band is not None and not 0 < cfg.is_mask_band[0] < 1 < cfg.is_mask_band[1]:
        raise config_error(
            "is_mask_band",
            list(cfg.is_mask_band),
            "[low, high] with 0 < low < 1 < high, e.g. [0.5, 2.0], or omitted",
        )
    if cfg.source and not _IDENT.match(cfg.source):
        raise config_error("source", cfg.source, "the name of a view or table (letters, digits, _)")
    if ";" in cfg.filter:
        raise config_error("filter", cfg.filter, "one SQL boolean expression (no ';')")
    if cfg.trainable:
        try:
            re.compile(cfg.trainable)
        except re.error as e:
            raise config_error("trainable", cfg.trainable, f"a Python regex ({e})") from e
    if cfg.lora is not None:
        _validate_lora(cfg.lora)
    if cfg.device != "auto" and not re.match(r"^(cpu|cuda|cuda:\d+|mps)$", cfg.device):
        raise config_error("device", cfg.device, "auto | cpu | cuda | cuda:N")
    return cfg


def _check_ranges(cfg: TrainerConfig) -> None:
    """The named choices, and the integers and floats that must be positive."""
    choices = {"mode": MODES, "dtype": DTYPES, "optimizer": OPTIMIZERS}
    for key, accepted in choices.items():
        value = getattr(cfg, key)
        if value not in accepted:
            raise config_error(key, value, " | ".join(accepted))
    positive = (
        "steps",
        "checkpoint_every",
        "batch_groups",
        "batch_episodes",
        "grad_accumulation",
        "max_tokens",
        "steps_per_iteration",
        "branches",
        "world_size",
    )
    for key in positive:
        if getattr(cfg, key) < 1:
            raise config_error(key, getattr(cfg, key), "an integer >= 1")
    for key in ("warmup_steps", "max_staleness", "save_every", "keep_last"):
        if getattr(cfg, key) < 0:
            raise config_error(key, getattr(cfg, key), "an integer >= 0")
    for key in ("lr", "dist_timeout_s"):
        if not getattr(cfg, key) > 0:
            raise config_error(key, getattr(cfg, key), "a float > 0")


def _validate_lora(lora: LoraConfig) -> None:
    if lora.rank < 1:
        raise config_error("lora.rank", lora.rank, "an integer >= 1")
    if not lora.alpha > 0:
        raise config_error("lora.alpha", lora.alpha, "a float > 0")
    if not 0 <= lora.dropout < 1:
        raise config_error("lora.dropout", lora.dropout, "a float in [0, 1)")
    bad = [m for m in lora.target_modules if not _IDENT.match(m)]
    if not lora.target_modules or bad:
        raise config_error(
            "lora.target_modules",
            lora.target_modules,
            f"a non-empty list of linear module names, e.g. {list(LORA_TARGETS)}",
        )


def load(data: dict[str, object]) -> TrainerConfig:
    """A validated config from a plain mapping (the recipe's ``[trainer]`` table)."""
    try:
        cfg = msgspec.convert(data, TrainerConfig, strict=False)
    except msgspec.ValidationError as e:
        # msgspec names the path as `$.key`; say it as the recipe does
        message = str(e).replace("$.", "trainer.")
        if "unknown field" in message:
            fields = (LoraConfig if "trainer.lora" in message else TrainerConfig).__struct_fields__
            message += f"; accepted keys are {', '.join(fields)}"
        raise ConfigError(f"trainer: {message}") from e
    return cfg
