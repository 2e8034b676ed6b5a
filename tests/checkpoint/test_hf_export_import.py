"""checkpoint export / import (issue 29): real torch_dist checkpoints (the builtin's make_checkpoints
fixture, Megatron-LM's own saves in tests/fixtures/megatron, TP=2 / PP=2 saves made here by megatron-core
in 2 gloo processes) and tiny Hugging Face models made from transformers configs (hf_models.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("megatron.core")

from click.testing import CliRunner  # noqa: E402

from lingjun_slurm.cli.checkpoint import checkpoint  # noqa: E402
from lingjun_slurm.common.errors import LingjunError  # noqa: E402
from lingjun_slurm.injob.checkpoint.errors import CheckpointError  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf import mapping  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.export import export_checkpoint  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.hf_io import SafetensorsReader  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.importer import import_checkpoint  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.megatron_io import MegatronSource  # noqa: E402

from .hf_models import gpt2_model, llama_model, save  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "megatron" / "checkpoints"


def cli(*args: Any) -> tuple[int, str]:
    result = CliRunner().invoke(checkpoint, [str(a) for a in args])
    if isinstance(result.exception, LingjunError):
        return result.exception.exit_code, str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name)


def hf_tensors(path: Path) -> dict[str, Any]:
    return dict(SafetensorsReader(path).tensors())


# ---- export --------------------------------------------------------------------------------------------


def test_export_builtin_checkpoint_loads_offline(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = export_checkpoint(ckpt, out, dtype="fp32", model={"num_attention_heads": 4})
    assert result.proof.ok and result.proof.max_abs_diff <= 1e-4 and len(result.proof.per_layer) == 2
    text = "\n".join(result.lines())
    assert "max |logit difference| = " in text and "iteration 30" in text
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json",
                                                     "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["activation_function"] == "gelu" and cfg["vocab_size"] == 128 and cfg["tie_word_embeddings"] is False
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert type(model).__name__ == "GPT2LMHeadModel"
    # fp32: the written tensors are the checkpoint's, bit for bit
    src = MegatronSource.open(ckpt)
    assert torch.equal(model.transformer.wpe.weight, src.load("embedding.position_embeddings.weight"))
    assert leftovers(tmp_path) == []


def test_export_copies_the_tokenizer(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import AutoTokenizer

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(127)} | {"[UNK]": 127}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                "unk_token": "[UNK]"}))
    code, text = cli("export", ckpt, "--to", "huggingface", tmp_path / "hf", "--tokenizer", tok_dir, "--no-check",
                     "--spec", _fixture_spec(tmp_path))
    assert code == 0, text
    assert "tokenizer: copied tokenizer.json, tokenizer_config.json from" in text
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert loaded("w3 w5")["input_ids"] == [3, 5]
    code, text = cli("export", ckpt, "--to", "huggingface", tmp_path / "hf2", "--tokenizer", tmp_path / "none",
                     "--spec", _fixture_spec(tmp_path))
    assert code == 2 and "no such tokenizer directory" in text and leftovers(tmp_path) == []


def _fixture_spec(tmp_path: Path) -> Path:
    """The tiny-gpt example's spec with make_checkpoints.py's model shape (hidden 32, ffn 128, untied, 128 ids)."""
    spec = tmp_path / "spec.yaml"
    example = (REPO / "examples" / "tiny-gpt.yaml").read_text()
    tiny = "model:\n  preset: tiny\n  vocab_size: 512\n"
    assert tiny in example
    spec.write_text(example.replace(tiny, "model:\n  preset: tiny\n  hidden_size: 32\n  ffn_hidden_size: 128\n"
                                          "  untie_embeddings: true\n  vocab_size: 127\n"))
    return spec


def test_export_cli_text_json_and_refusals(ckpt: Path, tmp_path: Path) -> None:
    code, text = cli("export", ckpt, "--to", "huggingface", tmp_path / "a")
    assert code == 1 and "does not record num_attention_heads, num_query_groups" in text
    assert "Traceback" not in text and not (tmp_path / "a").exists()
    spec = _fixture_spec(tmp_path)  # --spec gives the model
    code, text = cli("export", ckpt, "--to", "huggingface", tmp_path / "a", "--spec", spec, "--dtype", "fp32")
    assert code == 0, text
    assert "vocabulary 128 (padded 128" in text and "max |logit difference| = " in text and " OK" in text
    code, text = cli("export", REPO / "nope", "--to", "huggingface", tmp_path / "b")
    assert code == 2 and "no such directory" in text
    code, text = cli("export", FIXTURES / "core_v0.16.1" / "pp2", "--to", "huggingface", tmp_path / "c", "--json")
    assert code == 0, text
    data = json.loads(text)
    assert data["proof"]["ok"] and data["dtype"] == "bf16" and data["vocab_size"] == 128
    assert data["tokenizer"].startswith("null tokenizer: no tokenizer files")
    code, text = cli("export", FIXTURES / "core_v0.16.1" / "pp2", "--to", "huggingface", tmp_path / "c")
    assert code == 2 and "already exists" in text
    code, text = cli("export", FIXTURES / "core_v0.16.1" / "pp2", "--to", "huggingface", tmp_path / "d",
                     "--no-check", "--max-shard-size", "20kB")
    assert code == 0 and "logits: not checked" in text
    assert len(list((tmp_path / "d").glob("model-*-of-*.safetensors"))) > 1


@pytest.mark.parametrize("layout", ["core_v0.16.1/tp2", "core_v0.16.1/pp2", "core_v0.18.2/tp2",
                                    "main-d98e8a64ddf3/pp2", "builtin-rng-pp-tp-dp/dp2"])
def test_export_megatron_lm_checkpoints(layout: str, tmp_path: Path) -> None:
    """Checkpoints saved by Megatron-LM's own pretrain_gpt.py at TP=2 and PP=2, and by the builtin
    trainer at DP=2 (SOURCES.md)."""
    result = export_checkpoint(FIXTURES / layout, tmp_path / "hf", dtype="fp32")
    assert result.proof.ok and result.proof.max_abs_diff <= 1e-4, result.lines()
    assert result.vocab_size == 128 and result.family == "gpt2"
    if layout.startswith("main-"):  # a newer megatron-core's class in its args: said, and the rest read
        assert any("a newer megatron-core wrote it" in line for line in result.lines())
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["vocab_size"] == 128 and cfg["n_positions"] == 32


def test_failing_proof_leaves_nothing_finished(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = mapping.to_hf

    def off_by_a_bit(family: str, model: dict, name: str, tensor: Any, vocab: int) -> list:
        out = real(family, model, name, tensor, vocab)
        if name == "decoder.layers.1.mlp.linear_fc2.weight":  # noise: a constant shift the final LayerNorm removes
            gen = torch.Generator().manual_seed(0)
            out = [(n, t + 0.05 * torch.randn(t.shape, generator=gen)) for n, t in out]
        return out

    monkeypatch.setattr(mapping, "to_hf", off_by_a_bit)
    with pytest.raises(CheckpointError) as err:
        export_checkpoint(ckpt, tmp_path / "hf", dtype="fp32", model={"num_attention_heads": 4})
    text = str(err.value)
    assert "failed its proof" in text and "MISMATCH" in text and "max |logit difference|" in text
    assert not (tmp_path / "hf").exists() and leftovers(tmp_path) == []
    code, text = cli("export", ckpt, "--to", "huggingface", tmp_path / "hf", "--spec", tmp_path / "missing.yaml")
    assert code != 0 and not (tmp_path / "hf").exists()


# ---- import --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [llama_model, gpt2_model], ids=["llama", "gpt2"])
def test_import_then_export_gives_identical_tensors(make: Any, tmp_path: Path) -> None:
    model, settings = make()
    hf_dir = save(model, tmp_path / "hf")
    result = import_checkpoint(hf_dir, tmp_path / "meg", model=settings)
    assert result.proof.ok and result.proof.max_abs_diff <= 1e-4
    assert (tmp_path / "meg" / "latest_checkpointed_iteration.txt").read_text() == "0"
    src = MegatronSource.open(tmp_path / "meg")
    assert src.iteration == 0 and src.padded_vocab == 128 and src.vocab_size()[0] == 100
    assert not [k for k in src._meta.state_dict_metadata if k.startswith("optimizer.")]
    args = src.args
    assert args.no_save_optim is True and args.num_layers == 2 and args.padded_vocab_size == 128
    back = export_checkpoint(tmp_path / "meg", tmp_path / "back", dtype="fp32")
    assert back.proof.ok
    a, b = hf_tensors(hf_dir), hf_tensors(tmp_path / "back")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert leftovers(tmp_path) == []


def test_import_shape_mismatch_is_named(tmp_path: Path) -> None:
    model, settings = llama_model()
    hf_dir = save(model, tmp_path / "hf")
    wrong = {**settings, "num_layers": 3, "num_query_groups": 4}
    with pytest.raises(CheckpointError) as err:
        import_checkpoint(hf_dir, tmp_path / "meg", model=wrong, where=lambda f: f"spec.yaml:{7 if f == 'num_layers' else 9}")
    text = str(err.value)
    assert f"do not match {hf_dir / 'config.json'}" in text
    assert "spec.yaml:7: model.num_layers is 3, config.json has 2" in text
    assert "spec.yaml:9: model.num_query_groups is 4, config.json has 2" in text
    assert not (tmp_path / "meg").exists() and leftovers(tmp_path) == []
    code, text = cli("import", hf_dir, "--to", "megatron", tmp_path / "meg", "--num-layers", "3")
    assert code == 1 and "--num-layers: model.num_layers is 3, config.json has 2" in text
    assert "Traceback" not in text
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    code, text = cli("import", tmp_path / "bad", "--to", "megatron", tmp_path / "m2")
    assert code == 1 and f"{tmp_path / 'bad' / 'config.json'}: not JSON" in text


def test_import_spec_mismatch_names_the_spec_line(tmp_path: Path) -> None:
    model, _settings = gpt2_model()  # the tiny preset's shape, 2 layers
    hf_dir = save(model, tmp_path / "hf")
    example = (REPO / "examples" / "tiny-gpt.yaml").read_text()
    tiny = "model:\n  preset: tiny\n  vocab_size: 512\n"
    assert tiny in example
    text = example.replace(tiny, "model:\n  preset: tiny\n  num_layers: 3\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    line = text.splitlines().index("  num_layers: 3") + 1
    code, out = cli("import", hf_dir, "--to", "megatron", tmp_path / "meg", "--spec", spec)
    assert code == 1, out
    assert f"{spec}:{line}: model.num_layers is 3, config.json has 2" in out
    assert out.count("model.") == 1 and not (tmp_path / "meg").exists()
    spec.write_text(example.replace(tiny, "model:\n  preset: tiny\n"))  # the same shape: imported
    code, out = cli("import", hf_dir, "--to", "megatron", tmp_path / "meg", "--spec", spec, "--json")
    assert code == 0, out
    assert json.loads(out)["proof"]["ok"] is True


def test_import_failing_proof_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, settings = gpt2_model()
    hf_dir = save(model, tmp_path / "hf")
    real = mapping.to_megatron

    def skewed(family: str, model: dict, get: Any, padded: int) -> Any:
        for key, t in real(family, model, get, padded):
            yield key, (t * 1.01 if key == "decoder.final_layernorm.weight" else t)

    monkeypatch.setattr(mapping, "to_megatron", skewed)
    code, text = cli("import", hf_dir, "--to", "megatron", tmp_path / "meg")
    assert code == 1 and "failed its proof" in text and "MISMATCH" in text
    assert not (tmp_path / "meg").exists() and leftovers(tmp_path) == []


# ---- TP=2 / PP=2 layouts, saved and loaded by megatron-core in 2 gloo processes -------------------------

LAYOUT_SCRIPT = r'''
import argparse, json, os, sys
import torch
import torch.distributed as dist

model, src, dst, tp, pp, rank, store = (json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]),
                                        int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
from lingjun_slurm.injob.train import cpu_compat
cpu_compat.activate()
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=tp * pp)
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
parallel_state.initialize_model_parallel(tp, pp)
model_parallel_cuda_manual_seed(1234)
from lingjun_slurm.injob.checkpoint.hf.megatron_io import build_gpt, megatron_args
from lingjun_slurm.injob.train.ckpt import start_writer_manager
torch.manual_seed(1234)
gpt = build_gpt(model, 128 * tp, pre_process=parallel_state.is_pipeline_first_stage(),
                post_process=parallel_state.is_pipeline_last_stage(), tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp, perform_initialization=True)
if src != "-":  # load the TP=1 checkpoint at this layout
    loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict()}, os.path.join(src, "iter_0000000"))
    gpt.load_state_dict(loaded["model"], strict=True)
start_writer_manager()
path = os.path.join(dst, "iter_0000005")
os.makedirs(path, exist_ok=True)
dist.barrier()
args = megatron_args(model, 128 * tp, tp, pp, model.get("vocab_size"), None)
dist_checkpointing.save({"model": gpt.sharded_state_dict(), "iteration": 5, "checkpoint_version": 3.0,
                         "args": args}, path)
dist.barrier()
if rank == 0:
    open(os.path.join(dst, "latest_checkpointed_iteration.txt"), "w").write("5")
parallel_state.destroy_model_parallel()
dist.destroy_process_group()
'''


def run_layout(tmp_path: Path, model: dict, dst: Path, tp: int, pp: int, src: Path | None = None) -> None:
    script = tmp_path / "layout.py"
    script.write_text(LAYOUT_SCRIPT)
    store = tmp_path / f"store-{dst.name}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(model), str(src or "-"), str(dst), str(tp),
                               str(pp), str(rank), str(store)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in range(tp * pp)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


@pytest.mark.parametrize("make,tp,pp", [(llama_model, 2, 1), (gpt2_model, 1, 2)], ids=["llama-tp2", "gpt2-pp2"])
def test_tp2_pp2_checkpoints_export_with_equal_logits(make: Any, tp: int, pp: int, tmp_path: Path) -> None:
    _model, settings = make()
    settings = {**settings, "norm_epsilon": 1e-5}
    run_layout(tmp_path, settings, tmp_path / "ckpt", tp, pp)
    src = MegatronSource.open(tmp_path / "ckpt")
    assert src.padded_vocab == 128 * tp and src.model["num_query_groups"] == settings["num_query_groups"]
    result = export_checkpoint(tmp_path / "ckpt", tmp_path / "hf", dtype="fp32", model={"vocab_size": 99})
    assert result.proof.ok and result.proof.max_abs_diff <= 1e-4, result.lines()
    assert result.vocab_size == 100


def test_imported_tp1_checkpoint_loads_at_tp2(tmp_path: Path) -> None:
    """torch_dist is layout independent: write_megatron's TP=1 save, loaded by megatron-core at TP=2
    and saved again there, holds the same global tensors."""
    model, settings = llama_model()
    hf_dir = save(model, tmp_path / "hf")
    import_checkpoint(hf_dir, tmp_path / "meg", model=settings, tensor=2, check=False)
    run_layout(tmp_path, {**settings, "norm_epsilon": 1e-5}, tmp_path / "tp2", 2, 1, src=tmp_path / "meg")
    one, two = MegatronSource.open(tmp_path / "meg"), MegatronSource.open(tmp_path / "tp2")
    assert sorted(one.keys()) == sorted(two.keys()) and one.padded_vocab == two.padded_vocab == 256
    for key in one.keys():
        assert torch.equal(one.load(key), two.load(key)), key
