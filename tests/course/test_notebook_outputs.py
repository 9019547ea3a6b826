"""Every committed output prints what every machine prints alike (docs/testing.md).

nbval compares each committed output with a new run, digit for digit, on whatever CPU
runs it. A float64 result's last digits are its summation order (the CPU's vector width,
the BLAS, the threads), so an output that prints them fails on the next machine even
though every assertion holds: lessons 10, 14, 23 and 25 did, on an AMD EPYC with
AVX-512. This reads the notebooks' JSON (no kernel, no process) and refuses, in any
output's text:

* a float printed past 6 significant digits (``3.484424086482772``, ``5.997945``): a model
  initialised in float32 moves its float64 losses by some 1e-9 of themselves between CPU
  kernels, which changed the 7th, 9th and 10th digits under ``ATEN_CPU_CAPABILITY=default``;
* a nonzero number below 1e-12 printed as digits (``4.2e-17``): a rounding error, which a
  lesson prints as the bound it is under (``< 1e-12``, ``mt.alike.below``);
* a zero printed as a measured error, ``0.0e+00``: exact on this machine, some 1e-16 on
  another; a lesson prints ``equal: True`` or a bound.

A bound (``< 1e-14``, ``below 1e-14``) is a claim the cell asserts, so it may be small.
A plain ``0.0`` is not refused: a zero in a table is usually exact by construction.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minitp.course import alike

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TEXT_TYPES = ("text/plain", "text/html", "text/markdown", "text/latex")
SIGNIFICANT = alike.MOST_DIGITS  # the rule, written once
SMALLEST = 1e-12

# A decimal or exponent number standing alone: not part of a name, a version (2.13.0),
# an address (127.0.0.1), a unit glued to it (0.5em) or a paper's arXiv number (2407.21783).
FLOAT = re.compile(r"(?<![\w.])(?<!arXiv )(?<!arXiv:)[-+]?"
                   r"(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)(?![\w.])")
BOUND_BEFORE = re.compile(r"(?:<|<=|≤|below|under|within)\s*$")
ZERO_AS_ERROR = re.compile(r"^[-+]?0(?:\.0*)?[eE]")


def significant_digits(number: str) -> int:
    mantissa = re.split(r"[eE]", number)[0].lstrip("+-").replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def offences(text: str) -> list[str]:
    """Each number in `text` that another machine may print otherwise, with its line."""
    found = []
    for match in FLOAT.finditer(text):
        number, value = match.group(0), float(match.group(0))
        line_start = text.rfind("\n", 0, match.start()) + 1
        before = text[line_start:match.start()]
        if significant_digits(number) > SIGNIFICANT:
            why = f"{significant_digits(number)} significant digits"
        elif 0 < abs(value) < SMALLEST and not BOUND_BEFORE.search(before):
            why = f"a difference below {SMALLEST:g} printed as digits"
        elif ZERO_AS_ERROR.match(number):
            why = "a measured error printed as zero"
        else:
            continue
        line_end = text.find("\n", match.end())
        line = text[line_start:None if line_end < 0 else line_end].strip()
        found.append(f"{number!r} ({why}) in {line[:160]!r}")
    return found


def output_texts(output: dict) -> list[str]:
    texts = [output["text"]] if "text" in output else []
    texts += [output["data"][kind] for kind in TEXT_TYPES if kind in output.get("data", {})]
    return ["".join(t) if isinstance(t, list) else t for t in texts]


def notebook_offences(path: Path) -> list[str]:
    found = []
    code_cells = 0
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        for output in cell.get("outputs", []):
            for text in output_texts(output):
                found += [f"{path.name} cell {index} (nbval's Cell {code_cells}): {o}"
                          for o in offences(text)]
        code_cells += 1
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_output_prints_what_any_machine_prints(path):
    found = notebook_offences(path)
    assert not found, ("outputs another CPU prints otherwise (print a bound, a boolean or "
                       "mt.alike.digits; docs/testing.md):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "step 1   3.484424086482772",           # a loss to its last digit
    "losses 3.821196189060",                # 13 significant digits
    "restarting 5.505339873",               # 10: moved with the CPU's kernels
    "its sum of squares 5.997945",          # 7: so did this one
    "ring   4.4e-16   4.2e-17",             # rounding errors as digits
    "parameters 1.3e-13",
    "off one device's by 0.0e+00",          # a zero that is exact only here
])
def test_the_scan_refuses_digits_a_machine_chooses(text):
    assert offences(text)


@pytest.mark.parametrize("text", [
    "largest difference: < 1e-14",          # a bound the cell asserts
    "differences below 1e-12",
    "loss 3.48442, scale 0.0, ratio 0.123456",     # 6 significant digits at most
    "torch 2.13.0 at 127.0.0.1, 0.5em, 1,261,576 bytes, arXiv 2407.21783, arXiv:2209.05433",
    "loss 5.1e-03, parameters 5.7e-02",     # a trap's drift: far above rounding
])
def test_the_scan_lets_through_what_holds_everywhere(text):
    assert offences(text) == []


def test_below_prints_the_bound_and_refuses_one_that_does_not_hold():
    assert alike.below(4.2e-17, 1e-12) == "< 1e-12"
    for error in (1e-12, 2e-12, float("nan")):
        with pytest.raises(ValueError, match="not below"):
            alike.below(error, 1e-12)


def test_digits_rounds_to_what_the_scan_lets_through():
    assert alike.digits(3.484424086482772) == "3.48442"
    assert offences(alike.digits(3.484424086482772, alike.MOST_DIGITS)) == []
    with pytest.raises(ValueError, match="1 to 6"):
        alike.digits(1.0, 7)
