"""What a lesson prints of a float: only what every machine prints alike (``mt.alike``).

The committed outputs are compared digit for digit with a new run (nbval), on whatever
CPU runs it. A float64 result's last digits depend on the order of its sums, which the
CPU's vector width, the BLAS and the thread count choose: the same lesson printed
``3.484424086482772`` on one machine and ``…773`` on another, and an error of ``4.2e-17``
here, ``3.5e-17`` there. So a lesson prints (docs/testing.md, "Outputs every machine
prints alike"):

* an error, a difference that should be rounding: the bound it is under, ``< 1e-12``,
  with `below` (which refuses to print a bound that does not hold);
* an exact comparison: a boolean, ``equal: True``;
* a value: a few significant digits with `digits` (6 unless asked), never past 10.

    print(f"largest parameter difference: {mt.alike.below(err, 1e-12)}")  # < 1e-12
    print(f"loss {mt.alike.digits(loss)}")                                  # loss 3.48442

Why a few digits hold: two machines' float64 results differ by a few units in the 16th
digit, so their first 6 digits differ only where the value lies that close to a rounding
edge, about one value in 10^9. The test that keeps the outputs this way is
tests/course/test_notebook_outputs.py.
"""

from __future__ import annotations

import math

MOST_DIGITS = 10  # past this, a last digit is a machine's summation order, not the model


def below(error: float, bound: float) -> str:
    """``"< 1e-12"``: `error` (a measured difference) is under `bound`, which is printed.

    Refuses (ValueError) an error that is not under the bound, NaN included: a printed
    bound is a claim, never a silent wrong number. The lesson's own assertion still says
    what must hold; this only decides what is shown."""
    error, bound = float(error), float(bound)
    if not bound > 0 or not math.isfinite(bound):
        raise ValueError(f"the bound must be a positive finite number, got {bound!r}")
    if not abs(error) < bound:
        raise ValueError(f"{error!r} is not below {bound:g}: print it, do not bound it")
    return f"< {bound:g}"


def digits(value: float, significant: int = 6) -> str:
    """`value` to `significant` digits (trailing zeros kept, so columns align):
    ``digits(3.484424086482772)`` is ``"3.48442"``. At most 10: past that, the last
    digits are the summation order of the machine that ran it."""
    if not 1 <= significant <= MOST_DIGITS:
        raise ValueError(f"significant digits must be 1 to {MOST_DIGITS}, got {significant!r}")
    return f"{float(value):#.{significant}g}"
