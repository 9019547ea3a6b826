"""docs/gpu-node.md's multi-node recipe, run for real on this one machine: two torchrun agents
(``--nnodes 2 --nproc-per-node 2``, c10d rendezvous on 127.0.0.1, node ranks 0 and 1)
train ``-m minitp.train`` at dp 2 × tp 2 to parity with one process; the checkpoint
the two nodes save is loaded by a one-node run; and a node that dies mid-run ends
the job on the surviving node at once, with a message that says a peer was lost.

Nothing of a job may outlive it. torchrun starts each worker in a session of its
own, so a worker is not in its agent's process group and outlives an agent that is
killed; the tests collect every agent's descendants while they run and check that
none is left afterwards (and kill any that is, so that a failure leaves nothing).

Each half is six Python starts with a torch import each (seconds on CI's two cores): a run
of the suite runs one, by rotation (`helpers.rotated`): the two nodes' parity run and its
checkpoint one UTC day, the node that dies the next; MINITP_FULL_MATRIX=1 runs both. The
half not run today says so as a skip.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import free_port, on_its_day, run_cli
from processes import clean_env, descendants, describe, wait_until_gone

TINY = ["--n-layer", "2", "--d-model", "32", "--n-head", "4", "--seq-len", "16",
        "--batch-size", "8", "--microbatches", "2", "--eval-batches", "2",
        "--sample-tokens", "8", "--dtype", "float64", "--no-progress"]


PARITY, DEATH = "two nodes train and save", "a node dies"
HALVES = [PARITY, DEATH]


def _wait_for_listener(port: int, agent: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and agent.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"node 0's agent never listened on {port} (exit code {agent.poll()})")


class TwoNodes:
    """Two torchrun agents on this machine, each a "node" of two ranks."""

    def __init__(self, folder, train_flags, job):
        port = free_port()
        self.logs = [folder / f"node{n}.log" for n in (0, 1)]
        self.seen: set[int] = set()
        self.agents = []
        for node in (0, 1):
            command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                       "--nproc-per-node", "2", "--node-rank", str(node),
                       "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                       "--rdzv-id", job, "-m", "minitp.train", *train_flags]
            with open(self.logs[node], "w") as log:
                self.agents.append(subprocess.Popen(
                    command, cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                    env=clean_env(OMP_NUM_THREADS="1"), start_new_session=True))
            if node == 0:
                # Both agents are on 127.0.0.1, so whichever binds the endpoint first
                # hosts the rendezvous store: node 0, as HOST0 in docs/gpu-node.md's recipe.
                _wait_for_listener(port, self.agents[0])

    def workers(self, node: int) -> set[int]:
        found = descendants(self.agents[node].pid)
        self.seen |= found
        return found

    def wait(self, node: int, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while self.agents[node].poll() is None and time.monotonic() < deadline:
            self.workers(node)
            time.sleep(0.2)
        return self.agents[node].poll()

    def log(self, node: int) -> str:
        return self.logs[node].read_text()

    def kill_node(self, node: int) -> None:
        """As a machine dies: the agent and every process it started, at once."""
        for pid in {self.agents[node].pid} | self.workers(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.agents[node].wait(10)

    def left_behind(self) -> set[int]:
        for node in (0, 1):
            self.workers(node)
        alive = wait_until_gone(self.seen | {a.pid for a in self.agents}, seconds=5,
                                count_zombies=False)
        for pid in alive:  # never leave a job running, even when the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for agent in self.agents:
            if agent.poll() is None:
                agent.wait(10)
        return alive


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two_nodes")
    nodes = TwoNodes(folder, ["--dp", "2", "--pp", "1", "--tp", "2", "--steps", "3", "--check",
                              "--eval-every", "3", "--save", str(folder / "ckpt"),
                              "--out", str(folder / "run"), *TINY], job="parity")
    codes = [nodes.wait(node, 240) for node in (0, 1)]
    left = nodes.left_behind()
    return nodes, codes, left, folder


@on_its_day(PARITY, HALVES)
def test_two_agents_train_to_parity_with_one_process(two_node_run):
    nodes, codes, left, folder = two_node_run
    assert codes == [0, 0], nodes.log(0)[-3000:] + nodes.log(1)[-3000:]
    assert not left, "processes left after the job:\n" + describe(left)
    summary = json.loads(nodes.log(0).strip().splitlines()[-1])  # global rank 0 prints it
    assert summary["steps"] == 3 and summary["max_loss_diff"] < 1e-10
    # a CPU's peak is not measured when every rank would measure the shared cores at once
    assert summary["mfu"] is None and "under torchrun" in summary["peak_source"]
    assert (folder / "run" / "metrics.json").exists()


@on_its_day(PARITY, HALVES)
def test_the_two_nodes_checkpoint_loads_on_one_node(two_node_run):
    _, codes, _, folder = two_node_run
    assert codes == [0, 0]
    # on one node: the plain CLI, in this process (no torchrun, no Python start to pay)
    done = run_cli("--load", str(folder / "ckpt"), "--dp", "1", "--pp", "2", "--tp", "2",
                   "--steps", "5", "--check", "--eval-every", "5",
                   "--out", str(folder / "one_node"), *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 5 and summary["max_loss_diff"] < 1e-10


@on_its_day(DEATH, HALVES)
def test_a_node_that_dies_mid_run_ends_the_job_on_the_other_at_once(tmp_path):
    with_progress = [flag for flag in TINY if flag != "--no-progress"]
    nodes = TwoNodes(tmp_path, ["--dp", "2", "--pp", "1", "--tp", "2", "--steps", "100000",
                                "--eval-every", "100000", "--timeout", "60",
                                "--out", str(tmp_path / "run"), *with_progress], job="dies")
    try:
        # Training is under way once rank 0's progress bar shows a loss (every rank has
        # joined the process group and taken a step together).
        deadline = time.monotonic() + 120
        while "loss=" not in nodes.log(0) and time.monotonic() < deadline:
            nodes.workers(0), nodes.workers(1)
            time.sleep(0.2)
        assert "loss=" in nodes.log(0), nodes.log(0)[-3000:]
        nodes.kill_node(1)
        killed = time.monotonic()
        code = nodes.wait(0, 60)  # well inside the 60 s collective timeout: it is not that
        ended_after = time.monotonic() - killed
    finally:
        left = nodes.left_behind()
    log = nodes.log(0)
    assert code not in (None, 0), f"node 0 still running or fine after node 1 died:\n{log[-3000:]}"
    assert ended_after < 30, ended_after
    assert "lost a peer" in log and "its node died" in log, log[-3000:]
    assert not left, "processes left after the job:\n" + describe(left)
