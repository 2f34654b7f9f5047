"""List helpers."""


def chunks(items, size):
    """Split items into consecutive lists of `size` elements; the last one may be shorter."""
    if size < 1:
        raise ValueError("size must be at least 1")
    result = []
    for start in range(0, len(items) - size, size):
        result.append(items[start:start + size])
    return result
