"""The proof of a conversion: megatron-core's GPTModel and transformers' model on one fixed batch.

compare_logits builds megatron-core's GPTModel in this process (TP=PP=1, get_gpt_layer_local_spec,
the TransformerConfig the builtin trainer uses: lingjun_slurm/injob/train/model.py
transformer_config) on a 1-rank gloo group over an in-memory HashStore (as
tests/checkpoint/make_checkpoints.py; undone afterwards), fills it with the Megatron-side weights,
builds transformers' model from the directory's config.json (AutoModelForCausalLM.from_config,
eager attention) with the directory's safetensors weights, runs both on the batch
in fp32 and compares the output of every transformer layer (forward hooks on
GPTModel.decoder.layers[i] and on the HF model's decoder layers) and the final logits (the
vocabulary padding cut off).

Weights: when the Hugging Face files hold bf16/fp16, the Megatron-side weights are rounded to that
dtype first, so both models hold the same numbers and the comparison checks the mapping, not the
rounding (the rounding itself is what the user asked for with --dtype).

Tolerance: max |logit difference| <= max(ABS_TOL, REL_TOL * max |logit|). ABS_TOL = 1e-4 is the
fp32 figure required on the test models (they agree to 0 on the CPU: same fp32 kernels);
REL_TOL = 2e-5 of the largest logit is the stated allowance for real sizes, where the two
implementations' different summation orders (eager attention vs megatron's baddbmm, fused vs split
QKV matmuls) add up over wide, deep models. It has not been measured on a real-size model here (no
GPU and no real-size checkpoint in this environment). Both sides compute in fp32 (TF32 off on a GPU).

Memory (layer_by_layer=True, the default): neither model is ever whole. Both are built with their
parameters on the meta device (empty_params: no storage); the global tensors (embeddings, position
table, final norm, output layer) are loaded up front, and a forward pre-hook on each decoder layer
loads that layer's tensors (Megatron side: MegatronSource.load(key, layer=j), one index of the stacked
[L, ...] torch_dist tensor; HF side: safetensors safe_open, one tensor at a time) and a forward hook
records its output and puts its weights back on meta. Peak: the global tensors + one layer of each
model (the two runs are sequential, so one layer at a time in fact) + the batch's activations + the
per-layer outputs kept for the comparison (L x batch x seq x hidden floats). Both models still run
their own unchanged forward code; only where the weights come from changes.
layer_by_layer=False loads both models whole (from_pretrained and a full GPTModel): 2 x 4 bytes x
parameters. The hooked run and the whole run give identical figures (tests/checkpoint/test_hf_proof.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import HFUnsupported
from .families import family_of
from .mapping import module_key, stacked_key

ABS_TOL = 1e-4
REL_TOL = 2e-5
MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.")


@dataclass
class ProofResult:
    max_abs_diff: float
    per_layer: list[float]
    tolerance: float
    ok: bool
    max_abs_logit: float = 0.0
    family: str = ""
    device: str = "cpu"
    batch_shape: tuple[int, ...] = ()
    weights_dtype: str = "float32"
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        verdict = "OK" if self.ok else "MISMATCH"
        b = "x".join(str(n) for n in self.batch_shape)
        out = [f"logits check ({self.family}, fp32 on {self.device}, batch {b}, weights {self.weights_dtype}): "
               f"max |logit difference| = {self.max_abs_diff:.3g} (tolerance {self.tolerance:.3g}, "
               f"largest |logit| {self.max_abs_logit:.3g}) {verdict}"]
        if self.per_layer:
            out.append("per layer max |difference|: " + ", ".join(f"{i}:{d:.3g}" for i, d in enumerate(self.per_layer)))
        out.extend(self.notes)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"max_abs_diff": self.max_abs_diff, "per_layer": self.per_layer, "tolerance": self.tolerance,
                "ok": self.ok, "max_abs_logit": self.max_abs_logit, "family": self.family, "device": self.device,
                "batch_shape": list(self.batch_shape), "weights_dtype": self.weights_dtype}


class TensorSource:
    """A MegatronSource stand-in: checkpoint keys -> tensors in memory, with the model settings."""

    def __init__(self, model: dict[str, Any], tensors: dict[str, Any]) -> None:
        self.model = model
        self._t = tensors

    def keys(self) -> list[str]:
        return list(self._t)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._t[key].shape)

    def load(self, key: str, layer: int | None = None) -> Any:
        return self._t[key] if layer is None else self._t[key][layer]


def _settings(source: Any) -> dict[str, Any]:
    for attr in ("model", "settings"):
        v = getattr(source, attr, None)
        if isinstance(v, dict):
            return v
    raise HFUnsupported("the Megatron source carries no model settings")


@contextlib.contextmanager
def megatron_process(device: str) -> Iterator[None]:
    """A 1-rank gloo group on a HashStore and TP=PP=1, undone afterwards (unless already set up)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    from lingjun_slurm.injob.train import cpu_compat

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    own_mp = not parallel_state.model_parallel_is_initialized()
    if own_mp:
        parallel_state.initialize_model_parallel(1, 1)
    # cpu_compat: megatron-core's CUDA-only calls (the local attention's GlobalMemoryBuffer asks
    # torch.cuda.current_device()) redirected; left alone when the caller already activated it
    compat = (device == "cpu" and not torch.cuda.is_available() and not cpu_compat._State.active
              and cpu_compat.activate())
    from megatron.core.tensor_parallel import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    # the attention forks megatron's "model-parallel-rng" state (dot_product_attention.py) even with
    # dropout 0; seeded only when nobody has (a caller's RNG states are not reset)
    if "model-parallel-rng" not in get_cuda_rng_tracker().get_states():
        model_parallel_cuda_manual_seed(1234)
    try:
        yield
    finally:
        if compat:
            cpu_compat.deactivate()
        if own_mp:
            parallel_state.destroy_model_parallel()
        if own_group:
            dist.destroy_process_group()


