"""bench/refit.py prints its two tables and writes its record (a quick run, in this
process, on its day: helpers.BENCH_QUICK_RUNS rotates the benches' quick runs; no timing
is asserted), and imports (every run). The bytes are asserted: they do not depend on the
machine."""

import json
import re

import cloudpickle
from helpers import BENCH_QUICK_RUNS, ROOT, import_bench, on_its_day

import minitp as mt
from minitp.checkpoint.layout import Space


def test_the_bench_imports_with_its_pairs():
    refit = import_bench("refit")
    assert len(refit.PAIRS) == 3 and set(refit.PRESETS) == {"cpu", "quick"}
    assert callable(refit.main) and len(refit.WAYS) == 3


@on_its_day("refit", BENCH_QUICK_RUNS)
def test_the_tables_are_printed_and_the_bytes_add_up(capsys, tmp_path, monkeypatch):
    refit = import_bench("refit")
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its record imports gpu_figures
    cloudpickle.register_pickle_by_value(refit)  # the ranks cannot import it by name
    refit.main(["refit.py", "--quick", "--out", str(tmp_path / "refit.json")])
    out = capsys.readouterr().out
    times = re.findall(r"^\| (.+?) \|(?: [\d.]+ ms \|){6} [\d.]+× \| [\d.]+× \|$", out,
                       re.MULTILINE)
    assert times == list(refit.PAIRS)[-1:], out  # the quick preset: the MoE alone
    moved = re.findall(r"^\| (.+?) \| [\d,]+ \| [\d,]+ \| [\d.]+ \| (1\.00) \|", out,
                       re.MULTILINE)
    assert [name for name, _ in moved] == times, out  # no byte moved twice
    rec = json.loads((tmp_path / "refit.json").read_text())
    assert list(rec["pairs"]) == times
    for name, pair in rec["pairs"].items():
        moe = {"n_experts": rec["experts"], "top_k": 2} if "MoE" in name else {}
        cfg = mt.GPTConfig(**{**rec["config"], **moe})
        space = Space.of(cfg)  # float32: 4 bytes an element
        b, ckpt = pair["refit_bytes"], pair["checkpoint_bytes"]
        assert b["received"] == b["planned"] > 0 and b["received"] < b["minimum"], name
        # each weight written once; each rank reads what it serves, the refit's minimum
        weights, library = ckpt["checkpoint, weights only"], ckpt[refit.WAYS[2]]
        assert weights["written"] == 4 * space.n_model, name
        assert weights["read"] == b["minimum"], name
        assert library["written"] == 4 * space.size, name  # with Adam's two moments
