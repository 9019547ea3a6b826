"""Out of minitp and into it: checkpoints saved at tp 2 (one sharded, one dense) exported to
transformers and loaded there, transformers' random models imported, logits equal in
float64 both ways; the mapping's mistakes shown to fail; torch.distributed.checkpoint
reading the sharded checkpoint bit for bit. Nothing is downloaded: every transformers
model is built from a config."""

import json
import os
import shutil
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers must never reach the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import minitp as mt  # noqa: E402
from minitp import checkpoint, data  # noqa: E402
from minitp.checkpoint.manifest import SEAL, digest  # noqa: E402
from minitp.checkpoint.sharded import Saver  # noqa: E402
from minitp.export import hf_config, mapping  # noqa: E402
from minitp.export.__main__ import main as export_cli  # noqa: E402

SIZES = dict(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)
GPT2 = mt.GPTConfig(**SIZES)
LLAMA = mt.GPTConfig.llama(**SIZES, n_kv_head=2, rope_theta=500.0)
TOKENS = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
EXACT = 1e-12


def _hf():
    """transformers, imported here: a module-level name would travel with this module to
    the ranks (by value), and each rank would import it (~3 s)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def _perturbed(model, seed):
    """Every weight moved by N(0, 0.2²): pre-activations of order 1 (where erf and tanh
    GELU part), norms' weights off 1 and biases off 0 (a mapping that swaps them shows)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    return model


def _save_both(directory):
    """At tp 2, one Adam step each: the Llama-style model saved sharded (`Saver`), the
    GPT-2-style one dense (`checkpoint.save`). Returns the dense states saved."""
    mesh = mt.Mesh(tp=2)
    states = {}
    for name, cfg in (("llama", LLAMA), ("gpt2", GPT2)):
        torch.manual_seed(0)
        model = mt.parallelize(_perturbed(mt.GPT(cfg).double(), 2), mesh)
        opt = mt.make_optimizer(model, mesh, lambda p: torch.optim.Adam(p, lr=1e-3))
        tokens = torch.randint(0, 64, (400,), generator=torch.Generator().manual_seed(3))
        mt.train_step(model, data.get_batch(tokens, 0, 4, 16), mesh, opt)
        if name == "llama":
            saver = Saver(model, opt, mesh, os.path.join(directory, name), {})
            saver.save(1)
            saver.close()
        else:
            checkpoint.save(model, os.path.join(directory, name), 1, opt)
        states[name] = {k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()}
    return states


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    return d, mt.launch(_save_both, 2, str(d), backend="gloo", timeout=120)[0]


def _minitp_logits(cfg, state):
    model = mt.GPT(cfg).double()
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(TOKENS)[0]


