"""Which Hugging Face model class a run's model is, and config.json in both directions. Pure: no torch.

Two families reproduce megatron-core's GPTModel exactly:

- "llama" (transformers' LlamaForCausalLM): RMSNorm, SwiGLU, RoPE (theta; Llama-3.1 scaling),
  grouped-query attention, tied or untied embeddings, optional biases (attention_bias covers
  q/k/v/o, mlp_bias gate/up/down: the same set megatron's add_bias_linear puts biases on).
- "gpt2" (GPT2LMHeadModel): LayerNorm, exact GELU, learned absolute positions, biases, no GQA.

Sources read (transformers 5.25.0 in the venv; megatron-core 0.16.1 in the venv):
- transformers/models/llama/configuration_llama.py (LlamaConfig fields: rms_norm_eps, hidden_act,
  num_key_value_heads, head_dim = hidden_size // num_attention_heads, attention_bias, mlp_bias,
  tie_word_embeddings, rope_parameters) and modeling_llama.py (LlamaRMSNorm computes in fp32;
  rotate_half RoPE; LlamaMLP down(act(gate(x)) * up(x))).
- transformers/modeling_rope_utils.py: convert_rope_params_to_dict (rope_theta / rope_scaling of
  transformers 4 configs are still read), _compute_llama3_parameters (factor, low_freq_factor,
  high_freq_factor, original_max_position_embeddings).
- transformers/models/gpt2/configuration_gpt2.py (activation_function defaults to "gelu_new", the
  tanh approximation; layer_norm_epsilon; scale_attn_weights; scale_attn_by_inverse_layer_idx)
  and modeling_gpt2.py (Conv1D weights [in, out]; ACT2FN["gelu"] is the exact erf GELU).
- megatron/core/models/common/embeddings/rotary_pos_embedding.py RotaryEmbedding._apply_scaling:
  the Llama-3.1 rule with low_freq_factor=1, high_freq_factor=4, original_max_position_embeddings=8192
  fixed, only the factor settable (GPTModel rope_scaling / rope_scaling_factor, default 8).
- lingjun_slurm/injob/train/model.py transformer_config: layernorm_epsilon=1e-5, F.gelu (exact) or
  F.silu gated for swiglu; Megatron-LM's --norm-epsilon defaults to 1e-5 too
  (megatron/training/arguments.py, NVIDIA/Megatron-LM main d98e8a6).

The model dict uses the spec's ModelSpec names (plan.resolve_model). Optional extra keys that a
Megatron-LM checkpoint's args can carry, with the values the builtin trainer always uses:
norm_epsilon (1e-5), rope_scaling (False), rope_scaling_factor (8.0), rotary_percent (1.0),
rotary_interleaved (False), qk_layernorm (False), num_experts (None), kv_channels (hidden/heads).
"""

from __future__ import annotations

from typing import Any

from . import HFUnsupported

NORM_EPSILON = 1e-5  # builtin trainer (train/model.py) and Megatron-LM's --norm-epsilon default
ROPE_THETA_DEFAULT = 10000  # GPTModel rotary_base default
# megatron-core's RotaryEmbedding._apply_scaling fixes these; only the factor is a setting.
LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
ROPE_SCALING_FACTOR_DEFAULT = 8.0
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}

FAMILY_RULES: dict[str, dict[str, Any]] = {
    "llama": {"normalization": "RMSNorm", "activation": "swiglu", "position_embedding": "rope"},
    "gpt2": {"normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute"},
}


def _get(model: dict[str, Any], key: str, default: Any) -> Any:
    v = model.get(key)
    return default if v is None else v