def build_gpt_model(model: dict[str, Any], padded_vocab: int, initialize: bool = True) -> Any:
    """megatron-core GPTModel as the builtin trainer builds it (train/model.py build), fp32, local spec."""
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    swiglu = model.get("activation") == "swiglu"
    config = TransformerConfig(
        num_layers=model["num_layers"], hidden_size=model["hidden_size"],
        num_attention_heads=model["num_attention_heads"],
        num_query_groups=model.get("num_query_groups") or model["num_attention_heads"],
        ffn_hidden_size=model.get("ffn_hidden_size") or 4 * model["hidden_size"],
        normalization=model.get("normalization") or "LayerNorm",
        layernorm_epsilon=float(model.get("norm_epsilon") or 1e-5),
        activation_func=F.silu if swiglu else F.gelu, gated_linear_unit=swiglu,
        add_bias_linear=bool(model.get("bias_linear", True)), hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=torch.float32, pipeline_dtype=torch.float32, use_cpu_initialization=True,
        perform_initialization=initialize,
    )
    pos = model.get("position_embedding") or "learned_absolute"
    kwargs: dict[str, Any] = {}
    if pos == "rope":
        kwargs.update(rotary_base=int(model.get("rotary_base") or 10000),
                      rope_scaling=bool(model.get("rope_scaling", False)),
                      rope_scaling_factor=float(model.get("rope_scaling_factor") or 8.0))
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization=config.normalization),
                    vocab_size=padded_vocab,
                    max_sequence_length=model.get("max_position_embeddings") or model.get("seq_length"),
                    share_embeddings_and_output_weights=not model.get("untie_embeddings", False),
                    position_embedding_type=pos, **kwargs)


