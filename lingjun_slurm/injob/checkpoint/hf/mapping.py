"""Megatron <-> Hugging Face tensor transforms, both directions, exact (torch imported inside functions).

Megatron keys are those of a torch_dist checkpoint. What a real one holds (saved by
tests/checkpoint/make_checkpoints.py: megatron-core 0.16.1 GPTModel, get_gpt_layer_local_spec(),
read back with torch.distributed.checkpoint's FileSystemReader metadata):

    embedding.word_embeddings.weight            [padded_vocab, h]
    embedding.position_embeddings.weight        [max_pos, h]            (learned_absolute only)
    decoder.layers.self_attention.linear_qkv.layer_norm_weight  [L, h]  (+ layer_norm_bias for LayerNorm)
    decoder.layers.self_attention.linear_qkv.weight             [L, (heads + 2 * groups) * d, h]
    decoder.layers.self_attention.linear_proj.weight            [L, h, h]
    decoder.layers.mlp.linear_fc1.layer_norm_weight             [L, h]
    decoder.layers.mlp.linear_fc1.weight                        [L, ffn (x2 gated), h]
    decoder.layers.mlp.linear_fc2.weight                        [L, h, ffn]
    (+ .bias of each linear with bias_linear; ..._extra_state/shard_* objects, ignored)
    decoder.final_layernorm.weight (+ .bias)
    output_layer.weight                         [padded_vocab, h]       (untied only)

- Layers are stacked on a leading axis of size num_layers (global layer numbers, whatever the
  pipeline split): megatron/core/transformer/transformer_block.py TransformerBlock.sharded_state_dict
  passes sharded_offsets (0, global_layer_offset + i, num_layers) to each layer, which makes the
  ShardedTensor key "decoder.layers.<rest>" with that prepended axis.
- The layer norms live under linear_qkv / linear_fc1 in both specs: TE fuses them
  (TELayerNormColumnParallelLinear.layer_norm_weight), and the local spec renames its separate
  input_layernorm / pre_mlp_layernorm modules on save (gpt_layer_specs.py get_gpt_layer_local_spec:
  sharded_state_dict_keys_map {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
  "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}). module_key() undoes that rename for a
  local-spec module's state_dict.
- Tied embeddings: with share_embeddings_and_output_weights and one stage, output_layer has no
  weight and the checkpoint no output_layer.weight; the last pipeline stage stores its copy under
  the embedding's own key (language_module.py tie_embeddings_and_output_weights_state_dict).
- linear_qkv rows are interleaved per query group: [q heads of group 0, k0, v0, q heads of group 1,
  k1, v1, ...], each head d = hidden/heads rows (megatron/core/transformer/attention.py
  SelfAttention.get_query_key_value_tensors: view [.., ng, (np/ng + 2) * hn], split
  [np/ng * hn, hn, hn]).
- Gated linear_fc1 = [gate; up] on dim 0 (megatron/core/transformer/mlp.py: glu splits
  torch.chunk(x, 2, dim=-1) and computes act(x[0]) * x[1]); transformers' LlamaMLP is
  down(act(gate(x)) * up(x)) (models/llama/modeling_llama.py).
- GPT-2's Conv1D stores weights [in, out] (transformers/pytorch_utils.py Conv1D: x @ weight), so
  every GPT-2 linear is the transpose; c_attn's output is [q; k; v] (modeling_gpt2.py
  GPT2Attention: c_attn(x).split(split_size, dim=2)).
- Vocabulary padding: exported rows beyond vocab_size are dropped; on import the padding rows repeat
  the last real row, as Megatron-LM's converter does (tools/checkpoint/saver_base.py :398-402,
  NVIDIA/Megatron-LM main d98e8a6).

Per-layer keys "decoder.layers.<i>.<rest>" (no leading axis) are accepted by to_hf and produced by
to_megatron, so a caller can load and convert one layer at a time; stacked_key() splits them.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator

from . import HFUnsupported
from .families import family_of, head_dim, query_groups

# The name table. {i} = layer number. Megatron side: checkpoint keys (per layer below "decoder.layers.{i}.").
# A value that is a tuple lists the HF tensors one Megatron tensor is split into (the transform says how).
GLOBAL_NAMES: dict[str, dict[str, str]] = {
    "llama": {
        "embedding.word_embeddings.weight": "model.embed_tokens.weight",
        "decoder.final_layernorm.weight": "model.norm.weight",
        "output_layer.weight": "lm_head.weight",
    },
    "gpt2": {
        "embedding.word_embeddings.weight": "transformer.wte.weight",
        "embedding.position_embeddings.weight": "transformer.wpe.weight",
        "decoder.final_layernorm.weight": "transformer.ln_f.weight",
        "decoder.final_layernorm.bias": "transformer.ln_f.bias",
        "output_layer.weight": "lm_head.weight",
    },
}
LAYER_NAMES: dict[str, dict[str, Any]] = {
    "llama": {
        "self_attention.linear_qkv.layer_norm_weight": "model.layers.{i}.input_layernorm.weight",
        "self_attention.linear_qkv.weight": ("model.layers.{i}.self_attn.q_proj.weight",
                                             "model.layers.{i}.self_attn.k_proj.weight",
                                             "model.layers.{i}.self_attn.v_proj.weight"),
        "self_attention.linear_qkv.bias": ("model.layers.{i}.self_attn.q_proj.bias",
                                           "model.layers.{i}.self_attn.k_proj.bias",
                                           "model.layers.{i}.self_attn.v_proj.bias"),
        "self_attention.linear_proj.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "self_attention.linear_proj.bias": "model.layers.{i}.self_attn.o_proj.bias",
        "mlp.linear_fc1.layer_norm_weight": "model.layers.{i}.post_attention_layernorm.weight",
        "mlp.linear_fc1.weight": ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"),
        "mlp.linear_fc1.bias": ("model.layers.{i}.mlp.gate_proj.bias", "model.layers.{i}.mlp.up_proj.bias"),
        "mlp.linear_fc2.weight": "model.layers.{i}.mlp.down_proj.weight",
        "mlp.linear_fc2.bias": "model.layers.{i}.mlp.down_proj.bias",
    },
    "gpt2": {
        "self_attention.linear_qkv.layer_norm_weight": "transformer.h.{i}.ln_1.weight",
        "self_attention.linear_qkv.layer_norm_bias": "transformer.h.{i}.ln_1.bias",
        "self_attention.linear_qkv.weight": "transformer.h.{i}.attn.c_attn.weight",  # de-interleave, transpose
        "self_attention.linear_qkv.bias": "transformer.h.{i}.attn.c_attn.bias",  # de-interleave
        "self_attention.linear_proj.weight": "transformer.h.{i}.attn.c_proj.weight",  # transpose
        "self_attention.linear_proj.bias": "transformer.h.{i}.attn.c_proj.bias",
        "mlp.linear_fc1.layer_norm_weight": "transformer.h.{i}.ln_2.weight",
        "mlp.linear_fc1.layer_norm_bias": "transformer.h.{i}.ln_2.bias",
        "mlp.linear_fc1.weight": "transformer.h.{i}.mlp.c_fc.weight",  # transpose
        "mlp.linear_fc1.bias": "transformer.h.{i}.mlp.c_fc.bias",
        "mlp.linear_fc2.weight": "transformer.h.{i}.mlp.c_proj.weight",  # transpose
        "mlp.linear_fc2.bias": "transformer.h.{i}.mlp.c_proj.bias",
    },
}
# transformers' base_model_prefix (modeling_gpt2.py GPT2PreTrainedModel, modeling_llama.py LlamaPreTrainedModel)
BASE_PREFIX = {"llama": "model.", "gpt2": "transformer."}
GPT2_TRANSPOSED = {"self_attention.linear_proj.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"}
VOCAB_KEYS = {"embedding.word_embeddings.weight", "output_layer.weight"}

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_STACKED = "decoder.layers."
# local-spec module names of the fused-on-save layer norms (gpt_layer_specs.py sharded_state_dict_keys_map)
_MODULE_RENAME = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
                  ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))


def stacked_key(key: str) -> tuple[str, int | None]:
    """("decoder.layers.<rest>", i) for a per-layer key; (key, None) otherwise."""
    m = _LAYER.match(key)
    return (_STACKED + m.group(2), int(m.group(1))) if m else (key, None)


def module_key(key: str) -> str:
    """Checkpoint key -> the local spec's module state_dict key (input_layernorm / pre_mlp_layernorm)."""
    for ckpt, mod in _MODULE_RENAME:
        if ckpt in key:
            return key.replace(ckpt, mod)
    return key


