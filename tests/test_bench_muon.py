"""bench/muon_step.py prints its two tables (a quick run, in this process; no timing is
asserted)."""

import re
import sys
from pathlib import Path

import cloudpickle

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_tables_are_printed(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import muon_step
    finally:
        sys.path.remove(str(BENCH))
    cloudpickle.register_pickle_by_value(muon_step)  # the ranks cannot import it by name
    muon_step.main(["--quick"])
    out = capsys.readouterr().out
    one = re.findall(r"^\| (.+?) \| [\d.]+ ms \| [\d.]+ \| [\d.]+ ms \| [\d.]+ \|$", out,
                     re.MULTILINE)
    assert one == list(muon_step.ROWS), out
    assert "minitp / torch, like for like (Newton–Schulz in bf16): " in out, out
    ranks = re.findall(r"^\| (dp \d(?: × tp 2)?) \| (AdamW|Muon, \w+) \|(?: [\d.]+ ms \|){2}",
                       out, re.MULTILINE)
    assert [name for _, name in ranks] == ["AdamW", "Muon, gather", "Muon, owner", "AdamW",
                                           "Muon, gather", "Muon, tp"], out
