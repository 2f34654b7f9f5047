"""Admission when requests outnumber rows (engine_admission.py): an episode's next turn takes
the row its previous turn held before new work does, holds stop when no next turn claims them,
and prefill runs in rounds of bounded new tokens with the same outputs."""

from __future__ import annotations

import asyncio
import time

import pytest

from stacx.inference.engine_admission import Holds, extends
from stacx.ports import SamplingParams
from tests.inference.test_kv_cache import MODES, engine, hf_greedy, prompts, small

GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


def test_extends_is_a_whole_prefix_test() -> None:
    p = list(range(100, 140))
    assert extends([*p, 1, 2], p) and extends(p, p)
    assert not extends(p[:-1], p)  # shorter
    assert not extends([*p[:-1], 7, 8], p)  # differs at the last position
    assert not extends([*p[:20], 9, *p[21:], 5], p)  # differs in the middle only
    assert not extends(p, [])


def test_holds_gate_until_claimed_or_expired_and_stop_when_they_do_not_pay() -> None:
    holds = Holds(hold_s=60.0, patience=2)
    a, b, c = list(range(10, 30)), list(range(40, 60)), list(range(70, 90))
    holds.release(a)
    holds.release(b)
    assert len(holds) == 2 and holds.wait_s() is not None
    assert [holds.find(p) for p in (c, [*b, 1], [*a, 3], a[:-1])] == [None, 1, 0, None]
    assert not holds.seen(c) and holds.seen([*b, 1])
    holds.claim([*b, 1])
    assert len(holds) == 1
    for h in holds.held:  # a's hold runs out unclaimed
        h.until = time.monotonic() - 1
    holds.expire()
    assert len(holds) == 0 and holds.misses == 1
    holds.release(c)
    holds.held[0].until = time.monotonic() - 1
    holds.expire()  # a second miss in a row: past patience, holds stop holding rows back
    holds.release(a)
    assert holds.held and len(holds) == 0 and holds.wait_s() is None
    assert holds.seen([*a, 4]) and holds.misses == 0  # a next turn came: they hold again
    holds.release(b)
    assert len(holds) == 2  # a's (until its next turn is admitted: `claim`) and b's
    holds.claim([*a, 4])
    assert len(holds) == 1 and holds.prompts() == [b]
    assert len(Holds(hold_s=0.0, patience=2)) == 0


def test_an_expired_hold_is_no_reason_to_wake() -> None:
    """The engine's idle wait sleeps `wait_s()`: a hold past its end must not make that 0 (a
    spin on a core and the GIL, for as long as no request comes, e.g. a whole train step)."""
    holds = Holds(hold_s=60.0, patience=5)
    holds.release(list(range(10, 30)))
    holds.release(list(range(40, 60)))
    holds.held[0].until = time.monotonic() - 1  # the first ran out, unclaimed; the second holds
    wait = holds.wait_s()
    assert wait is not None and wait > 50 and len(holds) == 1 and holds.misses == 1
    holds.held[0].until = time.monotonic() - 1
    assert holds.wait_s() is None and len(holds) == 0  # nothing left to wake for


@pytest.mark.parametrize("mode", MODES, ids=["slots", "paged"])
async def test_a_next_turn_takes_its_held_row_before_new_work(mode: dict[str, object]) -> None:
    """One row; episode A's turn 1 runs while episode C's first turn waits. A's turn 2 comes
    0.3 s after turn 1 returned (a tool call): it still runs before C, on A's cached keys,
    and equals HF generate. Without the hold, C would take the row in those 0.3 s."""
    model = small()
    a, c, obs = prompts(30, 34, 6, seed=3)
    e = engine(model, max_batch=1, hold_s=1.5, **mode)
    done: list[str] = []
    try:
        first = asyncio.ensure_future(e.generate([a], GREEDY))
        other = asyncio.ensure_future(e.generate([c], GREEDY))
        other.add_done_callback(lambda _: done.append("C"))
        (g1,) = await first
        await asyncio.sleep(0.3)
        assert not other.done()
        a2 = a + g1.output_ids + obs
        before = e.stats["reused_tokens"]
        (g2,) = await e.generate([a2], GREEDY)
        done.append("A2")
        assert e.stats["reused_tokens"] - before == len(a) + len(g1.output_ids) - 1
        assert g2.output_ids == hf_greedy(model, a2, GREEDY.max_new_tokens)
        await other
        assert done == ["A2", "C"]
    finally:
        await e.close()


async def test_prefill_runs_in_rounds_of_bounded_new_tokens() -> None:
    """Four 40-token prompts with 50 new tokens per round: two rounds of two (a round takes
    requests until its new tokens reach the budget); the same outputs as one round, and as HF."""
    model = small()
    ps = prompts(40, 40, 40, 40, seed=4)
    outs = []
    for budget, rounds in ((50, 2), (None, 1)):
        e = engine(model, max_batch=4, prefill_tokens=budget)
        try:
            outs.append([g.output_ids for g in await e.generate(ps, GREEDY)])
            assert e.stats["admit_rounds"] == rounds
        finally:
            await e.close()
    assert outs[0] == outs[1] == [hf_greedy(model, p, GREEDY.max_new_tokens) for p in ps]