def head_dim(model: dict[str, Any]) -> int:
    return int(_get(model, "kv_channels", model["hidden_size"] // model["num_attention_heads"]))


def query_groups(model: dict[str, Any]) -> int:
    return int(_get(model, "num_query_groups", model["num_attention_heads"]))


def family_of(model: dict[str, Any]) -> str:
    """"llama" or "gpt2"; HFUnsupported naming every setting that fits neither."""
    for field in ("num_layers", "hidden_size", "num_attention_heads"):
        if not model.get(field):
            raise HFUnsupported(f"model setting {field} is missing: cannot map the model to Hugging Face")
    norm = _get(model, "normalization", "LayerNorm")
    act = _get(model, "activation", "gelu")
    pos = _get(model, "position_embedding", "learned_absolute")
    chosen = {"normalization": norm, "activation": act, "position_embedding": pos}
    family = next((f for f, rule in FAMILY_RULES.items() if rule == chosen), None)
    if family is None:
        raise HFUnsupported(
            f"no Hugging Face model class matches normalization={norm}, activation={act}, position_embedding={pos}: "
            "supported are the Llama family (RMSNorm, swiglu, rope) and the GPT-2 family (LayerNorm, gelu, "
            "learned_absolute)")
    problems = []
    if model["hidden_size"] % model["num_attention_heads"]:
        problems.append("hidden_size not divisible by num_attention_heads")
    if head_dim(model) * model["num_attention_heads"] != model["hidden_size"]:
        problems.append(f"kv_channels={model.get('kv_channels')} (must be hidden_size / num_attention_heads)")
    if model["num_attention_heads"] % query_groups(model):
        problems.append("num_attention_heads not divisible by num_query_groups")
    if _get(model, "qk_layernorm", False):
        problems.append("qk_layernorm=True")
    if _get(model, "num_experts", None):
        problems.append(f"num_experts={model.get('num_experts')} (mixture of experts)")
    if family == "llama":
        if float(_get(model, "rotary_percent", 1.0)) != 1.0:
            problems.append(f"rotary_percent={model.get('rotary_percent')} (partial rotary)")
        if _get(model, "rotary_interleaved", False):
            problems.append("rotary_interleaved=True (transformers' Llama rotates halves)")
    else:
        if query_groups(model) != model["num_attention_heads"]:
            problems.append(f"num_query_groups={model.get('num_query_groups')} (GPT-2 has no grouped-query attention)")
        if not _get(model, "bias_linear", True):
            problems.append("bias_linear=False (GPT-2's linear layers always have biases)")
    if problems:
        raise HFUnsupported(f"the {family} family cannot hold this model: " + "; ".join(problems))
    return family


def _rope_parameters(model: dict[str, Any]) -> dict[str, Any]:
    theta = float(_get(model, "rotary_base", ROPE_THETA_DEFAULT))
    if not _get(model, "rope_scaling", False):
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "llama3", "rope_theta": theta,
            "factor": float(_get(model, "rope_scaling_factor", ROPE_SCALING_FACTOR_DEFAULT)), **LLAMA3_SCALING}


def hf_config(model: dict[str, Any], vocab_size: int, dtype: str) -> dict[str, Any]:
    """config.json content: every setting that changes the numbers, written out explicitly."""
    if dtype not in DTYPES:
        raise HFUnsupported(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    family = family_of(model)
    eps = float(_get(model, "norm_epsilon", NORM_EPSILON))
    tied = not _get(model, "untie_embeddings", False)
    max_pos = int(_get(model, "max_position_embeddings", model.get("seq_length") or 0))
    common = {"vocab_size": int(vocab_size), "tie_word_embeddings": tied, "dtype": DTYPES[dtype],
              "torch_dtype": DTYPES[dtype], "bos_token_id": model.get("bos_token_id"),
              "eos_token_id": model.get("eos_token_id"), "pad_token_id": None, "use_cache": True}
    if family == "llama":
        rope = _rope_parameters(model)
        bias = bool(_get(model, "bias_linear", False))
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
               "hidden_size": model["hidden_size"],
               "intermediate_size": int(_get(model, "ffn_hidden_size", 4 * model["hidden_size"])),
               "num_hidden_layers": model["num_layers"], "num_attention_heads": model["num_attention_heads"],
               "num_key_value_heads": query_groups(model), "head_dim": head_dim(model), "hidden_act": "silu",
               "max_position_embeddings": max_pos, "rms_norm_eps": eps, "attention_bias": bias, "mlp_bias": bias,
               "attention_dropout": float(_get(model, "attention_dropout", 0.0)), "pretraining_tp": 1,
               # transformers 5 reads rope_parameters; 4.x reads rope_theta and rope_scaling
               "rope_parameters": rope, "rope_theta": rope["rope_theta"], "initializer_range": 0.02}
        if rope["rope_type"] != "default":
            cfg["rope_scaling"] = dict(rope)
    else:
        drop_h = float(_get(model, "hidden_dropout", 0.0))
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
               "n_embd": model["hidden_size"], "n_layer": model["num_layers"], "n_head": model["num_attention_heads"],
               "n_inner": int(_get(model, "ffn_hidden_size", 4 * model["hidden_size"])), "n_positions": max_pos,
               # exact erf GELU as trained (F.gelu), not GPT-2's default tanh approximation "gelu_new"
               "activation_function": "gelu", "layer_norm_epsilon": eps,
               "resid_pdrop": drop_h, "embd_pdrop": drop_h,
               "attn_pdrop": float(_get(model, "attention_dropout", 0.0)),
               "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
               "reorder_and_upcast_attn": False, "initializer_range": 0.02}
    cfg.update(common)
    return cfg


