"""Issue 29: the logits proof (megatron-core GPTModel vs transformers, same batch) on the tiny models."""

from __future__ import annotations

import pytest

from . import hf_models as hm

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")


def _source(fac, tensor_name_swap=None, **over):
    from lingjun_slurm.injob.checkpoint.hf import families, mapping, proof

    model, s = fac(**over)
    sd = model.state_dict()

    def get(n):
        return sd[tensor_name_swap(n) if tensor_name_swap else n]

    meg = dict(mapping.to_megatron(families.family_of(s), s, get, 128))
    return model, proof.TensorSource(s, meg)


@pytest.mark.parametrize("fac", [hm.llama_model, hm.gpt2_model], ids=["llama", "gpt2"])
def test_proof_passes_on_the_tiny_models(fac, tmp_path):
    import torch.distributed as dist

    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(fac)
    hm.save(model, tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert r.ok and r.max_abs_diff <= 1e-4 and r.tolerance == pytest.approx(1e-4)
    assert len(r.per_layer) == 2 and max(r.per_layer) <= 1e-5  # each layer on the same input agrees
    text = "\n".join(r.lines())
    assert "max |logit difference| = " in text and "OK" in text and "per layer" in text
    assert not dist.is_initialized()  # the 1-rank group was undone


def _swap_kv(n):
    if ".k_proj." in n:
        return n.replace(".k_proj.", ".v_proj.")
    if ".v_proj." in n:
        return n.replace(".v_proj.", ".k_proj.")
    return n


def test_swapped_k_v_fails_the_proof(tmp_path):
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.llama_model, _swap_kv)
    hm.save(model, tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert not r.ok and r.max_abs_diff > 1e-2
    assert r.per_layer[0] > 1e-2  # shows up in the first layer
    assert "MISMATCH" in r.lines()[0] and any(x.startswith("first layer over the tolerance: 0 (") for x in r.lines())


def test_a_shift_the_final_norm_cancels_still_fails_the_proof(tmp_path):
    """A constant added to the last layer's fc2 bias moves every hidden unit alike: GPT-2's final
    LayerNorm subtracts the mean, so the logits stay equal, but the layer's output does not, and the
    conversion is wrong: the verdict holds every layer to the tolerance, not only the logits."""
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.gpt2_model)
    key = "decoder.layers.1.mlp.linear_fc2.bias"
    src._t[key] = src._t[key] + 0.5
    hm.save(model, tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert r.max_abs_diff <= r.tolerance, r.lines()  # the logits alone would pass
    assert not r.ok and r.per_layer[1] > 0.1, r.lines()
    assert any(x.startswith("first layer over the tolerance: 1 (") for x in r.lines()), r.lines()


def test_gpt2_untransposed_conv1d_fails_the_proof(tmp_path):
    """c_proj is square: a mapping that forgets Conv1D's [in, out] transpose still loads, and must fail."""
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.gpt2_model)
    key = "decoder.layers.1.self_attention.linear_proj.weight"
    src._t[key] = src._t[key].t().contiguous()
    hm.save(model, tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert not r.ok and r.per_layer[0] <= 1e-5 and r.per_layer[1] > 1e-3


def test_bf16_export_is_proven_with_rounded_weights(tmp_path):
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.llama_model)
    hm.save(model.to(torch.bfloat16), tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert r.weights_dtype == "bfloat16" and r.ok and r.max_abs_diff <= 1e-4


# The model make_checkpoints.py saves (TransformerConfig defaults: LayerNorm, F.gelu, eps 1e-5, biases;
# GPTModel defaults: learned_absolute, untied; vocab 128, max_sequence_length 64).
MAKE_CHECKPOINTS_MODEL = hm.gpt2_settings(hidden_size=32, ffn_hidden_size=128, num_query_groups=4,
                                          untie_embeddings=True, vocab_size=128)


def test_real_torch_dist_checkpoint_stacked_keys(megatron_checkpoints, tmp_path):
    """A real torch_dist checkpoint (stacked decoder.layers.* keys, [L, ...]) -> HF dir that
    AutoModelForCausalLM loads strictly, and the proof passes on it."""
    import json

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoConfig, AutoModelForCausalLM

    from lingjun_slurm.injob.checkpoint.hf import families, mapping, proof

    dcp_to_torch_save(str(megatron_checkpoints / "iter_0000030"), str(tmp_path / "flat.pt"))
    flat = torch.load(tmp_path / "flat.pt", weights_only=False)
    tensors = {k: v for k, v in flat.items() if torch.is_tensor(v)}
    assert tensors["decoder.layers.self_attention.linear_qkv.weight"].shape == (2, 96, 32)
    s = MAKE_CHECKPOINTS_MODEL
    hf_sd = {}
    for k, t in tensors.items():
        for n, x in mapping.to_hf("gpt2", s, k, t, 120):  # pretend the real vocabulary was 120
            hf_sd[n] = x
    cfg = families.hf_config(s, 120, "fp32")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(out)))
    missing, unexpected = hf.load_state_dict(hf_sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} - set(hf_sd)
    hf.save_pretrained(str(out))
    r = proof.compare_logits(str(out), proof.TensorSource(s, tensors), hm.batch(vocab=120))
    assert r.ok and r.max_abs_diff <= 1e-4, r.lines()


