"""The fixture that fails a test which leaves a process behind (helpers in
tests/processes.py, which tests import by name: two conftest.py files, this one and
notebooks/conftest.py, cannot both be imported as `conftest`)."""

from __future__ import annotations

import pytest
from processes import describe, wait_until_gone, worker_processes
from ranks_marker import mark_ranks, processes_refused


def pytest_collection_modifyitems(config, items):
    mark_ranks(items)  # `-m "not ranks"`: the quick loop (tests/ranks_marker.py)


# A test without the `ranks` marker may start no process, in any phase (fixtures included)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with processes_refused(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with processes_refused(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with processes_refused(item):
        yield


@pytest.fixture
def no_leftover_processes():
    """Fail the test if it leaves any process of its own running (helpers excepted)."""
    before = worker_processes()
    yield
    left = wait_until_gone(worker_processes() - before)
    assert not left, "processes left behind by this test:\n" + describe(left)
