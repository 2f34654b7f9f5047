"""Descriptive statistics."""


def mean(values):
    """Arithmetic mean; 0.0 for an empty list."""
    return sum(values) / len(values)


def median(values):
    """Median (average of the two middle values for an even count); 0.0 for an empty list."""
    values.sort()
    mid = len(values) // 2
    return float(values[mid])
