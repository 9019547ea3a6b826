"""The grader of ex20 (model-state GB and training days, lesson 20) names the usual slips:
every wrong answer here is the reference solution with one slip (or two) built in, and each
diagnosis the grader can give has a test. That the solution passes every check and the
untouched exercise fails every one is tests/course/test_exercises.py's.

The checks, in order: 0 the GB, 1 the days, 2 no shortcut taken. All in this process."""

import pytest
from test_exercises import _variant

import minitp as mt
from minitp import calc
from minitp.calc.footprint import memory

LAYOUT = "weights, master, momentum, variance = 2, 4, 4, 4"
GRADIENTS = '4 if optimizer == "megatron" else 2'
STATES = "n_params * (weights + master + momentum + variance + gradients) / 1e9"
RULE = "(8 if recompute else 6)"
ACHIEVED = "n_gpus * efficiency * peak_flops"
DAYS = "return flops / achieved / 86400"

STATE_SLIPS = {  # the slip built in -> words the hint must contain
    "no fp32 master": ((LAYOUT, "weights, master, momentum, variance = 2, 0, 4, 4"),
                       "Adam's master copy"),
    "16-bit gradients under megatron": ((GRADIENTS, "2"), "16 bits under 'megatron'"),
    "fp32 gradients under adam-mixed": ((GRADIENTS, "4"), "fp32 under 'adam-mixed'"),
    "no gradients": ((GRADIENTS, "0"), "the gradients are missing"),
    "weights only": ((STATES, "n_params * weights / 1e9"), "16-bit weights alone"),
    "GiB": ((STATES, STATES.replace("1e9", "2**30")), "that is GiB"),
    "bytes": ((STATES, STATES.replace(" / 1e9", "")), "that is bytes"),
}
DAY_SLIPS = {
    "6ND while recomputing": ((RULE, "6"), "6·N·D where the run recomputes"),
    "8ND without recomputing": ((RULE, "8"), "8·N·D where the run does not recompute"),
    "forward only": ((RULE, "2"), "counts the forward only"),
    "peak": ((ACHIEVED, "n_gpus * peak_flops"), "multiply it by the efficiency"),
    "efficiency divides": ((ACHIEVED, "n_gpus * peak_flops / efficiency"),
                           "the efficiency divides the peak"),
    "one GPU": ((ACHIEVED, "efficiency * peak_flops"), "divide by their number"),
    "seconds": ((DAYS, "return flops / achieved"), "that is seconds"),
    "hours": ((DAYS, "return flops / achieved / 3600"), "that is hours"),
}


def _grade(tmp_path, *edits):
    return mt.grade("ex20", path=_variant(tmp_path, "ex20", *edits))


@pytest.mark.parametrize("slip", sorted(STATE_SLIPS))
def test_each_slip_in_the_bytes_is_named(tmp_path, slip):
    edit, words = STATE_SLIPS[slip]
    report = _grade(tmp_path, edit)
    states, days, shortcut = report.checks
    assert not states.passed and days.passed and shortcut.passed, str(report)
    assert "expected" in states.detail and states.tensor == "GB" and states.max_error > 0
    assert "this slip" in states.hint and words in states.hint, states.hint


@pytest.mark.parametrize("slip", sorted(DAY_SLIPS))
def test_each_slip_in_the_days_is_named(tmp_path, slip):
    edit, words = DAY_SLIPS[slip]
    report = _grade(tmp_path, edit)
    states, days, shortcut = report.checks
    assert states.passed and not days.passed and shortcut.passed, str(report)
    assert "expected" in days.detail and days.tensor == "days" and days.max_error > 0
    assert "this slip" in days.hint and words in days.hint, days.hint


def test_two_slips_of_different_kinds_are_both_named(tmp_path):
    report = _grade(tmp_path, DAY_SLIPS["6ND while recomputing"][0], DAY_SLIPS["peak"][0],
                    STATE_SLIPS["no fp32 master"][0], STATE_SLIPS["GiB"][0])
    states, days, _ = report.checks
    assert "these two slips" in states.hint and "master copy" in states.hint, str(report)
    assert "GiB" in states.hint
    assert "these two slips" in days.hint and "6·N·D" in days.hint, str(report)
    assert "efficiency" in days.hint


def test_a_slip_not_on_the_list_gets_the_recipe(tmp_path):
    report = _grade(tmp_path, (DAYS, "return flops / achieved / 86000"))
    days = report.checks[1]
    assert not days.passed and "slip" not in days.hint, str(report)
    assert "n × efficiency × peak" in days.hint
    assert days.detail.startswith("174.6B parameters, 300B tokens, 1024 GPUs at 45% of 312")


def test_one_function_written_is_graded_while_the_other_is_blank(tmp_path):
    report = _grade(tmp_path, (DAYS, "raise NotImplementedError('later')"))
    states, days, shortcut = report.checks
    assert states.passed and shortcut.passed, str(report)
    assert not days.passed and days.detail == "training_days is not written yet"
    assert days.hint == "later"


def test_an_answer_that_is_not_a_number_is_told_so(tmp_path):
    report = _grade(tmp_path, (DAYS, "return None"))
    days = report.checks[1]
    assert not days.passed and days.detail.endswith("returned None"), str(report)
    assert "in days" in days.hint


@pytest.mark.parametrize("shortcut, named", [
    ("from minitp.calc import training_seconds\n"
     "def training_days(tokens, n_params, n_gpus, peak_flops, efficiency, recompute):\n"
     "    rule = 1 if recompute else 6 / 8\n"
     "    return training_seconds(tokens, n_params, n_gpus, efficiency * peak_flops) * rule "
     "/ 86400\n", "calc.training_seconds"),
    ("import minitp as mt\n"
     "def model_states_gb(n_params, optimizer):\n"
     "    return mt.calc.model_state_bytes(n_params, optimizer=optimizer)['total'] / 1e9\n",
     "calc.model_state_bytes"),
    ("from minitp import calc\n"
     "def model_states_gb(n_params, optimizer):\n"
     "    return n_params * sum(calc.OPTIMIZERS[optimizer]) / 1e9\n", "calc.OPTIMIZERS"),
    ("from minitp.calc import OPTIMIZERS\n"
     "ROWS = dict(OPTIMIZERS)\n"
     "def model_states_gb(n_params, optimizer):\n"
     "    return n_params * sum(ROWS[optimizer]) / 1e9\n", "calc.OPTIMIZERS"),
])
def test_the_calculators_answer_is_refused_however_it_was_reached(tmp_path, shortcut, named):
    source = _variant(tmp_path, "ex20").read_text()
    header = shortcut.index("def ")
    function = shortcut[header + 4:shortcut.index("(", header)]
    start = source.index(f"def {function}(")
    end = source.find("\ndef ", start + 1)
    path = tmp_path / "ex20_shortcut.py"
    path.write_text(source[:start] + shortcut + (source[end:] if end > 0 else ""))
    report = mt.grade("ex20", path=path)
    assert [c.passed for c in report.checks] == [True, True, False], str(report)
    assert named in report.checks[2].detail
    # and the calculator is itself again afterwards: the grader put everything back
    assert type(memory.OPTIMIZERS["megatron"]) is tuple
    assert calc.training_seconds.__name__ == "training_seconds"
    assert memory.model_state_bytes.__name__ == "model_state_bytes"
