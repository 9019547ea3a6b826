"""Exact arithmetic in, plain numbers out."""

from fractions import Fraction


def number(x) -> int | float:
    """An int when ``x`` is whole, else a float."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)
