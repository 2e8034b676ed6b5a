"""The memory model against megatron-core itself on the CPU (issue 16 item 2): parameters,
gradient buffer and Adam state bytes exactly, and the activations autograd keeps (its
saved-tensor hooks) exactly, for the CPU's kernels (fp32, megatron-core's local attention,
unfused SwiGLU, dropout masks in fp32: lingjun_slurm.planner.memory `cpu=True`).

One child interpreter builds every model (a world of 1, gloo) and prints what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from lingjun_slurm.planner.memory import (Layout, Recompute, Shape, layer_activations, stage_activations,
                                          stage_parameters)

from .helpers import REPO, stage_env

# name -> (Shape fields, micro batch, recompute granularity/method/num_layers)
CASES: dict[str, tuple[dict[str, Any], int, tuple[Any, Any, Any]]] = {
    "gelu-layernorm-bias-dropout": (dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=256), 2,
                                    (None, None, None)),
    "swiglu-rmsnorm-untied-no-dropout": (dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=176,
                                              swiglu=True, normalization="RMSNorm", bias_linear=False,
                                              untie_embeddings=True, hidden_dropout=0.0, attention_dropout=0.0),
                                         1, (None, None, None)),
    "gqa": (dict(hidden_size=64, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=256), 2,
            (None, None, None)),
    "rope": (dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, learned_position_embeddings=False),
             2, (None, None, None)),
    "selective-recompute": (dict(hidden_size=96, num_attention_heads=6, ffn_hidden_size=384), 2,
                            ("selective", None, None)),
    # no dropout: on the CPU torch's unfused dropout inside the checkpointed (no-grad) forward still
    # hands its mask to the saved-tensor hooks, though no graph keeps it
    "full-recompute-uniform": (dict(hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, hidden_dropout=0.0,
                                    attention_dropout=0.0), 2, ("full", "uniform", 1)),
}
SEQ, VOCAB = 32, 256

CHILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from lingjun_slurm.injob.train import cpu_compat

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    cpu_compat.activate()
    model_parallel_cuda_manual_seed(1)
    cases, seq, vocab = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

    def model(c, layers, dtype=torch.float32):
        shape = c["shape"]
        rc = c["recompute"]
        cfg = TransformerConfig(
            num_layers=layers, hidden_size=shape["hidden_size"], num_attention_heads=shape["num_attention_heads"],
            num_query_groups=shape.get("num_query_groups"), ffn_hidden_size=shape["ffn_hidden_size"],
            normalization=shape.get("normalization", "LayerNorm"),
            activation_func=F.silu if shape.get("swiglu") else F.gelu, gated_linear_unit=shape.get("swiglu", False),
            add_bias_linear=shape.get("bias_linear", True), hidden_dropout=shape.get("hidden_dropout", 0.1),
            attention_dropout=shape.get("attention_dropout", 0.1), use_cpu_initialization=True, params_dtype=dtype,
            bf16=dtype == torch.bfloat16, pipeline_dtype=dtype,
            recompute_granularity=rc[0], recompute_method=rc[1], recompute_num_layers=rc[2])
        return cfg, GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(
            normalization=shape.get("normalization", "LayerNorm")), vocab_size=vocab, max_sequence_length=seq,
            share_embeddings_and_output_weights=not shape.get("untie_embeddings", False),
            position_embedding_type="learned_absolute" if shape.get("learned_position_embeddings", True) else "rope")

    def saved(c, layers):
        _, m = model(c, layers)
        m.train()
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        seen = {}
        def pack(t):
            key = t.untyped_storage().data_ptr()
            if t.is_floating_point() and key not in params:
                seen[key] = t.untyped_storage().nbytes()
            return t
        b = c["micro_batch"]
        tokens = torch.randint(0, vocab, (b, seq))
        pos = torch.arange(seq).unsqueeze(0).expand(b, seq)
        mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).logical_not().view(1, 1, seq, seq)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(tokens, pos, mask, labels=tokens)
        return sum(seen.values()), sum(p.numel() for p in m.parameters())

    out = {}
    for name, c in cases.items():
        one, params1 = saved(c, 1)
        two, params2 = saved(c, 2)
        out[name] = {"saved_1_layer": one, "saved_2_layers": two, "parameters_2_layers": params2}
    # bf16 weights, fp32 grad buffer, Adam's fp32 master + two moments: what megatron-core allocates
    cfg, m = model(cases["gelu-layernorm-bias-dropout"], 2, torch.bfloat16)
    ddp = DistributedDataParallel(config=cfg, module=Float16Module(cfg, m), ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=False))
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True), [ddp])
    for p in ddp.parameters():
        p.main_grad.fill_(0.01)
    opt.step()
    inner = opt.chained_optimizers[0] if hasattr(opt, "chained_optimizers") else opt
    state = 0
    for group in inner.optimizer.param_groups:
        for p in group["params"]:
            state += p.numel() * p.element_size()
            state += sum(v.numel() * v.element_size() for v in inner.optimizer.state[p].values()
                         if torch.is_tensor(v) and v.dim() > 0)
    out["bf16-adam"] = {"parameters": sum(p.numel() for p in ddp.parameters()),
                        "weight_bytes": sum(p.numel() * p.element_size() for p in ddp.parameters()),
                        "grad_bytes": sum(b.grad_data.numel() * b.grad_data.element_size() for b in ddp.buffers),
                        "optimizer_bytes": state}
    print("RESULT " + json.dumps(out))
""")


