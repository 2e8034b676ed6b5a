"""Tiny Hugging Face models with random weights, made from transformers configs (no download).

Shared by the issue-29 tests (mapping, proof, export/import, init_from). Each factory returns
(model, settings): `model` is a transformers *ForCausalLM in eval mode, fp32, with every
parameter (norm weights and biases included) drawn from a seeded generator, so a mapping that
confuses two tensors cannot pass by both being ones or zeros; `settings` is the same model in the
spec's ModelSpec field names (what plan.resolve_model gives the trainer).

- llama_model(): Llama style: RMSNorm, SwiGLU, RoPE (theta 10000), GQA (4 heads, 2 KV groups),
  untied embeddings, no biases; vocab 100 (Megatron pads it to 128).
- gpt2_model(): GPT-2 style: LayerNorm, exact GELU ("gelu", as the builtin trainer's F.gelu),
  learned positions, biases, tied embeddings; vocab 100.
- save(model, path) writes it with save_pretrained (safetensors).
Heavy imports stay inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 100
SEQ = 64


def llama_settings(**over: Any) -> dict[str, Any]:
    s = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 2,
         "ffn_hidden_size": 128, "seq_length": SEQ, "max_position_embeddings": SEQ, "vocab_size": VOCAB,
         "normalization": "RMSNorm", "activation": "swiglu", "position_embedding": "rope", "rotary_base": 10000,
         "untie_embeddings": True, "bias_linear": False, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    s.update(over)
    return s


def gpt2_settings(**over: Any) -> dict[str, Any]:
    s = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4,
         "ffn_hidden_size": 256, "seq_length": SEQ, "max_position_embeddings": SEQ, "vocab_size": VOCAB,
         "normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
         "rotary_base": None, "untie_embeddings": False, "bias_linear": True, "hidden_dropout": 0.0,
         "attention_dropout": 0.0}
    s.update(over)
    return s


def _randomize(model: Any, seed: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or (".ln_" in name and name.endswith(".weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def llama_model(seed: int = 0, **settings_over: Any) -> tuple[Any, dict[str, Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    s = llama_settings(**settings_over)
    cfg = LlamaConfig(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"], intermediate_size=s["ffn_hidden_size"],
        num_hidden_layers=s["num_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_query_groups"], hidden_act="silu",
        max_position_embeddings=s["max_position_embeddings"], rms_norm_eps=1e-5,
        tie_word_embeddings=not s["untie_embeddings"], attention_bias=s["bias_linear"], mlp_bias=s["bias_linear"],
        rope_parameters={"rope_type": "default", "rope_theta": float(s["rotary_base"])},
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    import torch

    torch.manual_seed(seed)
    return _randomize(LlamaForCausalLM(cfg), seed), s


def gpt2_model(seed: int = 0, **settings_over: Any) -> tuple[Any, dict[str, Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    s = gpt2_settings(**settings_over)
    cfg = GPT2Config(
        vocab_size=s["vocab_size"], n_positions=s["max_position_embeddings"], n_embd=s["hidden_size"],
        n_layer=s["num_layers"], n_head=s["num_attention_heads"], n_inner=s["ffn_hidden_size"],
        activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
    )
    import torch

    torch.manual_seed(seed)
    return _randomize(GPT2LMHeadModel(cfg), seed), s


def save(model: Any, path: Path | str) -> Path:
    path = Path(path)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def batch(vocab: int = VOCAB, batch_size: int = 2, seq: int = 16, seed: int = 7) -> Any:
    """A fixed token batch [batch_size, seq] for the logits comparisons."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch_size, seq), generator=gen)
