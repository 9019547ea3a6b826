"""The graders of ex00 (the mesh, lesson 00) and ex09 (a TP step predicted, lesson 09)
say what is wrong, not only that something is: solution-passes and blank-fails are
tests/course/test_exercises.py's, for every exercise."""

import minitp as mt


def test_ex00_grader_names_the_rank_whose_coordinates_are_wrong(tmp_path):
    wrong = tmp_path / "ex00_wrong.py"
    wrong.write_text(  # dp index fastest: the classic slip
        "def coordinates(rank, dp, pp, tp):\n"
        "    stage, inside = divmod(rank, dp * tp)\n"
        "    tp_index, dp_index = divmod(inside, dp)\n"
        "    return dp_index, stage, tp_index\n"
        "def group_ranks(rank, axis, dp, pp, tp):\n"
        "    return [rank]\n"
    )
    report = mt.grade("ex00", path=wrong)
    assert not report.passed
    first, groups = report.checks[0], report.checks[1]
    assert not first.passed and first.rank is not None and "the mesh says" in first.detail
    assert not groups.passed and "group" in groups.detail


def test_ex09_grader_spots_a_factor_and_a_shortcut(tmp_path):
    wrong = tmp_path / "ex09_wrong.py"
    wrong.write_text(
        "from minitp import calc\n"
        "def tp_step_seconds(cfg, t, batch, cluster, efficiency):\n"
        "    st = calc.step_time(cfg, cluster, tp=t, micro_batch=batch, efficiency=efficiency)\n"
        "    return st.compute, st.tp / 2\n"
    )
    report = mt.grade("ex09", path=wrong)
    compute, communication, pieces = report.checks
    assert compute.passed
    assert not communication.passed and "factor of 0.5" in communication.hint
    assert not pieces.passed and "calc.step_time" in pieces.detail