def _shape(fields: dict[str, Any], layers: int) -> Shape:
    return Shape(num_layers=layers, seq_length=SEQ, padded_vocab_size=VOCAB, **fields)


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    cases = {name: {"shape": f, "micro_batch": b, "recompute": list(rc)} for name, (f, b, rc) in CASES.items()}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), str(SEQ), str(VOCAB)], capture_output=True,
                          text=True, timeout=300, env=stage_env(), cwd=str(REPO))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("name", list(CASES))
def test_parameters_exactly(measured: dict[str, Any], name: str) -> None:
    fields, _, _ = CASES[name]
    assert stage_parameters(_shape(fields, 2), Layout(), 0) == measured[name]["parameters_2_layers"]


@pytest.mark.parametrize("name", list(CASES))
def test_one_layers_activations_exactly(measured: dict[str, Any], name: str) -> None:
    """A second layer adds exactly what layer_activations says (CPU kernels, fp32, local attention)."""
    fields, micro, rc = CASES[name]
    got = measured[name]["saved_2_layers"] - measured[name]["saved_1_layer"]
    layout = Layout(micro_batch=micro)
    if rc[0] == "full":  # uniform, one layer per chunk: the layer's input is all a layer keeps
        assert got == 4 * SEQ * micro * fields["hidden_size"]
        return
    assert got == layer_activations(_shape(fields, 1), layout, "fp32", "local", rc[0] == "selective", cpu=True)


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][2][0] != "full"])
def test_the_whole_forward_pass_exactly(measured: dict[str, Any], name: str) -> None:
    """Embedding, layers, final norm and the loss: every floating-point tensor autograd keeps."""
    fields, micro, rc = CASES[name]
    terms = stage_activations(_shape(fields, 1), Layout(micro_batch=micro), Recompute(rc[0], rc[1], rc[2]), "fp32",
                              "local", 0, cpu=True)
    assert sum(terms.values()) == measured[name]["saved_1_layer"]


def test_weights_gradients_and_adam_state_bytes(measured: dict[str, Any]) -> None:
    """bf16: 2 bytes of weights, 4 of fp32 gradient buffer, 12 of Adam state per parameter."""
    got = measured["bf16-adam"]
    n = stage_parameters(_shape(CASES["gelu-layernorm-bias-dropout"][0], 2), Layout(), 0)
    assert got["parameters"] == n
    assert (got["weight_bytes"], got["grad_bytes"], got["optimizer_bytes"]) == (2 * n, 4 * n, 12 * n)
