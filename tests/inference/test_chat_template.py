"""`pick_function`: which tool a "required" call of several tools is forced to call, given the
model's score of each call's opening."""

from __future__ import annotations

import math

from stacx.inference.chat_template import pick_function


def test_temperature_zero_takes_the_likeliest() -> None:
    assert pick_function([-7.0, -0.5, -3.0], 0.0, None) == 1
    assert pick_function([-0.5, -0.5], 0.0, None) == 0  # a tie: the first listed


def test_sampled_picks_follow_the_scores_and_the_seed() -> None:
    scores = [math.log(0.2), math.log(0.8)]
    picks = [pick_function(scores, 1.0, seed) for seed in range(400)]
    assert picks == [pick_function(scores, 1.0, seed) for seed in range(400)]  # the seed decides
    assert 0.7 < picks.count(1) / 400 < 0.9  # about the model's 0.8
    # a lower temperature sharpens the distribution, as for the tokens that follow
    assert sum(pick_function(scores, 0.25, seed) for seed in range(400)) > 390