def checkpoint_key(key: str) -> str:
    """The inverse of module_key."""
    for ckpt, mod in _MODULE_RENAME:
        if mod in key:
            return key.replace(mod, ckpt)
    return key


def _split_qkv(t: Any, model: dict[str, Any]) -> tuple[Any, Any, Any]:
    """linear_qkv weight [(np + 2 ng) d, h] or bias [(np + 2 ng) d] -> q [np d, ..], k [ng d, ..], v [ng d, ..]."""
    heads, groups, d = model["num_attention_heads"], query_groups(model), head_dim(model)
    per = heads // groups
    rest = tuple(t.shape[1:])
    g = t.reshape(groups, (per + 2) * d, *rest)
    q = g[:, : per * d].reshape(heads * d, *rest)
    k = g[:, per * d: (per + 1) * d].reshape(groups * d, *rest)
    v = g[:, (per + 1) * d:].reshape(groups * d, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def _join_qkv(q: Any, k: Any, v: Any, model: dict[str, Any]) -> Any:
    import torch

    heads, groups, d = model["num_attention_heads"], query_groups(model), head_dim(model)
    per = heads // groups
    rest = tuple(q.shape[1:])
    return torch.cat([q.reshape(groups, per * d, *rest), k.reshape(groups, d, *rest),
                      v.reshape(groups, d, *rest)], dim=1).reshape((heads + 2 * groups) * d, *rest).contiguous()


def _layer_to_hf(family: str, model: dict[str, Any], rest: str, i: int, t: Any) -> list[tuple[str, Any]]:
    table = LAYER_NAMES[family]
    if rest not in table:
        raise HFUnsupported(f"checkpoint tensor decoder.layers.{i}.{rest} has no {family} counterpart "
                            "(a layer this mapping does not know)")
    target = table[rest]
    if family == "llama":
        if rest.startswith("self_attention.linear_qkv.") and not rest.endswith("layer_norm_weight"):
            return [(n.format(i=i), x) for n, x in zip(target, _split_qkv(t, model))]
        if rest.startswith("mlp.linear_fc1.") and not rest.endswith("layer_norm_weight"):
            gate, up = t.chunk(2, dim=0)
            return [(target[0].format(i=i), gate.contiguous()), (target[1].format(i=i), up.contiguous())]
        return [(target.format(i=i), t)]
    import torch

    if rest == "self_attention.linear_qkv.weight":
        return [(target.format(i=i), torch.cat(_split_qkv(t, model), dim=0).t().contiguous())]
    if rest == "self_attention.linear_qkv.bias":
        return [(target.format(i=i), torch.cat(_split_qkv(t, model), dim=0))]
    if rest in GPT2_TRANSPOSED:
        return [(target.format(i=i), t.t().contiguous())]
    return [(target.format(i=i), t)]


def to_hf(family: str, model: dict[str, Any], name: str, tensor: Any, vocab_size: int) -> list[tuple[str, Any]]:
    """One Megatron checkpoint tensor -> [(HF name, tensor)]. Stacked "decoder.layers.<rest>" tensors
    ([L, ...]) give every layer's tensors; per-layer keys one layer's. _extra_state objects give []."""
    if "_extra_state" in name:
        return []
    if name.startswith(_STACKED):
        key, i = stacked_key(name)
        rest = key[len(_STACKED):]
        if i is not None:
            return _layer_to_hf(family, model, rest, i, tensor)
        if tensor.shape[0] != model["num_layers"]:
            raise HFUnsupported(f"{name}: leading axis {tensor.shape[0]} is not num_layers={model['num_layers']}")
        out: list[tuple[str, Any]] = []
        for j in range(tensor.shape[0]):
            out.extend(_layer_to_hf(family, model, rest, j, tensor[j]))
        return out
    table = GLOBAL_NAMES[family]
    if name not in table:
        raise HFUnsupported(f"checkpoint tensor {name} has no {family} counterpart")
    if name in VOCAB_KEYS:
        if tensor.shape[0] < vocab_size:
            raise HFUnsupported(f"{name} has {tensor.shape[0]} rows, fewer than vocab_size={vocab_size}")
        tensor = tensor[:vocab_size].contiguous()
    return [(table[name], tensor)]


def _pad_vocab(t: Any, padded: int) -> Any:
    import torch

    if t.shape[0] > padded:
        raise HFUnsupported(f"the Hugging Face vocabulary ({t.shape[0]}) is larger than the padded one ({padded})")
    if t.shape[0] == padded:
        return t
    # Megatron-LM tools/checkpoint/saver_base.py :398-402: repeat the last row
    return torch.cat([t, t[-1:].expand(padded - t.shape[0], -1)], dim=0).contiguous()


def megatron_keys(family: str, model: dict[str, Any]) -> list[str]:
    """The per-layer and global checkpoint keys a model of these settings has (no _extra_state)."""
    bias = bool(model.get("bias_linear", family == "gpt2"))
    ln_bias = family == "gpt2"
    keys = ["embedding.word_embeddings.weight"]
    if family == "gpt2":
        keys.append("embedding.position_embeddings.weight")
    for i in range(model["num_layers"]):
        for rest in LAYER_NAMES[family]:
            if rest.endswith(".bias") and not bias:
                continue
            if rest.endswith("layer_norm_bias") and not ln_bias:
                continue
            keys.append(f"decoder.layers.{i}.{rest}")
    keys.append("decoder.final_layernorm.weight")
    if ln_bias:
        keys.append("decoder.final_layernorm.bias")
    if model.get("untie_embeddings"):
        keys.append("output_layer.weight")
    return keys


def to_megatron(family: str, model: dict[str, Any], hf_tensors: Callable[[str], Any],
                padded_vocab: int) -> Iterator[tuple[str, Any]]:
    """HF tensors (hf_tensors(name) -> tensor) -> (checkpoint key, tensor), per-layer keys
    "decoder.layers.<i>.<rest>", one key at a time; the vocabulary padded to padded_vocab."""
    import torch

    if family != family_of(model):
        raise HFUnsupported(f"family {family!r} does not match the model settings ({family_of(model)})")

    def get(n: str) -> Any:
        try:
            return hf_tensors(n)
        except KeyError:
            pass
        # files saved from the base model (GPT2Model / LlamaModel, e.g. the original gpt2 weights: "h.0.attn...")
        # name tensors without the base_model_prefix; transformers' from_pretrained accepts both
        base = BASE_PREFIX[family]
        if n.startswith(base):
            try:
                return hf_tensors(n[len(base):])
            except KeyError:
                pass
        raise HFUnsupported(f"the Hugging Face model has no tensor {n}") from None

    for key in megatron_keys(family, model):
        key_s, i = stacked_key(key)
        if i is None:
            hf_name = GLOBAL_NAMES[family][key]
            t = get(hf_name)
            yield key, (_pad_vocab(t, padded_vocab) if key in VOCAB_KEYS else t)
            continue
        rest = key_s[len(_STACKED):]
        target = LAYER_NAMES[family][rest]
        if family == "llama":
            if isinstance(target, tuple) and len(target) == 3:
                yield key, _join_qkv(*(get(n.format(i=i)) for n in target), model=model)
            elif isinstance(target, tuple):
                yield key, torch.cat([get(n.format(i=i)) for n in target], dim=0).contiguous()
            else:
                yield key, get(target.format(i=i))
            continue
        t = get(target.format(i=i))
        if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            if rest.endswith("weight"):
                t = t.t()
            h = model["num_attention_heads"] * head_dim(model)
            q, k, v = t.split([h, query_groups(model) * head_dim(model), query_groups(model) * head_dim(model)], 0)
            yield key, _join_qkv(q, k, v, model)
        elif rest in GPT2_TRANSPOSED:
            yield key, t.t().contiguous()
        else:
            yield key, t
