"""The checkpoint stage's export_hf for real (issue 29): the stage, on real torch_dist checkpoints
(tests/checkpoint/make_checkpoints.py), verifies, prunes and then exports the latest iteration
through hf/export.py into <dir>/iter_NNNNNNN, proven by the logits; transformers loads the result."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_checkpoint_stage_exports_the_latest_to_hugging_face(ckpt: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from lingjun_slurm.injob.stages import checkpoint as stage

    out_dir = tmp_path / "hf"
    # make_checkpoints.py's model (128 rows: a null tokenizer of 127 and its eod), as plan.resolve_model
    # gives it (its args record only some of it)
    model = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 4,
             "ffn_hidden_size": 128, "seq_length": 64, "max_position_embeddings": 64, "vocab_size": 127,
             "normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
             "rotary_base": None, "untie_embeddings": True, "bias_linear": True, "hidden_dropout": 0.0,
             "attention_dropout": 0.0}
    plan = {"run_id": "t", "workdir": str(tmp_path), "settings": {"model": model, "checkpoint": {
        "dir": str(ckpt), "verify": True, "keep_last": 2, "copy_to": None,
        "export_hf": {"dir": str(out_dir), "dtype": "fp32", "check": True, "tokenizer_dir": None}}}}
    assert stage.main(plan) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    model_dir = out_dir / "iter_0000030"
    assert (model_dir / "config.json").is_file()
    assert "checkpoint: export: " in out and "max |logit difference|" in out and "OK" in out, out
    assert not list(out_dir.glob("*.partial*"))
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(model_dir))
    # The stage again: that iteration is there; nothing is exported twice.
    assert stage.main(plan) == 0
    assert "already" in capsys.readouterr().out
