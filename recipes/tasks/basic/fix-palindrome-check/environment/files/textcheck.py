"""Text checks."""


def is_palindrome(text):
    """True if text reads the same both ways, ignoring case and non-alphanumerics."""
    return text == text[::-1]
