"""Whole numbers: what a size must be, and how a size is cut into k equal slices."""

from __future__ import annotations

import math


def check_positive_int(name: str, value) -> int:
    """`value`, if it is a positive int (not a bool); else a ValueError naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


MAX_TIMEOUT = 1e9  # seconds (31 years): 1e300 overflowed the ranks' store timeout


def check_timeout(timeout) -> float:
    """`timeout`, if it is a positive, finite number of seconds (not a bool); else a
    ValueError. Written once for `mt.launch` and the CLIs' --timeout, so a CLI refuses in its
    parent, with the launcher's own words, what the launcher would refuse."""
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    if timeout > MAX_TIMEOUT:
        raise ValueError(f"timeout must be at most {MAX_TIMEOUT:.0e} seconds (a rank's store "
                         f"takes it as a timedelta, which overflows), got {timeout!r}")
    return timeout


def ceil_div(n: int, k: int) -> int:
    """⌈n / k⌉ in integers: the size of each of k equal slices that hold n (padded)."""
    return -(-n // k)


def round_up(n: int, k: int) -> int:
    """n rounded up to a multiple of k: what a flat vector or a vocabulary is padded to
    so that k ranks hold equal slices (collectives need equal shapes)."""
    return ceil_div(n, k) * k