def load_megatron_weights(gpt: Any, source: Any, round_to: Any = None) -> None:
    """Copy the source's tensors into the GPTModel, one checkpoint tensor at a time; all must be filled."""
    import torch

    params = gpt.state_dict(keep_vars=True)
    filled: set[str] = set()

    def put(key: str, t: Any) -> None:
        name = module_key(key)
        if name not in params:
            raise HFUnsupported(f"checkpoint tensor {key} has no place in megatron-core's GPTModel for these settings")
        dst = params[name]
        if tuple(dst.shape) != tuple(t.shape):
            raise HFUnsupported(f"checkpoint tensor {key}: shape {tuple(t.shape)}, the model wants {tuple(dst.shape)}")
        t = t.to(round_to).float() if round_to is not None else t.float()
        with torch.no_grad():
            dst.copy_(t)
        filled.add(name)

    for key in source.keys():
        if "_extra_state" in key or not key.startswith(MODEL_PREFIXES):
            continue
        t = source.load(key)
        base, i = stacked_key(key)
        if key.startswith("decoder.layers.") and i is None:
            rest = key[len("decoder.layers."):]
            for j in range(t.shape[0]):
                put(f"decoder.layers.{j}.{rest}", t[j])
        else:
            put(key, t)
        del t
    missing = [n for n in params if n not in filled and "_extra_state" not in n
               and not n.startswith("rotary_pos_emb")]
    if missing:
        more = " ..." if len(missing) > 8 else ""
        raise HFUnsupported("the Megatron weights lack " + ", ".join(missing[:8]) + more)


def _hf_layers(hf: Any) -> Any:
    base = getattr(hf, "model", None) or getattr(hf, "transformer")
    return getattr(base, "layers", None) or getattr(base, "h")


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _stored_dtype(hf_dir: str) -> str:
    try:
        with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return "float32"
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


@contextlib.contextmanager
def empty_params() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory); buffers stay real
    (rotary tables). The same trick as accelerate's init_empty_weights(include_buffers=False)."""
    import torch

    original = torch.nn.Module.register_parameter

    def register(module: Any, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def _assign(root: Any, name: str, tensor: Any, what: str) -> None:
    """Put `tensor` in place of parameter `name` (dotted, relative to root); shapes must agree."""
    import torch

    mod_name, _, leaf = name.rpartition(".")
    try:
        mod = root.get_submodule(mod_name) if mod_name else root
    except AttributeError:
        mod = None
    if mod is None or leaf not in mod._parameters or mod._parameters[leaf] is None:
        raise HFUnsupported(f"{what} tensor {name} has no place in the model built for these settings")
    old = mod._parameters[leaf]
    if tuple(old.shape) != tuple(tensor.shape):
        raise HFUnsupported(f"{what} tensor {name}: shape {tuple(tensor.shape)}, the model wants {tuple(old.shape)}")
    mod._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)


def _release(module: Any) -> None:
    """Back to meta: the layer's weights are freed once its output is recorded."""
    import torch

    for mod in module.modules():
        for leaf, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[leaf] = torch.nn.Parameter(p.detach().to("meta"), requires_grad=False)


def _still_empty(module: Any) -> list[str]:
    return [n for n, p in module.named_parameters() if p.device.type == "meta"]