def _float64_llama(hf):
    """HF's Llama computes in float32 whatever the model's dtype: RoPE's angles
    (modeling_llama.LlamaRotaryEmbedding.forward: ``.float()``), RMSNorm
    (LlamaRMSNorm.forward: ``.to(torch.float32)``) and the eager softmax; minitp in the
    model's. The same formulas in float64 here (and SDPA's attention, float64 throughout),
    so that what is compared to 1e-12 is the mapping: the stock model is ~1e-7 away."""
    rot, head = hf.model.rotary_emb, hf.config.head_dim

    def rope(x, position_ids):
        inv = 1.0 / rot.config.rope_parameters["rope_theta"] ** (
            torch.arange(0, head, 2, dtype=torch.float64) / head)
        angles = position_ids.double()[..., None] * inv
        emb = torch.cat([angles, angles], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = rope
    for m in hf.modules():
        if isinstance(m, _hf().models.llama.modeling_llama.LlamaRMSNorm):
            m.forward = lambda x, m=m: m.weight * (
                x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
    assert hf.config._attn_implementation == "sdpa"
    return hf


def _hf_logits(hf):
    with torch.no_grad():
        return hf.eval()(TOKENS).logits


def _load_hf(directory):
    return _hf().AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64,
                                                             attn_implementation="sdpa")


@pytest.mark.ranks  # (the `saved` fixture launches 2 ranks)
def test_llama_saved_sharded_at_tp2_exports_to_transformers_exactly(saved, tmp_path):
    """The sharded tp-2 checkpoint's run directory -> HF: LlamaForCausalLM's logits are
    minitp's to 1e-12 (HF's float32 steps made float64: `_float64_llama`; as shipped, ~1e-7
    away); k and v, or gate and up, swapped fail by far more."""
    directory, states = saved
    export_cli(["--load", str(directory / "llama"), "--to", "hf", str(tmp_path / "hf")])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rms_norm_eps"] == 1e-5
    expected = _minitp_logits(LLAMA, states["llama"])
    hf = _load_hf(tmp_path / "hf")
    assert 1e-12 < (_hf_logits(hf) - expected).abs().max() < 1e-5  # HF's float32 steps
    hf = _float64_llama(hf)
    assert (_hf_logits(hf) - expected).abs().max() <= EXACT
    good = mapping.llama_to_hf(LLAMA, states["llama"])
    for wrong in ("self_attn.k_proj", "mlp.gate_proj"):  # k and v, gate and up, swapped
        other = wrong.replace("k_proj", "v_proj").replace("gate", "up")
        swapped = {k.replace(wrong, "§").replace(other, wrong).replace("§", other): v
                   for k, v in good.items()}
        hf.load_state_dict(swapped, strict=False)
        assert (_hf_logits(hf) - expected).abs().max() > 1e-4, wrong


@pytest.mark.ranks  # (the `saved` fixture launches 2 ranks)
def test_gpt2_saved_dense_at_tp2_exports_to_transformers_exactly(saved, tmp_path):
    """The dense tp-2 checkpoint -> HF GPT2LMHeadModel, logits to 1e-12; its activation
    recorded as "gelu" (minitp's erf GELU). GPT-2's tanh form in its place differs by more
    than 1e-4 (measured here), as does c_attn left in minitp's (head, q/k/v) order."""
    directory, states = saved
    done = export_cli(["--load", str(directory / "gpt2"), "--to", "hf", str(tmp_path / "hf")])
    assert done["kind"] == "gpt2" and done["dtype"] == "float64"
    expected = _minitp_logits(GPT2, states["gpt2"])
    hf = _load_hf(tmp_path / "hf")
    assert hf.config.activation_function == "gelu"
    assert (_hf_logits(hf) - expected).abs().max() <= EXACT
    tanh = mt.GPTConfig(**SIZES, activation="gelu_tanh")
    gelu_gap = (_minitp_logits(tanh, states["gpt2"]) - expected).abs().max()
    print(f"erf vs tanh GELU, max |logit difference| (measured): {gelu_gap:.2e}")
    assert gelu_gap > 1e-4
    unmapped = dict(mapping.gpt2_to_hf(GPT2, states["gpt2"]))
    for i in range(GPT2.n_layer):
        unmapped[f"transformer.h.{i}.attn.c_attn.weight"] = states["gpt2"][
            f"blocks.{i}.attn.qkv.weight"].T.contiguous()
    hf.load_state_dict(unmapped, strict=False)
    assert (_hf_logits(hf) - expected).abs().max() > 1e-4


def _random_hf(kind):
    transformers = _hf()
    torch.manual_seed(5)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                         n_head=4, activation_function="gelu_new")
        return _perturbed(transformers.GPT2LMHeadModel(config).double(), 6)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=16,
                                      rms_norm_eps=1e-5, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    return _float64_llama(_perturbed(transformers.LlamaForCausalLM(config).double(), 6))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_transformers_model_imports_exactly(kind, tmp_path):
    """A random HF model (GPT-2 with its tanh GELU; Llama with grouped K/V) saved by
    save_pretrained -> `--from hf` -> minitp's logits equal HF's to 1e-12; the checkpoint
    records the activation and loads at tp 2 too (`mt.checkpoint.load`'s dense path)."""
    hf = _random_hf(kind)
    hf.save_pretrained(tmp_path / "hf")
    export_cli(["--from", "hf", str(tmp_path / "hf"), str(tmp_path / "mt")])
    model, meta, _ = checkpoint.load_dense(str(tmp_path / "mt"))
    assert meta["config"]["activation"] == ("gelu_tanh" if kind == "gpt2" else "gelu")
    with torch.no_grad():
        assert (model.eval()(TOKENS)[0] - _hf_logits(hf)).abs().max() <= EXACT


