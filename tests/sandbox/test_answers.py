"""The answer verifier (stacx.sandbox.answers): normalization and comparison, pure."""

from __future__ import annotations

import pytest

from stacx.sandbox.answers import answer_reward, answers_match, normalize_answer


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("7", "7"),
        ("7.0", "7"),
        ("7.000", "7"),
        ("1,000", "1000"),
        ("1,234,567", "1234567"),
        ("3/4", "0.75"),
        ("\\frac{3}{4}", "0.75"),
        ("\\dfrac{3}{4}", "3/4"),
        ("6/8", "3/4"),
        ("-3", "-3"),
        ("\u22123", "-3"),  # a unicode minus
        ("-\\frac{1}{2}", "-0.5"),
        ("\\frac{-1}{2}", "-1/2"),
        ("+5", "5"),
        (" 42 ", "42"),
        ("$42$", "42"),
        ("42.", "42"),
        ("x = 42", "42"),
        ("\\boxed{42}", "42"),
        ("1e3", "1000"),
        ("\\text{Tuesday}", "tuesday"),
        ("(1, 2)", "(1,2)"),
    ],
)
def test_equal_answers_match(given: str, expected: str) -> None:
    assert answers_match(given, expected)
    assert answer_reward(given, expected) == 1.0


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("8", "7"),
        ("-7", "7"),
        ("0.333", "1/3"),  # decimals compare exactly
        ("1,2", "12"),  # not a thousands separator
        ("50%", "0.5"),  # percentages are text
        ("", "0"),
        ("", ""),  # no answer never matches
        ("7 apples", "7"),
        ("1/0", "0"),
    ],
)
def test_different_answers_do_not_match(given: str, expected: str) -> None:
    assert not answers_match(given, expected)
    assert answer_reward(given, expected) == 0.0


def test_no_answer_is_reward_zero() -> None:
    assert answer_reward(None, "7") == 0.0


def test_normal_form_is_a_reduced_fraction() -> None:
    assert normalize_answer("\\frac{10}{4}") == "5/2"
    assert normalize_answer("2.50") == "5/2"
    assert normalize_answer("-0") == "0"


@pytest.mark.parametrize("junk", ["\\frac{", "}}}", "\\boxed{", "1/", "/", "((", "1e", "\\"])
def test_normalizer_never_raises(junk: str) -> None:
    normalize_answer(junk)
    assert not answers_match(junk, "1")
