"""minitp.rules: torch-free, and a parallel configuration checked once per launch."""

import subprocess
import sys

import pytest
import torch
from helpers import ROOT, random_batches

import minitp as mt

CFG = dict(vocab_size=16, seq_len=8, n_layer=2, n_head=2, d_model=8)


def test_the_rules_import_without_torch():
    """The calculator and the parent's checks read the rules before any process starts, on
    a machine where torch may not even load: the package needs none of it."""
    code = (
        "import sys, types\n"
        "sys.modules['torch'] = None  # importing torch now fails\n"
        f"package = types.ModuleType('minitp'); package.__path__ = [{str(ROOT / 'minitp')!r}]\n"
        "sys.modules['minitp'] = package  # the rules alone, not the facade that loads torch\n"
        "import minitp.rules as rules\n"
        "rules.check_parallel_config(types.SimpleNamespace(n_head=4, d_model=8, seq_len=8,\n"
        "    n_layer=2, dropout=0.0, n_experts=0, vision_patches=0), tp=2, pp=2, world_size=4)\n"
        "print(len(rules.__all__))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 40


def _count_checks(validated: bool):
    """On a rank: how often the whole configuration and a step's arguments are checked
    over `parallelize` and three training steps."""
    parallelize_module = sys.modules["minitp.parallelize"]  # (mt.parallelize is the function)
    step_module = sys.modules["minitp.step.train"]

    counts = {"config": 0, "step": 0}
    check_config, check_step = parallelize_module.check_parallel_config, step_module.check_step

    def counted_config(*args, **kwargs):
        counts["config"] += 1
        return check_config(*args, **kwargs)

    def counted_step(*args, **kwargs):
        counts["step"] += 1
        return check_step(*args, **kwargs)

    parallelize_module.check_parallel_config = counted_config
    step_module.check_step = counted_step
    mesh = mt.Mesh(dp=1, pp=2, tp=1)
    cfg = mt.GPTConfig(**CFG)
    torch.manual_seed(0)
    model = mt.parallelize(mt.GPT(cfg), mesh, validated=validated)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in random_batches(3, cfg, 4):
        mt.train_step(model, (x, y), mesh, optimizer, microbatches=2)
    return counts


def test_a_rank_checks_its_configuration_once_and_a_step_once():
    """Given the parent's word (validated=True, as the CLI's ranks are), a rank checks
    nothing of the split; without it, once. The step's own arguments (schedule,
    microbatches, batch rows) are checked the first time, not at every step."""
    trusted = mt.launch(_count_checks, 2, True, timeout=120)
    alone = mt.launch(_count_checks, 2, False, timeout=120)
    assert list(trusted) == [{"config": 0, "step": 1}] * 2
    assert list(alone) == [{"config": 1, "step": 1}] * 2


def test_a_loss_chunk_holds_no_more_logits_than_the_hidden_states():
    from minitp.rules import loss_chunk_rows
    # GPT-2 small's batch, 8 × 1024 tokens, 50,304 logits a token against d_model 768:
    # 66 chunks of 125 rows, each 125 × 50,304 ≤ 8192 × 768 values
    rows = loss_chunk_rows(8192, 50304, 768)
    assert rows == 125 and rows * 50304 <= 8192 * 768
    assert loss_chunk_rows(100, 64, 128) == 100  # a vocabulary narrower than the model
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        loss_chunk_rows(100, 64, 0)