def test_refusals_are_one_line(tmp_path):
    """Missing directories, models transformers' GPT-2 and Llama classes cannot express,
    HF configs minitp cannot run: each a ValueError of one line naming what is wrong."""
    bad = [lambda: export_cli(["--from", "hf", str(tmp_path / "none"), str(tmp_path / "o")])]
    for cfg in (mt.GPTConfig(**SIZES, n_experts=4), mt.GPTConfig.mla(**SIZES),
                mt.GPTConfig.vlm(**{**SIZES, "vocab_size": 256}),
                mt.GPTConfig(**SIZES, norm="rmsnorm")):
        bad.append(lambda cfg=cfg: hf_config.check_exportable(cfg))
    for hf in ({"model_type": "mixtral"}, {"model_type": "deepseek_v3"},
               {"model_type": "llama", "rms_norm_eps": 1e-6},
               {"model_type": "gpt2", "activation_function": "relu"}):
        bad.append(lambda hf=hf: hf_config.from_hf_config(hf))
    for call in bad:
        with pytest.raises((ValueError, SystemExit)) as caught:
            call()
        assert caught.type is SystemExit or "\n" not in str(caught.value), caught.value
    with pytest.raises(ValueError, match="mixture of experts"):
        hf_config.check_exportable(mt.GPTConfig(**SIZES, n_experts=4))
    with pytest.raises(ValueError, match="dense GELU MLP only"):
        mt.GPTConfig.llama(**SIZES, activation="gelu_tanh")


@pytest.mark.ranks  # (the `saved` fixture launches 2 ranks)
def test_dcp_reads_the_sharded_checkpoint_bit_for_bit(saved):
    """torch.distributed.checkpoint.load through `mt.checkpoint.DCPReader`, one process: a
    plain GPT's state dict and Adam's first moments filled with exactly the saved values."""
    directory, states = saved
    step = checkpoint.resolve(str(directory / "llama"))
    sd = {k: torch.zeros_like(v) for k, v in states["llama"].items()}
    sd["exp_avg/wte.weight"] = torch.zeros(64, 32, dtype=torch.float64)
    reader = mt.checkpoint.DCPReader(step)
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # (DCP's note that it loads in one process, no group)
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(sd, storage_reader=reader, no_dist=True)
    assert all(torch.equal(sd[k], v) for k, v in states["llama"].items())
    _, _, optim = checkpoint.load_dense(step)
    assert torch.equal(sd["exp_avg/wte.weight"], optim["exp_avg"]["wte.weight"])
    with pytest.raises(ValueError, match="not a sharded minitp checkpoint"):
        mt.checkpoint.DCPReader(directory / "gpt2")


@pytest.mark.ranks  # (the `saved` fixture launches 2 ranks)
def test_checkpoints_without_the_activation_field_still_load(saved, tmp_path):
    """A manifest and a meta.json written before `GPTConfig.activation` existed (the field
    removed, the manifest sealed again) load as the exact GELU they were."""
    directory = tmp_path / "copy"
    shutil.copytree(saved[0], directory)  # (the module's fixture stays as saved)
    step = checkpoint.resolve(str(directory / "llama"))
    manifest = json.loads(open(os.path.join(step, "manifest.json")).read())
    assert manifest["config"].pop("activation") == "gelu"
    text = json.dumps(manifest, indent=1).encode()
    open(os.path.join(step, "manifest.json"), "wb").write(text)
    open(os.path.join(step, SEAL), "w").write(digest(text))
    assert checkpoint.load_dense(step)[0].cfg.activation == "gelu"
    meta_path = directory / "gpt2" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["activation"]
    meta_path.write_text(json.dumps(meta))
    assert checkpoint.load_dense(str(directory / "gpt2"))[0].cfg.activation == "gelu"


def test_the_default_mlp_is_still_the_exact_gelu_bit_for_bit():
    """`GPTConfig.activation` left at "gelu": the MLP computes what it computed before the
    field existed (F.gelu's erf), bit for bit; "gelu_tanh" is torch's tanh form."""
    from minitp.model import MLP

    x = torch.randn(2, 5, 32, dtype=torch.float64)
    for activation, approximate in (("gelu", None), ("gelu_tanh", "tanh")):
        torch.manual_seed(0)
        mlp = MLP(mt.GPTConfig(**SIZES, activation=activation)).double()
        h = mlp.fc(x)
        act = torch.nn.functional.gelu(h) if approximate is None else \
            torch.nn.functional.gelu(h, approximate=approximate)
        assert torch.equal(mlp(x), mlp.proj(act)), activation
