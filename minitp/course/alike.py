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
* a value: 6 significant digits at most, with `digits`.

    print(f"largest parameter difference: {mt.alike.below(err, 1e-12)}")  # < 1e-12
    print(f"loss {mt.alike.digits(loss)}")                                  # loss 3.48442

Why a few digits hold: a float64 result differs between machines in its last few bits, and
a model initialised in float32 (then made float64) starts from weights that other kernels
round 1 float32 ulp apart: its losses moved by 2e-9 of themselves under
``ATEN_CPU_CAPABILITY=default`` (lessons 10 and 25, measured), changing their 9th and 10th
digits, and once the 7th (lesson 12's ``5.997945``). Their first 6 digits change only for a
value that close to a rounding edge, about one in 10^3 to 10^4; none of the course's is.
The test that keeps the outputs this way is tests/course/test_notebook_outputs.py.
"""

from __future__ import annotations

import math

MOST_DIGITS = 6  # past this, digits moved with the CPU's kernels (see above)


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
    ``digits(3.484424086482772)`` is ``"3.48442"``. At most 6: past that, the digits
    are the kernels and the summation order of the machine that ran it."""
    if not 1 <= significant <= MOST_DIGITS:
        raise ValueError(f"significant digits must be 1 to {MOST_DIGITS}, got {significant!r}")
    return f"{float(value):#.{significant}g}"
