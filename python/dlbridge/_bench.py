"""The timing the benchmark scripts and the demo share (not part of the API).

``median_time(f)`` is what each of them prints beside torch's figure: seconds per call of
``f()``, the median of a few samples of many calls, so that one slow sample (the machine is
noisy) does not move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def median_time(f: Callable[[], Any], number: int | None = None, repeat: int = 9, *, warm_up: bool = True) -> float:
    """Seconds per call of ``f()``: the median of ``repeat`` samples of ``number`` calls
    each, after one call that warms up (caches, lazy initialisation, the allocator; pass
    ``warm_up=False`` where the caller has just called ``f`` itself). ``number=None``: as
    many calls as take about 20 ms (1 to 10000), from the time of one more call."""
    if warm_up:
        f()
    if number is None:
        t0 = time.perf_counter()
        f()
        one = max(time.perf_counter() - t0, 1e-7)
        number = max(1, min(10000, int(0.02 / one)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            f()
        samples.append((time.perf_counter() - t0) / number)
    return sorted(samples)[len(samples) // 2]