def generation_config(model: dict[str, Any]) -> dict[str, Any]:
    """generation_config.json: the token ids when the run's tokenizer names them (null tokenizer: none)."""
    return {"_from_model_config": True, "bos_token_id": model.get("bos_token_id"),
            "eos_token_id": model.get("eos_token_id"), "pad_token_id": None}


def _rope_from_cfg(cfg: dict[str, Any]) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in rope.values()):
        raise HFUnsupported("config.json rope_parameters is nested per layer type: not a Llama rope")
    rtype = rope.get("rope_type") or rope.get("type") or "default"
    theta = rope.get("rope_theta", cfg.get("rope_theta", ROPE_THETA_DEFAULT))
    out: dict[str, Any] = {"rotary_base": int(theta) if float(theta).is_integer() else theta}
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0)) != 1.0:
        raise HFUnsupported("config.json partial_rotary_factor != 1: megatron's rotary_percent is not a spec setting")
    if rtype == "default":
        return out
    if rtype != "llama3":
        raise HFUnsupported(f"config.json rope_type {rtype!r}: megatron-core implements only Llama-3.1 scaling")
    for k, v in LLAMA3_SCALING.items():
        if float(rope.get(k, -1)) != float(v):
            raise HFUnsupported(f"config.json rope {k}={rope.get(k)}: megatron-core's RotaryEmbedding._apply_scaling "
                                f"fixes it at {v}")
    out.update(rope_scaling=True, rope_scaling_factor=float(rope["factor"]))
    return out


