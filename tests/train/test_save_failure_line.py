"""A save that fails on a rank (a full disk, a state that is not finite, a directory another
writer took) ends `python -m minitp.train` with that failure's one line, not the rank's
traceback: the rank raises it as `save_flags.SaveFailed`, and the parent reads its line
off the traceback the launcher brings back."""

import errno

import pytest

import minitp as mt
from minitp.train import save_flags


def _disk_full_during_a_save():
    with save_flags.reported():
        raise OSError(errno.ENOSPC, "checkpoint step 5: the disk under 'ckpt' is full")


def test_a_failed_save_on_a_rank_is_one_line_in_the_parent():
    with pytest.raises(mt.LaunchError) as failure:
        mt.launch(_disk_full_during_a_save, 2, timeout=60)
    line = save_flags.failure_line(failure.value)
    assert line is not None and "\n" not in line and line.startswith("rank "), line
    assert line.endswith("checkpoint step 5: the disk under 'ckpt' is full"), line


def test_another_failure_keeps_its_traceback():
    """Only a save's failure is shortened: a bug elsewhere on a rank keeps its traceback."""
    def fails():
        raise KeyError("not a save")
    with pytest.raises(mt.LaunchError) as failure:
        mt.launch(fails, 1, timeout=60)
    assert save_flags.failure_line(failure.value) is None
