"""The graders of ex00 (the mesh, lesson 00) and ex16 (a TP step predicted, lesson 16)
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


def test_ex16_grader_spots_a_factor_and_a_shortcut(tmp_path):
    wrong = tmp_path / "ex16_wrong.py"
    wrong.write_text(
        "from minitp import calc\n"
        "def tp_step_seconds(cfg, t, batch, cluster, efficiency):\n"
        "    st = calc.step_time(cfg, cluster, tp=t, micro_batch=batch, efficiency=efficiency)\n"
        "    return st.compute, st.tp / 2\n"
    )
    report = mt.grade("ex16", path=wrong)
    compute, communication, pieces = report.checks
    assert compute.passed
    assert not communication.passed and "factor of 0.5" in communication.hint
    assert not pieces.passed and "calc.step_time" in pieces.detail



# ex01's docstring no longer spells the chunk indices: the grader's diagnosis must teach them.
RS_STEP = "        send, receive = (r - step) % n, (r - step - 1) % n\n"
AG_OVERWRITE = "        chunks[receive] = buffer\n"


def _ex01(tmp_path, *edits):
    from test_exercises import _variant

    from minitp.course.graders import ex01

    report = mt.grade("ex01", path=_variant(tmp_path, "ex01", *edits))
    assert not report.passed and ex01.WORLD_SIZES == (2, 3, 4)
    return report.checks[2]  # n = 3: the first size where a ring has a middle


def test_ex01_names_a_chunk_that_missed_a_ranks_part(tmp_path):
    # One reduce-scatter step short: the chunks go round unfinished.
    equal = _ex01(tmp_path, ("    for step in range(n - 1):  # reduce-scatter",
                             "    for step in range(n - 2):  # reduce-scatter"))
    assert not equal.passed and "input of shape (12,)" in equal.detail, equal
    assert "'s parts only (rank" in equal.detail and "missing" in equal.detail, equal
    assert "travel once around the ring" in equal.hint


def test_ex01_names_neighbours_that_disagree_on_the_chunk(tmp_path):
    # Adding what arrives into the chunk just sent: the neighbour sent another chunk, and
    # at n = 3 with 7 elements the two differ in size (gloo refuses the message).
    equal = _ex01(tmp_path, (RS_STEP, "        send, receive = (r - step) % n, (r - step) % n\n"))
    assert not equal.passed and "neighbours disagreed on which chunk" in equal.detail, equal
    assert "axis.prev" in equal.hint


def test_ex01_names_a_chunk_added_twice_in_the_all_gather(tmp_path):
    equal = _ex01(tmp_path, (AG_OVERWRITE, "        chunks[receive] += buffer\n"))
    assert not equal.passed and "twice" in equal.detail, equal


def test_ex01_names_a_chunk_holding_another_chunks_sum(tmp_path):
    # The finished chunks put back in the wrong order.
    equal = _ex01(tmp_path, ("    return torch.cat(chunks).view_as(x)",
                             "    return torch.cat(chunks[1:] + chunks[:1]).view_as(x)"))
    assert not equal.passed and "finished sum, not its own" in equal.detail, equal