def model_from_hf_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json -> model settings in ModelSpec names (plus norm_epsilon, rope_scaling*)."""
    mt = cfg.get("model_type")
    if mt == "llama":
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise HFUnsupported(f"config.json hidden_act={act!r}: megatron's swiglu is silu-gated")
        heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
        if cfg.get("head_dim") not in (None, hidden // heads):
            raise HFUnsupported(f"config.json head_dim={cfg['head_dim']} != hidden_size/num_attention_heads")
        if bool(cfg.get("attention_bias", False)) != bool(cfg.get("mlp_bias", False)):
            raise HFUnsupported("config.json attention_bias != mlp_bias: megatron's add_bias_linear covers both")
        model = {"num_layers": cfg["num_hidden_layers"], "hidden_size": hidden, "num_attention_heads": heads,
                 "num_query_groups": cfg.get("num_key_value_heads") or heads,
                 "ffn_hidden_size": cfg["intermediate_size"],
                 "max_position_embeddings": cfg.get("max_position_embeddings"), "vocab_size": cfg["vocab_size"],
                 "normalization": "RMSNorm", "activation": "swiglu", "position_embedding": "rope",
                 "untie_embeddings": not cfg.get("tie_word_embeddings", False),
                 "bias_linear": bool(cfg.get("attention_bias", False)),
                 "norm_epsilon": float(cfg.get("rms_norm_eps", 1e-6))}
        model.update(_rope_from_cfg(cfg))
        return model
    if mt == "gpt2":
        act = cfg.get("activation_function", "gelu_new")
        if act != "gelu":
            raise HFUnsupported(f"config.json activation_function={act!r}: the trainer's gelu is the exact erf "
                                "GELU (\"gelu\"); a tanh-approximated model would change its numbers")
        if not cfg.get("scale_attn_weights", True) or cfg.get("scale_attn_by_inverse_layer_idx", False):
            raise HFUnsupported("config.json scale_attn_weights=False or scale_attn_by_inverse_layer_idx=True: "
                                "megatron scales attention by 1/sqrt(head_dim) only")
        hidden = cfg.get("n_embd", 768)
        return {"num_layers": cfg.get("n_layer", 12), "hidden_size": hidden,
                "num_attention_heads": cfg.get("n_head", 12), "num_query_groups": cfg.get("n_head", 12),
                "ffn_hidden_size": cfg.get("n_inner") or 4 * hidden,
                "max_position_embeddings": cfg.get("n_positions", 1024), "vocab_size": cfg.get("vocab_size", 50257),
                "normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
                "untie_embeddings": not cfg.get("tie_word_embeddings", True), "bias_linear": True,
                "norm_epsilon": float(cfg.get("layer_norm_epsilon", 1e-5))}
    raise HFUnsupported(f"config.json model_type={mt!r}: supported are 'llama' and 'gpt2'")


SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
                "normalization", "activation", "position_embedding", "rotary_base", "untie_embeddings",
                "bias_linear", "norm_epsilon", "rope_scaling", "rope_scaling_factor")


def shape_mismatches(spec_model: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, spec value, config.json value) for every setting where the spec and the HF model differ.

    The spec's unset optional fields take the trainer's values (norm_epsilon 1e-5, no rope
    scaling, num_query_groups = heads). A learned-position model must also agree on
    max_position_embeddings (the table's size); the vocabulary must fit the spec's when it sets one.
    """
    hf = model_from_hf_config(cfg)
    defaults = {"norm_epsilon": NORM_EPSILON, "rope_scaling": False, "rope_scaling_factor": None,
                "num_query_groups": spec_model.get("num_attention_heads"),
                "ffn_hidden_size": 4 * spec_model["hidden_size"] if spec_model.get("hidden_size") else None,
                "rotary_base": ROPE_THETA_DEFAULT if spec_model.get("position_embedding") == "rope" else None,
                "untie_embeddings": False, "bias_linear": True}
    out = []
    for field in SHAPE_FIELDS:
        sv = spec_model.get(field)
        if sv is None:
            sv = defaults.get(field)
        hv = hf.get(field)
        if field == "rope_scaling":
            hv = bool(hv)
        if field == "rope_scaling_factor" and not hf.get("rope_scaling"):
            continue
        if field == "rotary_base" and hf.get("position_embedding") != "rope":
            continue
        if sv != hv and not (isinstance(sv, (int, float)) and isinstance(hv, (int, float))
                             and float(sv) == float(hv)):
            out.append((field, sv, hv))
    if hf["position_embedding"] == "learned_absolute":
        sv = spec_model.get("max_position_embeddings") or spec_model.get("seq_length")
        if sv != hf["max_position_embeddings"]:
            out.append(("max_position_embeddings", sv, hf["max_position_embeddings"]))
    if spec_model.get("vocab_size") is not None and spec_model["vocab_size"] != hf["vocab_size"]:
        out.append(("vocab_size", spec_model["vocab_size"], hf["vocab_size"]))
    return out
