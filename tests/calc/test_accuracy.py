"""docs/calc-accuracy.md: mt.calc beside published runs, regenerated in-process."""

from __future__ import annotations

from minitp.calc.accuracy import report, rows


def test_the_committed_table_is_the_generated_one():
    # a change to the model or the rows must come with `python -m minitp.calc.accuracy`
    assert report.OUT.read_text(encoding="utf-8") == report.markdown(), (
        "docs/calc-accuracy.md is stale: run python -m minitp.calc.accuracy and commit it")


def test_the_identity_reproduces_every_expressible_printed_tflops():
    # tokens/s × Megatron's FLOPs per token (causal attention halved) = the printed model
    # TFLOP/s, to the table's rounding; full attention would not (the check bites).
    checked = 0
    for row in rows.MEGATRON_BRIDGE:
        tflops = report.identity_tflops(row)
        if tflops is not None:
            assert abs(tflops - row.tflops) <= report.identity_bound(row), row
            checked += 1
    assert checked == 15
    llama_8b = rows.MEGATRON_BRIDGE[0]
    full = llama_8b.tokens_per_gpu * report.model_flops(
        report.config(llama_8b), 1) / llama_8b.seq / 1e12
    assert full - llama_8b.tflops > 50 * report.identity_bound(llama_8b)


def test_a_row_the_model_cannot_express_says_why_and_gets_no_prediction():
    fp8_405b = next(r for r in rows.MEGATRON_BRIDGE if r.system == "h100"
                    and r.model == "LLAMA3.1_405B")
    why = report.unmodelled(fp8_405b)
    assert any("FP8-CS" in w for w in why) and any("126 layers" in w for w in why)
    moe = next(r for r in rows.MEGATRON_BRIDGE if r.model == "DeepSeekV3")
    assert report.identity_tflops(moe) is None
    assert report.step_and_mfu(moe)["step_pred"] is None
