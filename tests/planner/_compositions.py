"""Every way to write ``total`` as an ordered sum of ``parts`` integers, each at least ``low``
(the layer splits a brute force enumerates)."""


def compositions(total: int, parts: int, low: int):
    if parts == 1:
        if total >= low:
            yield (total,)
        return
    for first in range(low, total - low * (parts - 1) + 1):
        for rest in compositions(total - first, parts - 1, low):
            yield (first,) + rest