def test_layer_by_layer_streams_one_layer_at_a_time(monkeypatch, tmp_path):
    """Each side reads layer j's tensors only when layer j runs (after layer j-1 finished), and the
    streamed run gives the same figures as the whole-model run."""
    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.llama_model)
    stacked = {}
    for k in list(src._t):
        if k.startswith("decoder.layers.0."):
            rest = k[len("decoder.layers.0."):]
            stacked["decoder.layers." + rest] = torch.stack([src._t[f"decoder.layers.{i}.{rest}"] for i in range(2)])
    tensors = {k: v for k, v in src._t.items() if not k.startswith("decoder.layers.")} | stacked
    reads = []

    class Recording(proof.TensorSource):
        def load(self, key, layer=None):
            reads.append(("meg", key, layer))
            return super().load(key, layer)

    real_get = proof.HFFiles.get
    monkeypatch.setattr(proof.HFFiles, "get", lambda self, n: reads.append(("hf", n, None)) or real_get(self, n))
    released = []
    real_release = proof._release
    monkeypatch.setattr(proof, "_release", lambda m: released.append(m) or real_release(m))
    hm.save(model, tmp_path / "hf")
    streamed = proof.compare_logits(str(tmp_path / "hf"), Recording(src.model, tensors), hm.batch())
    assert len(released) == 4  # each side's two layers go back to meta once their output is taken
    assert all(p.device.type == "meta" for m in released for p in m.parameters())
    whole = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch(), layer_by_layer=False)
    assert streamed.ok and streamed.max_abs_diff == whole.max_abs_diff and streamed.per_layer == whole.per_layer
    meg_layers = [layer for side, key, layer in reads if side == "meg" and key.startswith("decoder.layers.")]
    assert meg_layers == sorted(meg_layers) and set(meg_layers) == {0, 1}  # never a whole stacked tensor (None)
    hf_layers = [int(n.split(".")[2]) for side, n, _ in reads if side == "hf" and n.startswith("model.layers.")]
    assert hf_layers == sorted(hf_layers) and set(hf_layers) == {0, 1}


def test_proof_reads_a_real_checkpoint_through_megatron_source(megatron_checkpoints, tmp_path):
    """helper F's MegatronSource (per-layer reads of the stacked torch_dist tensors) feeds the proof."""
    megatron_io = pytest.importorskip("lingjun_slurm.injob.checkpoint.hf.megatron_io")
    from lingjun_slurm.injob.checkpoint.hf import families, mapping, proof

    src = megatron_io.MegatronSource.open(megatron_checkpoints, model=MAKE_CHECKPOINTS_MODEL)
    s = src.model
    hf_sd = {}
    for k in src.keys():
        for n, x in mapping.to_hf("gpt2", s, k, src.load(k), 128):
            hf_sd[n] = x
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(**families.hf_config(s, 128, "fp32")))
    hf.load_state_dict(hf_sd, strict=True)
    hm.save(hf, tmp_path / "hf")
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch(vocab=128))
    assert r.ok and r.max_abs_diff <= 1e-4, r.lines()


@pytest.mark.parametrize("field, value", [("activation_function", "gelu_new"), ("layer_norm_epsilon", 1e-6)])
def test_a_config_with_other_numbers_fails_the_proof(tmp_path, field, value):
    """GPT-2's default tanh GELU, or another norm epsilon, in config.json: same weights, other numbers."""
    import json

    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.gpt2_model)
    hm.save(model, tmp_path / "hf")
    cfg_path = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[field] = value
    cfg_path.write_text(json.dumps(cfg))
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert not r.ok and r.max_abs_diff > 2e-4


def test_old_style_gpt2_files_are_read_like_from_pretrained(tmp_path):
    """Files named without the "transformer." prefix and holding attn.bias mask buffers (the layout of
    the original gpt2 weights), which from_pretrained accepts, are streamed the same way."""
    from safetensors.torch import load_file, save_file

    from lingjun_slurm.injob.checkpoint.hf import proof

    model, src = _source(hm.gpt2_model)
    hm.save(model, tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    sd = load_file(str(f))
    old = {k.removeprefix("transformer."): v for k, v in sd.items()}
    old["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    save_file(old, str(f), metadata={"format": "pt"})
    r = proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
    assert r.ok and r.max_abs_diff <= 1e-4
    old["h.0.attn.surprise"] = torch.zeros(1)
    save_file(old, str(f), metadata={"format": "pt"})
    with pytest.raises(proof.HFUnsupported, match="h.0.attn.surprise"):
        proof.compare_logits(str(tmp_path / "hf"), src, hm.batch())
