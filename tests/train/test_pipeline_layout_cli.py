"""`python -m minitp.train --pipeline-layout`: an uneven layout equal to one process through
--check, and a layout that cannot run refused in one line (exit 2) before any process starts
(`minitp.train.layout_flags`)."""

import json
import re
import sys

import pytest
from helpers import run_cli

import minitp as mt
from minitp import train

TINY = ["--n-layer", "3", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "4", "--microbatches", "2", "--eval-every", "2", "--eval-batches", "1",
        "--sample-tokens", "4", "--dtype", "float64", "--no-progress"]


def test_an_uneven_layout_matches_one_process_through_check(tmp_path):
    """3 layers over pp 2, the second stage holding one layer and the head."""
    done = run_cli(*TINY, "--dp", "1", "--pp", "2", "--tp", "1", "--pipeline-layout", "Et*2|tL",
                   "--steps", "2", "--check", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["max_loss_diff"] < 1e-10
    args = json.loads((tmp_path / "run" / "metrics.json").read_text())["args"]
    assert args["pipeline_layout"] == "Et*2|tL"  # the run records the layout it ran


@pytest.mark.parametrize("flags, message", [
    (["--pp", "2", "--pipeline-layout", "Et*2|L"], "places 2 layers, but the model has 3"),
    (["--pp", "2", "--pipeline-layout", "Et|t|tL"], "has 3 stages, but pp\\*virtual_stages"),
    (["--pp", "2", "--pipeline-layout", "Et(t|tL"], "cannot read '\\('"),
    (["--pp", "1", "--tp", "2", "--impl", "torch", "--pipeline-layout", "Et*3L"],
     "--pipeline-layout needs --impl minitp"),
])
def test_a_layout_that_cannot_run_is_one_line_before_any_process(flags, message, capsys,
                                                                  monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started: the layout was not refused")

    monkeypatch.setattr(sys.modules["minitp.runtime.launch"], "launch", no_launch)
    with pytest.raises(SystemExit) as exit_:
        train.main([*TINY, "--dp", "1", "--tp", "1", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_auto_runs_the_balancers_choice(monkeypatch):
    """--pipeline-layout auto: `mt.calc.pipeline_layout`'s layout, in args before any rank
    starts (7 layers over pp 3, the CLI's byte vocabulary: the head lighter than a layer)."""
    parser = train.build_parser()
    args = parser.parse_args([*TINY, "--n-layer", "7", "--dp", "1", "--pp", "3", "--tp", "1",
                              "--microbatches", "3", "--batch-size", "3",
                              "--pipeline-layout", "auto"])
    cfg = train.validate(args, parser)[0]
    assert args.pipeline_layout == mt.calc.pipeline_layout(cfg, 3).layout == "Ett|t*3|ttL"
