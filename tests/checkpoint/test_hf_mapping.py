"""Issue 29: families (config.json both ways, refusals) and the Megatron <-> HF tensor transforms."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lingjun_slurm.injob.checkpoint.hf import HFUnsupported
from lingjun_slurm.injob.checkpoint.hf import families

from . import hf_models as hm

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


# ---- families ---------------------------------------------------------------------------------------------------

def test_family_of_both_families():
    assert families.family_of(hm.llama_settings()) == "llama"
    assert families.family_of(hm.gpt2_settings()) == "gpt2"
    assert families.family_of(hm.llama_settings(untie_embeddings=False, bias_linear=True)) == "llama"


@pytest.mark.parametrize("over, words", [
    ({"activation": "gelu"}, ["normalization=RMSNorm", "activation=gelu", "position_embedding=rope"]),
    ({"normalization": "LayerNorm"}, ["normalization=LayerNorm", "activation=swiglu"]),
    ({"rotary_percent": 0.5}, ["rotary_percent=0.5"]),
    ({"qk_layernorm": True}, ["qk_layernorm"]),
])
def test_llama_refusals_name_the_setting(over, words):
    with pytest.raises(HFUnsupported) as exc:
        families.family_of(hm.llama_settings(**over))
    for w in words:
        assert w in str(exc.value)


def test_gpt2_refuses_gqa_and_no_bias():
    with pytest.raises(HFUnsupported, match="num_query_groups=2"):
        families.family_of(hm.gpt2_settings(num_query_groups=2))
    with pytest.raises(HFUnsupported, match="bias_linear=False"):
        families.family_of(hm.gpt2_settings(bias_linear=False))


def test_hf_config_llama_numbers():
    cfg = families.hf_config(hm.llama_settings(rotary_base=500000), 100, "bf16")
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 16 and cfg["hidden_act"] == "silu"
    assert cfg["rms_norm_eps"] == 1e-5  # the trainer's layernorm_epsilon (train/model.py)
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 500000.0}
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False
    assert cfg["vocab_size"] == 100 and cfg["dtype"] == "bfloat16"
    scaled = families.hf_config(hm.llama_settings(rope_scaling=True, rope_scaling_factor=32.0), 100, "fp32")
    assert scaled["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 32.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}


def test_hf_config_gpt2_exact_gelu():
    cfg = families.hf_config(hm.gpt2_settings(), 100, "fp32")
    assert cfg["activation_function"] == "gelu"  # exact erf GELU, not GPT-2's default gelu_new
    assert cfg["layer_norm_epsilon"] == 1e-5 and cfg["tie_word_embeddings"] is True
    assert cfg["n_inner"] == 256 and cfg["n_positions"] == 64


def test_transformers_reads_our_config():
    from transformers import AutoConfig

    for settings in (hm.llama_settings(rope_scaling=True), hm.gpt2_settings()):
        cfg = families.hf_config(settings, 100, "fp32")
        back = AutoConfig.for_model(**cfg).to_dict()
        assert families.model_from_hf_config(back)["num_layers"] == 2
        if cfg["model_type"] == "llama":
            assert back["rope_parameters"]["rope_type"] == "llama3"


@pytest.mark.parametrize("settings", [hm.llama_settings(), hm.gpt2_settings(),
                                      hm.llama_settings(rope_scaling=True, rope_scaling_factor=16.0)])
def test_config_round_trip_and_no_mismatch(settings):
    cfg = families.hf_config(settings, 100, "fp32")
    back = families.model_from_hf_config(cfg)
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
              "normalization", "activation", "position_embedding", "untie_embeddings", "bias_linear"):
        assert back[k] == settings[k], k
    assert families.shape_mismatches(settings, cfg) == []


def test_shape_mismatches_names_fields():
    cfg = families.hf_config(hm.llama_settings(), 100, "fp32")
    bad = families.shape_mismatches(hm.llama_settings(num_query_groups=4, rotary_base=500000), cfg)
    assert ("num_query_groups", 4, 2) in bad and ("rotary_base", 500000, 10000) in bad
    cfg["rms_norm_eps"] = 1e-6
    assert ("norm_epsilon", 1e-5, 1e-6) in families.shape_mismatches(hm.llama_settings(), cfg)


def test_model_from_hf_config_refusals():
    g = families.hf_config(hm.gpt2_settings(), 100, "fp32")
    with pytest.raises(HFUnsupported, match="gelu_new"):
        families.model_from_hf_config({**g, "activation_function": "gelu_new"})
    with pytest.raises(HFUnsupported, match="model_type='mistral'"):
        families.model_from_hf_config({**g, "model_type": "mistral"})
    ll = families.hf_config(hm.llama_settings(), 100, "fp32")
    with pytest.raises(HFUnsupported, match="rope_type 'yarn'"):
        families.model_from_hf_config({**ll, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}})


def test_families_and_mapping_import_no_torch():
    code = ("import sys; import lingjun_slurm.injob.checkpoint.hf.families, lingjun_slurm.injob.checkpoint.hf.mapping,"
            " lingjun_slurm.injob.checkpoint.hf.proof; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# ---- mapping ----------------------------------------------------------------------------------------------------

def _round_trip(fac):
    from lingjun_slurm.injob.checkpoint.hf import mapping

    model, s = fac()
    fam = families.family_of(s)
    sd = model.state_dict()
    meg = dict(mapping.to_megatron(fam, s, lambda n: sd[n], 128))
    back = {}
    for k, t in meg.items():
        for n, x in mapping.to_hf(fam, s, k, t, 100):
            assert n not in back
            back[n] = x
    return s, sd, meg, back


@pytest.mark.parametrize("fac", [hm.llama_model, hm.gpt2_model], ids=["llama", "gpt2"])
def test_hf_megatron_hf_identical(fac):
    s, sd, meg, back = _round_trip(fac)
    expect = {k: v for k, v in sd.items() if not (k == "lm_head.weight" and not s["untie_embeddings"])}
    assert set(back) == set(expect)
    for k in expect:
        assert torch.equal(back[k], expect[k]), k
    # vocabulary padded to 128 by repeating the last row (Megatron-LM saver_base.py), dropped on the way back
    emb = meg["embedding.word_embeddings.weight"]
    assert emb.shape[0] == 128 and torch.equal(emb[100:], emb[99:100].expand(28, -1))


def test_llama_megatron_layout():
    """Interleaved per query group [q0 q1 k v | q2 q3 k v] and fc1 = [gate; up]."""
    s, sd, meg, _ = _round_trip(hm.llama_model)
    qkv = meg["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (sd[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    d = 16
    assert torch.equal(qkv[0:2 * d], q[0:2 * d]) and torch.equal(qkv[2 * d:3 * d], k[0:d])
    assert torch.equal(qkv[3 * d:4 * d], v[0:d]) and torch.equal(qkv[4 * d:6 * d], q[2 * d:4 * d])
    assert torch.equal(qkv[6 * d:7 * d], k[d:2 * d])
    fc1 = meg["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:128], sd["model.layers.1.mlp.gate_proj.weight"])
    assert "output_layer.weight" in meg and "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in meg


def test_gpt2_tied_has_no_output_layer():
    _, _, meg, _ = _round_trip(hm.gpt2_model)
    assert "output_layer.weight" not in meg
    assert meg["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (192, 64)


def test_stacked_keys_give_the_same_tensors():
    from lingjun_slurm.injob.checkpoint.hf import mapping

    s, sd, meg, back = _round_trip(hm.llama_model)
    rest = "self_attention.linear_qkv.weight"
    stacked = torch.stack([meg[f"decoder.layers.{i}.{rest}"] for i in range(2)])
    out = dict(mapping.to_hf("llama", s, "decoder.layers." + rest, stacked, 100))
    assert set(out) == {f"model.layers.{i}.self_attn.{n}_proj.weight" for i in range(2) for n in "qkv"}
    for n, t in out.items():
        assert torch.equal(t, sd[n])
    assert mapping.to_hf("llama", s, "decoder.layers.mlp.linear_fc1._extra_state/shard_0_2", None, 100) == []
    with pytest.raises(HFUnsupported, match="q_layernorm"):
        mapping.to_hf("llama", s, "decoder.layers.0.self_attention.q_layernorm.weight", stacked[0], 100)


def test_mlp_against_megatron_core():
    """megatron-core's own MLP module (gated, local spec) with mapped weights vs transformers' LlamaMLP."""
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, s = hm.llama_model()
    _, _, meg, _ = _round_trip(hm.llama_model)
    x = torch.randn(8, 2, 64, generator=torch.Generator().manual_seed(3))  # [s, b, h]
    with proof.megatron_process("cpu"):
        gpt = proof.build_gpt_model(s, 128)
        proof.load_megatron_weights(gpt, proof.TensorSource(s, meg))
        with torch.no_grad():
            out, bias = gpt.decoder.layers[1].mlp(x)
    assert bias is None
    with torch.no_grad():
        ref = model.model.layers[1].mlp(x)
    assert float((out - ref).abs().max()) <= 1e-6


def test_to_megatron_reads_names_without_the_base_prefix():
    from lingjun_slurm.injob.checkpoint.hf import mapping

    model, s = hm.gpt2_model()
    sd = {k.removeprefix("transformer."): v for k, v in model.state_dict().items()}
    meg = dict(mapping.to_megatron("gpt2", s, lambda n: sd[n], 128))
    assert torch.equal(meg["embedding.position_embeddings.weight"], sd["wpe.weight"])
    del sd["h.1.ln_2.bias"]
    with pytest.raises(HFUnsupported, match="transformer.h.1.ln_2.bias"):
        dict(mapping.to_megatron("gpt2", s, lambda n: sd[n], 128))