class HFFiles:
    """The safetensors files of a Hugging Face directory (index or one file), a tensor at a time."""

    def __init__(self, hf_dir: str) -> None:
        index = os.path.join(hf_dir, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as fh:
                wmap = json.load(fh)["weight_map"]
            self.where = {n: os.path.join(hf_dir, f) for n, f in wmap.items()}
        else:
            single = os.path.join(hf_dir, "model.safetensors")
            if not os.path.isfile(single):
                raise HFUnsupported(f"{hf_dir}: no model.safetensors or model.safetensors.index.json")
            from safetensors import safe_open

            with safe_open(single, framework="pt") as fh:
                self.where = {n: single for n in fh.keys()}

    def names(self) -> list[str]:
        return list(self.where)

    def get(self, name: str) -> Any:
        from safetensors import safe_open

        with safe_open(self.where[name], framework="pt") as fh:
            return fh.get_tensor(name)


def _hf_layer_prefix(family: str) -> str:
    return "model.layers." if family == "llama" else "transformer.h."


def _load_layer(source: Any, key: str, layer: int) -> Any:
    try:
        return source.load(key, layer=layer)
    except TypeError:  # a source without per-layer reads
        return source.load(key)[layer]


def _run_hf(hf_dir: str, family: str, tokens: Any, device: str, layer_by_layer: bool,
            outputs: list[Any]) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not layer_by_layer:
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
        hf.eval().to(device)
        hooks = [layer.register_forward_hook(lambda m, a, o: outputs.append(_first(o).detach()))
                 for layer in _hf_layers(hf)]
    else:
        files = HFFiles(hf_dir)
        cfg = AutoConfig.from_pretrained(hf_dir)
        with empty_params():
            hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        hf.eval()
        prefix = _hf_layer_prefix(family)
        params = {n for n, _ in hf.named_parameters(remove_duplicate=False)}
        # what from_pretrained skips too: GPT-2's old attn.bias mask buffers, old Llama rotary_emb.inv_freq
        ignore = [re.compile(p) for p in (getattr(hf, "_keys_to_ignore_on_load_unexpected", None) or [])]
        ignore.append(re.compile(r"rotary_emb\.inv_freq"))
        per_layer: dict[int, list[tuple[str, str]]] = {}
        for stored in files.names():
            name = stored if stored in params else f"{hf.base_model_prefix}.{stored}"  # "h.0..." of old GPT-2 files
            if name not in params:
                if any(p.search(stored) for p in ignore):
                    continue
                raise HFUnsupported(f"{hf_dir}: tensor {stored} has no place in {type(hf).__name__}")
            if name.startswith(prefix):
                i = int(name[len(prefix):].split(".", 1)[0])
                per_layer.setdefault(i, []).append((name, stored))
            else:
                _assign(hf, name, files.get(stored).float().to(device), "Hugging Face")
        if cfg.tie_word_embeddings:
            hf.get_output_embeddings().weight = hf.get_input_embeddings().weight
        layers = _hf_layers(hf)
        layer_names = {f"{prefix}{i}." + n for i in range(len(layers)) for n, _ in layers[i].named_parameters()}
        empty = [n for n in _still_empty(hf) if n not in layer_names]
        if empty:
            raise HFUnsupported(f"{hf_dir} lacks " + ", ".join(empty[:8]))

        def pre(i: int) -> Callable[..., None]:
            def hook(m: Any, args: Any) -> None:
                for name, stored in per_layer.get(i, []):
                    _assign(m, name[len(f"{prefix}{i}."):], files.get(stored).float().to(device), "Hugging Face")
                missing = _still_empty(m)
                if missing:
                    raise HFUnsupported(f"{hf_dir} lacks " + ", ".join(f"{prefix}{i}.{n}" for n in missing[:8]))
            return hook

        def post(m: Any, a: Any, o: Any) -> None:
            outputs.append(_first(o).detach())
            _release(m)

        hooks = []
        for i, layer in enumerate(layers):
            hooks.append(layer.register_forward_pre_hook(pre(i)))
            hooks.append(layer.register_forward_hook(post))
    with torch.no_grad():
        logits = hf(input_ids=tokens.to(device)).logits.float()
    for h in hooks:
        h.remove()
    vocab = hf.config.vocab_size
    del hf
    return logits, vocab


def _run_megatron(model: dict[str, Any], source: Any, padded: int, tokens: Any, device: str, round_to: Any,
                  layer_by_layer: bool, outputs: list[Any]) -> Any:
    import torch

    def prep(t: Any) -> Any:
        return (t.to(round_to) if round_to is not None else t).float().to(device)

    with megatron_process(device):
        if not layer_by_layer:
            gpt = build_gpt_model(model, padded)
            load_megatron_weights(gpt, source, round_to)
            gpt.eval().to(device)
            hooks = [layer.register_forward_hook(
                lambda m, a, o: outputs.append(_first(o).detach().transpose(0, 1))) for layer in gpt.decoder.layers]
        else:
            with empty_params():
                gpt = build_gpt_model(model, padded, initialize=False)
            gpt.eval()
            per_layer: dict[int, list[tuple[str, Callable[[], Any]]]] = {}
            n_layers = len(gpt.decoder.layers)
            for key in source.keys():
                if "_extra_state" in key or not key.startswith(MODEL_PREFIXES):
                    continue
                if not key.startswith("decoder.layers."):
                    _assign(gpt, module_key(key), prep(source.load(key)), "checkpoint")
                    continue
                base, i = stacked_key(key)
                rest = base[len("decoder.layers."):]
                if i is not None:
                    per_layer.setdefault(i, []).append((rest, lambda key=key: source.load(key)))
                else:
                    for j in range(n_layers):
                        per_layer.setdefault(j, []).append((rest, lambda key=key, j=j: _load_layer(source, key, j)))
            layer_names = {f"decoder.layers.{j}." + n for j in range(n_layers)
                           for n, _ in gpt.decoder.layers[j].named_parameters()}
            empty = [n for n in _still_empty(gpt) if n not in layer_names]
            if empty:
                raise HFUnsupported("the Megatron weights lack " + ", ".join(empty[:8]))

            def pre(j: int) -> Callable[..., None]:
                def hook(m: Any, args: Any, kwargs: Any) -> None:
                    for rest, fn in per_layer.get(j, []):
                        _assign(m, module_key(rest), prep(fn()), "checkpoint")
                    missing = _still_empty(m)
                    if missing:
                        raise HFUnsupported("the Megatron weights lack "
                                            + ", ".join(f"decoder.layers.{j}.{n}" for n in missing[:8]))
                return hook

            def post(m: Any, a: Any, o: Any) -> None:
                outputs.append(_first(o).detach().transpose(0, 1))  # megatron's [s, b, h] -> [b, s, h]
                _release(m)

            hooks = []
            for j, layer in enumerate(gpt.decoder.layers):
                hooks.append(layer.register_forward_pre_hook(pre(j), with_kwargs=True))
                hooks.append(layer.register_forward_hook(post))
        pos = torch.arange(tokens.shape[1], dtype=torch.long).unsqueeze(0).expand_as(tokens)
        with torch.no_grad():
            logits = gpt(tokens.to(device), pos.to(device), None).float()
        for h in hooks:
            h.remove()
        del gpt
    return logits


def compare_logits(hf_dir: str, megatron: Any, batch: Any, device: str = "cpu",
                   layer_by_layer: bool = True) -> ProofResult:
    """Run both models on `batch` (token ids [b, s]) and compare; see the module docstring."""
    import torch

    model = _settings(megatron)
    family = family_of(model)
    tokens = torch.as_tensor(batch, dtype=torch.long)
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    wdtype = _stored_dtype(hf_dir)
    round_to = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(wdtype)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    embed_key = "embedding.word_embeddings.weight"
    padded = (megatron.shape(embed_key) if hasattr(megatron, "shape") else tuple(megatron.load(embed_key).shape))[0]
    if int(tokens.max()) >= padded:
        raise HFUnsupported(f"batch token {int(tokens.max())} is outside the vocabulary ({padded})")

    hf_out: list[Any] = []
    meg_out: list[Any] = []
    hf_logits, vocab = _run_hf(hf_dir, family, tokens, device, layer_by_layer, hf_out)
    if int(tokens.max()) >= vocab:
        raise HFUnsupported(f"batch token {int(tokens.max())} is outside the vocabulary ({vocab})")
    meg_logits = _run_megatron(model, megatron, padded, tokens, device, round_to, layer_by_layer, meg_out)
    meg_logits = meg_logits[..., :vocab]

    per_layer = [float((a.float() - b.float()).abs().max()) for a, b in zip(meg_out, hf_out)]
    # Each layer's output is held to the tolerance at its own scale: a wrong weight whose effect a
    # later norm cancels (a constant shift before the final LayerNorm) leaves the logits equal but
    # not the layer, and the conversion is still wrong.
    layer_tols = [max(ABS_TOL, REL_TOL * float(b.float().abs().max())) for b in hf_out]
    diff = float((meg_logits - hf_logits).abs().max())
    peak = float(hf_logits.abs().max())
    tol = max(ABS_TOL, REL_TOL * peak)
    bad = next((i for i, (d, t) in enumerate(zip(per_layer, layer_tols)) if not d <= t), None)  # NaN: not <=
    ok = diff <= tol and bad is None  # NaN compares False
    notes = []
    if bad is not None:
        notes.append(f"first layer over the tolerance: {bad} ({per_layer[bad]:.3g} > {layer_tols[bad]:.3g}, "
                     "its own output's scale x the relative tolerance)")
    elif not ok:
        notes.append("every layer within the tolerance: the difference is in the final norm or output layer")
    return ProofResult(max_abs_diff=diff, per_layer=per_layer, tolerance=tol, ok=ok, max_abs_logit=peak,
                       family=family, device=device, batch_shape=tuple(tokens.shape), weights_dtype=wdtype,
                       notes=notes)
