"""training.init_from end to end with the builtin trainer (issue 29): a GPT-2-style Hugging Face model
made in the test (random weights, no download) is converted by the train stage's rank 0, loaded with
finetune semantics (iteration 0, fresh optimizer), trained one step at a negligible learning rate and
exported back: every tensor equals the Hugging Face model's. A second start (a requeue) resumes from the
run's own checkpoint and converts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint import hf_models
from tests.train.helpers import make_dataset, make_plan, run_stage, write_plan

pytestmark = pytest.mark.slow


def test_builtin_starts_from_hf_model_and_requeue_resumes_its_own(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    # The tiny preset's shape (hf_models.gpt2_settings), with the vocabulary the trainer uses for the
    # null tokenizer's 512 (513 ids with eod, megatron-core 0.16): both pad it to 640.
    model, _settings = hf_models.gpt2_model(seed=3, vocab_size=513)
    hf_dir = hf_models.save(model, tmp_path / "hf-model")
    prefix = make_dataset(tmp_path / "data" / "corpus")
    plan = make_plan(tmp_path, prefix, iterations=1, save_interval=1, lr=1e-9, min_lr=0.0, weight_decay=0.0)
    plan["settings"]["model"]["vocab_size"] = None
    plan["settings"]["training"]["lr_warmup_iters"] = 0
    plan["settings"]["training"].update(init_from=f"hf:{hf_dir}", init_hf=str(hf_dir),
                                        init_dir=str(tmp_path / "hf-init"))
    path = write_plan(tmp_path, plan)
    first = run_stage(path, timeout=600)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert "init_from: converting" in out and "finetune semantics" in out, out[-4000:]
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"

    from lingjun_slurm.injob.checkpoint.hf.export import export_checkpoint

    export_checkpoint(str(ckpt), str(tmp_path / "back"), iteration=1, dtype="fp32", check=False)
    back: dict[str, torch.Tensor] = {}
    for f in sorted((tmp_path / "back").glob("*.safetensors")):
        back.update(load_file(str(f)))
    want = {k: v for k, v in model.state_dict().items() if k in back}
    assert set(want) == set(back) and len(want) > 10, sorted(set(model.state_dict()) ^ set(back))
    diff = max(float((back[k].float() - want[k].float()).abs().max()) for k in want)
    assert diff < 1e-6, diff  # a step at lr 1e-9; without the load the weights would be the random init

    # The requeue: the run's own checkpoint (iteration 1) is there; nothing is converted again.
    plan["settings"]["training"]["iterations"] = 2
    write_plan(tmp_path, plan)
    second = run_stage(path, timeout=600)
    out2 = second.stdout + second.stderr
    assert second.returncode == 0, out2[-4000:]
    assert "init_from: converting" not in out2 and "finetune semantics" not in out2
    assert "resumed from" in out2 and "iter_0000001" in out2
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
