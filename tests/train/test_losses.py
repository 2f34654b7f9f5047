"""Losses and advantages against float64 references written as plain Python loops."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from stacx.train.advantages import (
    AdvantageInputError,
    discounted_returns,
    opd_advantages,
)
from stacx.train.losses import (
    LossInputError,
    advantage_weighted_loss,
    chunked_token_logprobs,
    masked_mean,
    policy_gradient_loss,
    sft_loss,
    token_logprobs,
)
from tests.train.oracles import aggrevate_advantages, group_advantages, group_index

F64 = torch.float64


def t64(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


# ---- references ------------------------------------------------------------------------------


def ref_logprob(logits: list[float], target: int) -> float:
    m = max(logits)
    return logits[target] - (m + math.log(sum(math.exp(x - m) for x in logits)))


def ref_pg(
    lp: list[list[float]],
    beh: list[list[float]],
    adv: list[list[float]],
    mask: list[list[int]],
    lo: float,
    hi: float,
    old: list[list[float]] | None = None,
    cap: float | None = None,
) -> float:
    total, count = 0.0, 0
    for b in range(len(lp)):
        for t in range(len(lp[b])):
            if not mask[b][t]:
                continue
            prox = old[b][t] if old is not None else beh[b][t]
            r = math.exp(lp[b][t] - prox)
            a = adv[b][t]
            term = -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
            if cap is not None and old is not None:
                term *= min(math.exp(old[b][t] - beh[b][t]), cap)
            total += term
            count += 1
    return total / count if count else 0.0


def ref_group_adv(rewards: list[float], groups: list[str], std: bool, eps: float) -> list[float]:
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        if len(set(members)) == 1:
            out.append(0.0)
            continue
        a = r - statistics.fmean(members)
        out.append(a / (statistics.stdev(members) + eps) if std else a)
    return out


# ---- masked mean / SFT -----------------------------------------------------------------------


def test_masked_mean_is_token_level_not_per_sequence() -> None:
    values = t64([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token-level: (1+2+3+10)/4 = 4; a per-sequence mean would give (2+10)/2 = 6
    assert masked_mean(values, mask).item() == pytest.approx(4.0)
    assert masked_mean(values, mask, normalizer=8.0).item() == pytest.approx(2.0)


def test_masked_mean_ignores_nan_in_padding_and_its_gradient() -> None:
    values = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 0]])
    out = masked_mean(values, mask)
    out.backward()
    assert out.item() == pytest.approx(2.0)
    assert values.grad is not None
    assert torch.equal(values.grad, t64([[0.5, 0.0], [0.5, 0.0]]))


def test_empty_mask_gives_zero_loss_and_zero_grad_not_nan() -> None:
    lp = torch.randn(2, 3, dtype=F64, requires_grad=True)
    mask = torch.zeros(2, 3)
    for out in (
        sft_loss(lp, mask).loss,
        policy_gradient_loss(lp, lp.detach() - 0.1, torch.ones(2, 3, dtype=F64), mask).loss,
        advantage_weighted_loss(lp, torch.ones(2, 3, dtype=F64), mask).loss,
    ):
        out.backward()
        assert out.item() == 0.0
        assert lp.grad is not None and torch.all(lp.grad == 0)


def test_sft_loss_matches_reference_cross_entropy_with_padding() -> None:
    logits = [
        [[0.1, 2.0, -1.0], [0.5, 0.5, 0.0], [3.0, 0.0, 0.0]],
        [[1.0, 0.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 0.0]],
    ]
    targets = [[1, 0, 2], [0, 2, 1]]
    mask = [[0, 1, 1], [1, 0, 0]]  # row 1 is mostly padding
    expected = -statistics.fmean(
        ref_logprob(logits[b][t], targets[b][t]) for b in range(2) for t in range(3) if mask[b][t]
    )
    lp = token_logprobs(torch.tensor(logits, dtype=F64), torch.tensor(targets))
    got = sft_loss(lp, torch.tensor(mask)).loss.item()
    assert got == pytest.approx(expected, rel=1e-12)


# ---- chunked cross-entropy -------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_chunked_logprobs_equal_full_logits_forward_and_backward(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    n, h, v = 11, 6, 50
    hidden = torch.randn(n, h, dtype=F64, generator=g, requires_grad=True)
    weight = torch.randn(v, h, dtype=F64, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    upstream = torch.randn(n, dtype=F64, generator=g)

    full = torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None]).squeeze(1)
    grad_h_ref, grad_w_ref = torch.autograd.grad((full * upstream).sum(), (hidden, weight))

    got = chunked_token_logprobs(hidden, weight, targets, chunk_tokens=chunk)
    assert got.dtype == F64
    assert torch.allclose(got, full, atol=1e-12)
    grad_h, grad_w = torch.autograd.grad((got * upstream).sum(), (hidden, weight))
    assert torch.allclose(grad_h, grad_h_ref, atol=1e-12)
    assert torch.allclose(grad_w, grad_w_ref, atol=1e-12)


def test_chunked_logprobs_in_bf16_track_the_fp32_reference() -> None:
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(64, 32, generator=g)
    weight = torch.randn(1000, 32, generator=g) * 0.1
    targets = torch.randint(0, 1000, (64,), generator=g)
    full = torch.log_softmax(hidden @ weight.T, dim=-1).gather(1, targets[:, None]).squeeze(1)
    got = chunked_token_logprobs(hidden.bfloat16(), weight.bfloat16(), targets, chunk_tokens=10)
    assert got.dtype == torch.float32
    assert torch.allclose(got, full, atol=0.1)  # bf16 matmul error only; statistics are fp32


def test_chunked_logprobs_pass_gradcheck() -> None:
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 3, dtype=F64, generator=g, requires_grad=True)
    weight = torch.randn(7, 3, dtype=F64, generator=g, requires_grad=True)
    targets = torch.randint(0, 7, (5,), generator=g)

    def f(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return chunked_token_logprobs(h, w, targets, chunk_tokens=2)

    assert torch.autograd.gradcheck(f, (hidden, weight))


def test_chunked_logprobs_keep_no_logits_for_backward() -> None:
    """What autograd saves is hidden, weight, targets and one float per token: no [N, V] buffer
    outlives the forward (the point of chunking over a 152k vocabulary)."""
    n, h, v = 64, 8, 5000
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    saved: list[int] = []

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        out = chunked_token_logprobs(hidden, weight, torch.randint(0, v, (n,)), chunk_tokens=16)
    out.sum().backward()
    assert saved and max(saved) == v * h  # the weight itself; nothing of size n * v
    assert hidden.grad is not None and weight.grad is not None


def test_chunked_logprobs_reject_mismatched_shapes() -> None:
    with pytest.raises(LossInputError, match="shapes disagree"):
        chunked_token_logprobs(
            torch.randn(4, 3), torch.randn(9, 5), torch.zeros(4, dtype=torch.long)
        )


# ---- policy gradient (GRPO / OPD) ------------------------------------------------------------

LP = [[-1.0, -0.5, -2.0, -0.1], [-0.3, -3.0, -1.2, -0.7]]
BEH = [[-1.5, -0.5, -1.0, -0.1], [-0.31, -2.0, -1.25, -9.0]]
ADV = [[1.0, 1.0, 1.0, 1.0], [-0.5, -0.5, -0.5, -0.5]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 0]]  # last token of each row is padding (garbage behavior lp)


def test_policy_gradient_loss_matches_reference_with_clipping_active() -> None:
    out = policy_gradient_loss(
        t64(LP), t64(BEH), t64(ADV), torch.tensor(MASK), clip_eps_low=0.2, clip_eps_high=0.28
    )
    assert out.loss.item() == pytest.approx(ref_pg(LP, BEH, ADV, MASK, 0.2, 0.28), rel=1e-9)
    # ratios: e^0.5 (A>0: clipped at 1.28), 1, e^-1 (A>0: unclipped), e^0.01, e^-1 (A<0: clipped at 0.8), e^0.05
    assert out.metrics["clip_frac"].item() == pytest.approx(2 / 6)


def test_policy_gradient_loss_without_active_clipping_is_plain_importance_weighted_pg() -> None:
    lp = [[-1.0, -0.5]]
    beh = [[-1.01, -0.49]]
    adv = [[2.0, -1.0]]
    mask = [[1, 1]]
    out = policy_gradient_loss(t64(lp), t64(beh), t64(adv), torch.tensor(mask))
    expected = -(math.exp(0.01) * 2.0 + math.exp(-0.01) * -1.0) / 2
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    assert out.metrics["clip_frac"].item() == 0.0


def test_clipped_tokens_get_no_gradient_and_unclipped_get_advantage_times_ratio() -> None:
    lp = torch.tensor([[-0.5, -1.0]], dtype=F64, requires_grad=True)
    beh = t64([[-1.5, -1.0]])  # token 0: ratio e^1 > 1.2 with A>0 -> clipped; token 1: ratio 1
    out = policy_gradient_loss(lp, beh, t64([[1.0, 1.0]]), torch.ones(1, 2))
    out.loss.backward()
    assert lp.grad is not None
    assert lp.grad[0, 0].item() == 0.0
    assert lp.grad[0, 1].item() == pytest.approx(-0.5)  # -(A * ratio) / n_tokens


def test_truncated_importance_sampling_weights_and_caps() -> None:
    old = [[-1.2, -0.5, -2.0, 0.0], [-0.3, -2.5, -1.2, 0.0]]
    for cap in (2.0, 1.1):
        out = policy_gradient_loss(
            t64(LP), t64(BEH), t64(ADV), torch.tensor(MASK), old_logprobs_B_T=t64(old), tis_cap=cap
        )
        expected = ref_pg(LP, BEH, ADV, MASK, 0.2, 0.2, old=old, cap=cap)
        assert out.loss.item() == pytest.approx(expected, rel=1e-9)
    with pytest.raises(LossInputError, match="old_logprobs"):
        policy_gradient_loss(t64(LP), t64(BEH), t64(ADV), torch.tensor(MASK), tis_cap=2.0)


def test_is_mask_band_drops_tokens_whose_ratio_leaves_the_band() -> None:
    """IcePop-style masking: a token whose trainer/engine ratio exp(old - behavior) leaves the
    band gets no gradient and no loss; the others are as without the band (same normalizer)."""
    old = [
        [-1.0, -0.5, -2.0, 0.0],
        [-0.3, -0.5, -1.2, 0.0],
    ]  # ratios: e^.5, 1, e^-1 | ~1, e^1.5, ~1
    lp = torch.tensor(LP, dtype=F64, requires_grad=True)
    out = policy_gradient_loss(
        lp, t64(BEH), t64(ADV), torch.tensor(MASK), old_logprobs_B_T=t64(old), mask_band=(0.5, 2.0)
    )
    out.loss.backward()
    assert lp.grad is not None
    kept = [[1, 1, 0, 0], [1, 0, 1, 0]]  # e^-1 < 0.5 and e^1.5 > 2 leave the band
    for r in range(2):
        for t in range(4):
            assert (lp.grad[r, t].item() != 0.0) == bool(kept[r][t]), (r, t)
    plain = policy_gradient_loss(
        t64(LP), t64(BEH), t64(ADV), torch.tensor(kept), old_logprobs_B_T=t64(old), normalizer=6.0
    )
    assert out.loss.item() == pytest.approx(plain.loss.item(), rel=1e-9)
    assert out.metrics["is_masked_frac"].item() == pytest.approx(2 / 6)
    with pytest.raises(LossInputError, match="mask_band needs old_logprobs"):
        policy_gradient_loss(t64(LP), t64(BEH), t64(ADV), torch.tensor(MASK), mask_band=(0.5, 2.0))


def test_policy_gradient_rejects_mismatched_shapes() -> None:
    with pytest.raises(LossInputError, match="one shape"):
        policy_gradient_loss(t64(LP), t64(BEH), t64([[1.0]]), torch.tensor(MASK))


# ---- advantages ------------------------------------------------------------------------------


def test_group_advantages_match_reference_mean_and_std() -> None:
    rewards = [1.0, 0.0, 0.5, 0.25, 1.0, 0.0, 0.0]
    groups = ["a", "a", "a", "b", "b", "c", "c"]
    idx = group_index(groups)
    for std in (False, True):
        got = group_advantages(torch.tensor(rewards, dtype=F64), idx, normalize_std=std, eps=1e-6)
        assert got.tolist() == pytest.approx(ref_group_adv(rewards, groups, std, 1e-6), rel=1e-12)


def test_all_equal_reward_groups_and_singletons_get_exactly_zero() -> None:
    # 0.1 three times: the fp mean is not exactly 0.1, yet the advantage must be exactly 0
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.7], dtype=F64)
    idx = torch.tensor([0, 0, 0, 1, 2])
    for std in (False, True):
        got = group_advantages(rewards, idx, normalize_std=std)
        assert not torch.isnan(got).any()
        assert got.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0]


def test_group_advantages_reject_bad_input() -> None:
    with pytest.raises(AdvantageInputError, match="one length"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(AdvantageInputError, match="eps"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), eps=0.0)


def test_aggrevate_advantage_is_negative_centered_cost_to_go() -> None:
    cost = [0.0, 1.0, 1.0, 0.5, 0.5, 1.0]
    state = [0, 0, 0, 1, 1, 2]  # state 1: equal costs; state 2: one action
    got = aggrevate_advantages(torch.tensor(cost, dtype=F64), torch.tensor(state))
    mean0 = 2.0 / 3.0
    assert got.tolist() == pytest.approx([mean0, mean0 - 1, mean0 - 1, 0.0, 0.0, 0.0])


def test_opd_advantage_is_the_log_ratio_masked_with_optional_grpo_term() -> None:
    teacher = t64([[-0.1, -2.0, float("nan")]])
    student = t64([[-0.5, -1.0, -0.2]])
    mask = torch.tensor([[1, 1, 0]])
    assert opd_advantages(teacher - student, mask)[0].tolist() == pytest.approx([0.4, -1.0, 0.0])
    grpo = t64([[1.0, 1.0, 1.0]])
    got = opd_advantages(teacher - student, mask, grpo_advantages_B_T=grpo, grpo_coef=0.5)
    assert got[0].tolist() == pytest.approx([0.9, -0.5, 0.0])


def test_discounted_returns_match_a_reference_loop_and_skip_unmasked_positions() -> None:
    values = [[0.5, -1.0, 9.0, 2.0, -0.25], [1.0, 1.0, 1.0, 1.0, 1.0]]
    mask = [[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]]
    for gamma in (0.0, 0.5, 1.0):
        expected = []
        for row, m in zip(values, mask, strict=True):
            out, running = [0.0] * len(row), 0.0
            for t in reversed(range(len(row))):
                if m[t]:
                    running = row[t] + gamma * running
                    out[t] = running
            expected.append(out)
        got = discounted_returns(t64(values), torch.tensor(mask), gamma)
        assert got.dtype == F64
        for got_row, want in zip(got.tolist(), expected, strict=True):
            assert got_row == pytest.approx(want, rel=1e-12)
    with pytest.raises(AdvantageInputError, match="discount"):
        discounted_returns(t64(values), torch.tensor(mask), 1.5)


def test_opd_discount_charges_a_token_for_the_later_tokens_the_teacher_rejects() -> None:
    teacher = t64([[-0.1, -3.0, -0.1]])
    student = t64([[-0.1, -0.1, -0.1]])
    mask = torch.ones(1, 3)
    per_token = opd_advantages(teacher - student, mask)[0].tolist()
    whole_turn = opd_advantages(teacher - student, mask, discount=1.0)[0].tolist()
    assert per_token == pytest.approx([0.0, -2.9, 0.0])
    assert whole_turn == pytest.approx([-2.9, -2.9, 0.0])


def test_opd_center_subtracts_the_batch_mean_over_masked_tokens_before_the_grpo_term() -> None:
    teacher = t64([[-0.1, -2.0, float("nan")], [-1.0, 0.0, 0.0]])
    student = t64([[-0.5, -1.0, -0.2], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ratios = [0.4, -1.0, -0.5]  # the masked tokens' teacher - student
    mean = sum(ratios) / len(ratios)
    got = opd_advantages(teacher - student, mask, center=True)
    assert got[0].tolist() == pytest.approx([0.4 - mean, -1.0 - mean, 0.0])
    assert got[1].tolist() == pytest.approx([-0.5 - mean, 0.0, 0.0])
    grpo = t64([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    got = opd_advantages(
        teacher - student, mask, center=True, grpo_advantages_B_T=grpo, grpo_coef=0.5
    )
    assert got[1].tolist() == pytest.approx([-0.5 - mean - 0.5, 0.0, 0.0])


def test_opd_loss_gradient_raises_tokens_the_teacher_prefers() -> None:
    lp = torch.tensor([[-0.5, -1.0]], dtype=F64, requires_grad=True)
    adv = opd_advantages(t64([[-0.1, -2.0]]) - lp.detach(), torch.ones(1, 2))
    policy_gradient_loss(lp, lp.detach(), adv, torch.ones(1, 2)).loss.backward()
    assert lp.grad is not None
    # gradient descent raises logprob where the teacher is more confident, lowers it elsewhere
    assert lp.grad[0, 0].item() < 0 < lp.grad[0, 1].item()


def test_advantage_weighted_loss_matches_reference() -> None:
    lp = [[-1.0, -2.0], [-0.5, -0.25]]
    adv = [[0.5, 0.5], [-1.0, -1.0]]
    mask = [[1, 1], [1, 0]]
    expected = -(0.5 * -1.0 + 0.5 * -2.0 + -1.0 * -0.5) / 3
    got = advantage_weighted_loss(t64(lp), t64(adv), torch.tensor(mask)).loss.item()
    assert got == pytest.approx(expected, rel=1e-12)
