"""The explorer (lesson 17): its numbers are minitp.calc's, its errors say what is wrong,
and its widget, driven in code, gives the same result as calling `explore`."""

from __future__ import annotations

import base64
import dataclasses
import itertools

import pytest

import minitp as mt
import minitp.calc as calc
from minitp.course.labs.explorer import (
    CONTROLS,
    DEFAULTS,
    GPUS,
    MODELS,
    SUMMARY_WIDTH,
    Exploration,
    explore,
    explorer_widget,
    figure,
)

GiB = 2**30
GPT3 = MODELS["gpt3-175b"][1]


def test_gpt3_preset_is_the_papers_shape():
    assert (GPT3.n_layer, GPT3.d_model, GPT3.n_head, GPT3.seq_len, GPT3.vocab_size) == (
        96, 12288, 96, 2048, 51200)
    assert round(calc.param_count(GPT3) / 1e9, 1) == 174.6
    for _, cfg in MODELS.values():
        mt.check_parallel_config(cfg, tp=8)  # every preset splits 8 ways


@pytest.mark.parametrize("kw", [
    dict(n_gpus=1024, pp=16, tp=8, sp=True, microbatches=192),
    dict(n_gpus=1024, dp=16, pp=8, tp=8, sp=True, recompute="selective", global_batch=1536),
    dict(n_gpus=512, pp=8, tp=8, recompute="full", micro_batch=2, microbatches=16, virtual=2),
    dict(n_gpus=64, pp=8, tp=8, sp=True, recompute="selective", microbatches=64,
         optimizer="adam-mixed", zero_stage=1, efficiency=0.4),
])
def test_numbers_are_calcs(kw):
    e = explore("gpt3-175b", gpu="a100-80gb", **kw)
    dp = kw.get("dp", kw["n_gpus"] // (kw["pp"] * kw["tp"]))
    b, v = kw.get("micro_batch", 1), kw.get("virtual", 1)
    m = kw.get("microbatches") or kw["global_batch"] // (dp * b)
    B = dp * b * m
    sp, rc = kw.get("sp", False), kw.get("recompute")
    assert (e.dp, e.microbatches, e.global_batch) == (dp, m, B)
    assert e.memory == calc.memory_per_gpu(GPT3, b, dp, kw["pp"], kw["tp"], sp, rc,
                                           kw.get("zero_stage", 0),
                                           kw.get("optimizer", "megatron"), v, m)
    assert e.time == calc.step_time(GPT3, calc.A100_80GB, dp, kw["pp"], kw["tp"], b, B, sp, rc,
                                    v, kw.get("efficiency", 0.5))
    assert e.comm == calc.comm_bytes(GPT3, b, dp, kw["pp"], kw["tp"], sp, rc,
                                     zero_stage=kw.get("zero_stage", 0))
    assert e.params == calc.param_count(GPT3)
    assert e.params_per_gpu == calc.params_per_rank(GPT3, kw["tp"], kw["pp"])
    assert e.bubble == calc.bubble(kw["pp"], m, v)
    assert e.mfu == calc.mfu(calc.model_flops(GPT3, B), e.time.total, kw["n_gpus"],
                             calc.A100_80GB.peak_flops)
    assert e.fits == (e.memory["total"] <= 0.9 * 80 * GiB)


def test_the_planners_best_explored_again():
    # explore() with the sizes plan() chose gives plan()'s own memory and time
    result = calc.plan(GPT3, calc.A100_80GB, global_batch=1536, n_gpus=1024)
    for c in result.candidates[:5]:
        e = explore("gpt3-175b", 1024, "a100-80gb", c.dp, c.pp, c.tp, c.sp, c.recompute,
                    micro_batch=c.micro_batch, global_batch=1536, virtual=c.virtual)
        assert e.microbatches == c.microbatches
        assert e.memory == c.memory and e.time == c.time and e.fits


def test_fits_is_usable_share_of_memory():
    e = explore("gpt3-175b", 1024, pp=16, tp=8, sp=True, microbatches=192)
    assert e.fits and e.limit == 0.9 * 80 * GiB
    # the same run on a GPU with 56 GiB: 50.4 usable, 56.6 needed
    small = explore("gpt3-175b", 1024, pp=16, tp=8, sp=True, microbatches=192, gpu_memory=56)
    assert small.cluster.memory == 56 * GiB and small.memory == e.memory
    assert not small.fits and "DOES NOT FIT" in small.summary()
    assert explore("gpt3-175b", 1024, pp=16, tp=8, sp=True, microbatches=192,
                   usable=1.0, gpu_memory=57).fits
    assert not explore("gpt3-175b", 8, tp=8).fits  # 175B on one node: model states alone


def test_defaults_and_derived_sizes():
    e = explore("gpt-1.7b", tp=2, pp=2)  # n_gpus = dp·pp·tp with dp = 1
    assert (e.n_gpus, e.dp, e.microbatches, e.global_batch) == (4, 1, 1, 1)
    assert explore("gpt-1.7b", 32, tp=2, pp=2).dp == 8
    assert explore("gpt-1.7b", 32, tp=2, pp=2, micro_batch=4, microbatches=3).global_batch == 96
    cfg = mt.GPTConfig(vocab_size=100, seq_len=32, n_layer=4, n_head=4, d_model=64)
    own = explore(cfg, 4, calc.H100_80GB, tp=4)
    assert own.cfg is cfg and own.cluster is calc.H100_80GB
    assert own.memory == calc.memory_per_gpu(cfg, 1, tp=4, optimizer="megatron")


def test_summary_reads_well():
    e = explore("gpt3-175b", 1024, pp=16, tp=8, sp=True, microbatches=192)
    text = str(e)
    assert text == repr(e) == e.summary()
    for part in ("GPT-3 175B: 174.6B parameters", "l=96 layers, h=12288, a=96 heads",
                 "on 1024 GPUs: DGX A100, 8x A100 80GB", "dp=8 x pp=16 x tp=8",
                 "global batch 1536 = dp 8 x 192 microbatches x micro-batch 1",
                 f"{e.memory['total'] / GiB:.1f} GiB of 72.0 usable: fits",
                 f"activations {e.memory['activations'] / GiB:.1f} GiB",
                 f"step time: {e.time.total:.3f} s", f"MFU {100 * e.mfu:.1f}%",
                 f"compute {e.time.compute:.3f} + tp {e.time.tp:.3f}",
                 f"bubble (p-1)/(v*m) = {15 / 192:.3f}",
                 "tp groups of 8 span 8 GPUs: inside a node",
                 "dp groups of 8 span 64 GPUs: across nodes"):
        assert part in text, part
    across = explore("gpt3-175b", 1024, pp=8, tp=16, sp=True, microbatches=8)
    assert "tp groups of 16 span 16 GPUs: across nodes" in str(across)
    assert "v=2 chunks per stage" in str(explore("gpt3-175b", 512, pp=8, tp=8, virtual=2,
                                                 microbatches=16))


def test_summary_lines_are_short():
    """The widget shows the summary in JupyterLab's 13-px monospace, ~7.8 px a character;
    at SUMMARY_WIDTH characters no line wraps down to a 1024-px window (the browser test
    measures that). Every catalogued model and GPU, small and huge runs, odd settings."""
    longest = ""
    for (model, gpu), (n, pp, tp), extra in itertools.product(
            itertools.product(MODELS, GPUS), [(8, 1, 8), (1024, 16, 8), (4096, 16, 16)],
            [dict(sp=True, microbatches=1024, micro_batch=16),
             dict(recompute="selective", virtual=2, microbatches=64, gpu_memory=192)]):
        try:
            e = explore(model, n, gpu, pp=pp, tp=tp, **extra)
        except ValueError:  # e.g. 96 layers on 16 stages of 2 chunks
            continue
        longest = max([longest, *str(e).splitlines()], key=len)
    assert 60 <= len(longest) <= SUMMARY_WIDTH, longest


@pytest.mark.parametrize("kw, message", [
    (dict(n_gpus=1024, dp=8, pp=8, tp=8), r"dp\*pp\*tp = 8\*8\*8 = 512, but n_gpus=1024"),
    (dict(n_gpus=1000, pp=8, tp=8), r"n_gpus=1000 is not divisible by pp\*tp = 8\*8 = 64"),
    (dict(n_gpus=1024, pp=8, tp=64), "n_head=96 is not divisible by tp=64"),
    (dict(n_gpus=1024, pp=64, tp=8), r"n_layer=96 is not divisible by pp\*virtual_stages=64"),
    (dict(n_gpus=1024, pp=8, tp=8, microbatches=4, global_batch=1536),
     "global_batch=1536 with dp=16 and micro_batch=1 is 96 microbatches, not microbatches=4"),
    (dict(n_gpus=1024, pp=8, tp=8, global_batch=100), "global_batch=100 is not divisible"),
    (dict(n_gpus=1024, pp=8, tp=8, microbatches=12, virtual=2), "interleaved schedule"),
    (dict(n_gpus=1024, pp=8, tp=8, recompute="some"), "recompute must be"),
    (dict(n_gpus=1024, pp=8, tp=0), "tp must be a positive integer"),
    (dict(n_gpus=1024, pp=8, tp=8, microbatches=0), "microbatches must be a positive integer"),
    (dict(n_gpus=1024, pp=8, tp=8, optimizer="sgd"), "optimizer must be one of"),
    (dict(n_gpus=1024, pp=8, tp=8, gpu="tpu"), "gpu must be a calc.Cluster or one of"),
    (dict(n_gpus=1024, pp=8, tp=8, gpu_memory=-1), "gpu_memory is in GiB"),
    (dict(n_gpus=1024, pp=8, tp=8, efficiency=2), "efficiency and usable are fractions"),
])
def test_bad_configurations_say_what_is_wrong(kw, message):
    with pytest.raises(ValueError, match=message):
        explore("gpt3-175b", **kw)


def test_unknown_model():
    with pytest.raises(ValueError, match="model must be a GPTConfig or one of .*gpt3-175b"):
        explore("gpt-4", 8)


def test_figure_draws_the_numbers():
    e = explore("gpt3-175b", 1024, pp=16, tp=8, sp=True, microbatches=192)
    fig = figure(e)
    ax_mem, ax_time = fig.axes
    for kind in ("parameters", "gradients", "optimizer", "activations"):
        (bar,) = [p for p in ax_mem.patches if p.get_gid() == f"memory-{e.name}-{kind}"]
        assert bar.get_height() == pytest.approx(e.memory[kind] / GiB)
    for part, seconds in dataclasses.asdict(e.time).items():
        (bar,) = [p for p in ax_time.patches if p.get_gid() == f"time-{e.name}-{part}"]
        assert bar.get_height() == pytest.approx(seconds)
    lines = {line.get_gid(): line.get_ydata()[0] for line in ax_mem.lines}
    assert lines == {"line-GPU memory": pytest.approx(80), "line-usable": pytest.approx(72)}
    several = figure({"a": e, "b": explore("gpt3-175b", 1024, pp=8, tp=8, sp=True,
                                           recompute="selective", microbatches=96)})
    assert [t.get_text() for t in several.axes[0].get_xticklabels()] == ["a", "b"]
    with pytest.raises(ValueError, match="at least one"):
        figure({})


# --------------------------------------------------------------------------- the widget
def _child(w, name):
    return w.controls[name]


def test_widget_starts_at_the_defaults():
    w = explorer_widget()
    controls, output, image = w.children
    assert list(controls.children) == [w.controls[k] for k in CONTROLS] and output is w.output
    assert w.values() == DEFAULTS
    assert isinstance(w.result, Exploration) and w.error is None
    assert w.result.memory == explore(**DEFAULTS).memory
    assert w.result.time == explore(**DEFAULTS).time
    (text,) = w.output.outputs
    assert text["text"] == w.result.summary() + "\n"
    assert image is w.image and image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.layout.display is None and w.figure.get_size_inches()[0] == 8
    w.controls["tp"].value = 64  # invalid (96 heads): the error, and no figure
    assert w.figure is None and w.image.layout.display == "none" and w.image.value == b""
    assert "Not a valid run" in w.output.outputs[0]["text"]


def test_widget_driven_in_code():
    w = explorer_widget(draw=False)
    _child(w, "tp").value = 16
    assert w.result.tp == 16 and w.result.dp == 4  # dp follows: 1024 / (16·16)
    _child(w, "pp").value = 8
    _child(w, "recompute").value = "selective"
    _child(w, "microbatches").value = 12
    expected = explore("gpt3-175b", 1024, "a100-80gb", None, 8, 16, True, "selective",
                       microbatches=12, gpu_memory=80)
    assert w.result.memory == expected.memory and w.result.time == expected.time
    # the same global batch (96) with tp inside a node: TP time falls more than 5-fold
    inside = explore("gpt3-175b", 1024, pp=8, tp=8, sp=True, recompute="selective",
                     global_batch=96)
    assert w.result.global_batch == 96 and w.result.time.tp > 5 * inside.time.tp
    _child(w, "dp").value = 16  # 16·8·16 = 2048 GPUs, but 1024 chosen
    assert w.result is None and "but n_gpus=1024" in w.error
    assert "Not a valid run: dp*pp*tp" in w.output.outputs[0]["text"]
    _child(w, "n_gpus").value = 2048
    assert w.result.n_gpus == 2048 and w.error is None


def test_widget_gpu_brings_its_memory():
    w = explorer_widget(draw=False)
    _child(w, "gpu").value = "v100-32gb"
    assert _child(w, "gpu_memory").value == 32
    assert w.result.cluster == GPUS["v100-32gb"] and not w.result.fits
    _child(w, "gpu_memory").value = 64
    assert w.result.cluster.memory == 64 * GiB
    assert explorer_widget(draw=False, gpu="h100-80gb").result.cluster == GPUS["h100-80gb"]


def test_widget_set_updates_once():
    w = explorer_widget(draw=False)
    seen = []
    w.output.observe(lambda change: seen.append(change), names="outputs")
    w.set(model="gpt-22b", n_gpus=8, pp=1, tp=8, microbatches=4, micro_batch=1)
    assert len(seen) == 1
    assert w.result.name == "GPT 22B" and w.result.global_batch == 4
    with pytest.raises(ValueError, match="no control named colour"):
        w.set(colour="red")


def test_widget_layout_wraps_the_controls_above_a_full_width_output():
    """No CSS-grid placement (JupyterLab ignored the output's grid_column and squeezed
    it into one 236-px column): a wrapping row of fixed-width controls, then the summary
    and the figure, each as wide as the notebook (the figure scaled, keeping its shape)."""
    import ipywidgets as widgets

    w = explorer_widget(draw=False)
    controls, output, image = w.children
    assert isinstance(w, widgets.VBox) and not isinstance(controls, widgets.GridBox)
    assert controls.layout.flex_flow == "row wrap" and controls.layout.width == "100%"
    assert output.layout.width == "100%" and output.layout.grid_column is None
    assert (image.layout.width, image.layout.height) == ("100%", "auto")
    assert {c.layout.width for c in controls.children} == {"230px"}


def test_dropdowns_show_labels_and_start_at_the_defaults():
    w = explorer_widget(draw=False)
    dp, recompute = w.controls["dp"], w.controls["recompute"]
    assert dp.label == "auto: GPUs/(pp·tp)" and recompute.label == "none"  # not blank
    labels = [label for label, _ in dp.options]  # what the dropdown shows
    assert labels[0] == "auto: GPUs/(pp·tp)" and "16" in labels and "(" not in labels[1]
    dp.value = 16
    assert w.result is None and "but n_gpus=1024" in w.error
    dp.value = "auto"  # what choosing the "auto" entry sets
    assert w.error is None and w.result.dp == 8 and w.values()["dp"] is None
    recompute.value = "selective"
    assert w.result.recompute == "selective"
    w.set(recompute=None, dp=None)
    assert recompute.label == "none" and dp.label.startswith("auto")


def test_displayed_widget_carries_a_static_picture():
    w = explorer_widget()
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert bundle["text/plain"] == "Explorer: " + w.result.summary()
    w.controls["tp"].value = 64  # invalid: 96 heads
    bundle = w._repr_mimebundle_()
    assert "image/png" not in bundle and "n_head=96 is not divisible" in bundle["text/plain"]
