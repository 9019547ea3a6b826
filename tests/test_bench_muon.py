"""bench/muon_step.py prints its two tables (a quick run, in this process, on its day:
helpers.BENCH_QUICK_RUNS rotates the benches' quick runs; no timing is asserted), and
imports (every run)."""

import re

import cloudpickle
from helpers import BENCH_QUICK_RUNS, import_bench, on_its_day


def test_the_bench_imports_with_its_rows():
    muon_step = import_bench("muon_step")
    assert len(muon_step.ROWS) >= 2 and callable(muon_step.main)


@on_its_day("muon_step", BENCH_QUICK_RUNS)
def test_the_tables_are_printed(capsys):
    muon_step = import_bench("muon_step")
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
