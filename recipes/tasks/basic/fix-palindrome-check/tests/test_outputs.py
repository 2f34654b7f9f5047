import sys

sys.path.insert(0, "/app")
from textcheck import is_palindrome  # noqa: E402


def test_simple():
    assert is_palindrome("racecar")
    assert not is_palindrome("hello")

def test_case_insensitive():
    assert is_palindrome("RaceCar")
    assert is_palindrome("Anna")

def test_punctuation_and_spaces():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("Was it a car or a cat I saw?")
    assert is_palindrome("No 'x' in Nixon")

def test_digits():
    assert is_palindrome("12 3 21")
    assert not is_palindrome("123 45")

def test_empty_and_symbols_only():
    assert is_palindrome("")
    assert is_palindrome("!!")

def test_not_palindrome_with_punctuation():
    assert not is_palindrome("Hello, world!")
