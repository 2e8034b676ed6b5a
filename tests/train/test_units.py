"""The trainer's pure pieces: settings from a plan, rank variables, sample order, FLOPs, versions."""

from __future__ import annotations

import os
import signal

import pytest

from lingjun_slurm.injob.train import TrainError
from lingjun_slurm.injob.train.data import Batches, check_prefix, dataset_tokenizer
from lingjun_slurm.injob.train.loop import StopFlag
from lingjun_slurm.injob.train.metrics import flops_per_sample, peak_tflops
from lingjun_slurm.injob.train.model import padded_vocab_size
from lingjun_slurm.injob.train.optim import scheduler_steps
from lingjun_slurm.injob.train.runtime import dist_env
from lingjun_slurm.injob.train.settings import from_plan

from .helpers import base_plan


@pytest.fixture
def plan() -> dict:
    return base_plan()


def test_settings_from_the_example_plan(plan: dict) -> None:
    s = from_plan(plan)
    assert s.model.num_layers == 2 and s.model.hidden_size == 64 and s.model.num_query_groups == 4
    assert s.parallel.global_batch == 8 and s.training.recompute.granularity is None
    assert s.checkpoint.dir == "/tmp/lingjun-slurm/tiny-gpt/checkpoints" and s.checkpoint.save_interval == 20
    assert s.data.prefix == "/tmp/lingjun-slurm/tiny-gpt/data/corpus_text_document"
    assert s.metrics_path == "/tmp/lingjun-slurm/tiny-gpt/runs/tiny-gpt/metrics.jsonl"


@pytest.mark.parametrize("change, message", [
    (lambda s: s["parallelism"].update(tensor=3), "divisible by tensor parallel 3"),
    (lambda s: s["parallelism"].update(pipeline=3), "divisible by pipeline parallel 3"),
    (lambda s: s["parallelism"].update(sequence_parallel=True), "sequence_parallel needs tensor parallel > 1"),
    (lambda s: s["training"].update(lr_decay_style="exotic"), "lr_decay_style 'exotic'"),
    (lambda s: s["data"].update(train_prefix=None, prefix=None), "no train_prefix"),
    (lambda s: s.pop("model"), "settings.model is missing"),
])
def test_settings_errors(plan: dict, change, message: str) -> None:
    change(plan["settings"])
    with pytest.raises(TrainError, match=message):
        from_plan(plan)


def test_rank_variables() -> None:
    assert dist_env({}) == dist_env({"RANK": "0", "WORLD_SIZE": "1"})
    env = dist_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port) == (3, 4, 1, "n1", 29500)
    # srun without the task wrapper (the local launcher, a bare srun)
    env = dist_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"})
    assert (env.rank, env.world_size, env.local_rank) == (1, 2, 1)
    with pytest.raises(TrainError, match="needs MASTER_ADDR and MASTER_PORT"):
        dist_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(TrainError, match="outside the world size"):
        dist_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    with pytest.raises(TrainError, match="not an integer"):
        dist_env({"RANK": "x"})


class _Dataset:
    def __len__(self) -> int:
        return 1000


def test_sample_order_is_megatrons() -> None:
    """MegatronPretrainingSampler: each mbs x dp slice of the global batch, rank r takes the r-th mbs."""
    b0, b1 = (Batches(_Dataset(), micro_batch=2, dp=2, dp_rank=r, device=None) for r in (0, 1))
    # global batch 8 = 2 micro-batches x (2 samples x 2 ranks), after 16 consumed samples
    assert [b0.indices(16, m) for m in (0, 1)] == [[16, 17], [20, 21]]
    assert [b1.indices(16, m) for m in (0, 1)] == [[18, 19], [22, 23]]
    assert b0.indices(998, 0) == [998, 999] and b1.indices(998, 0) == [0, 1]  # wraps (extra epochs)


def test_padded_vocab_and_scheduler_steps(plan: dict) -> None:
    assert padded_vocab_size(513, 1) == 640 and padded_vocab_size(513, 2) == 768
    assert padded_vocab_size(50257, 1) == 50304  # GPT-2, as Megatron-LM pads it
    s = from_plan(plan)
    assert scheduler_steps(s) == {"lr_warmup_steps": 32, "lr_decay_steps": 320, "wd_incr_steps": 320,
                                  "wsd_decay_steps": None}
    plan["settings"]["training"].update(lr_warmup_iters=40)
    with pytest.raises(TrainError, match="must be below the decay iterations"):
        scheduler_steps(from_plan(plan))


def test_flops_and_peak() -> None:
    from lingjun_slurm.injob.train.settings import ModelSettings

    m = ModelSettings(num_layers=24, hidden_size=2048, num_attention_heads=16, num_query_groups=16,
                      ffn_hidden_size=8192, seq_length=2048, max_position_embeddings=2048, vocab_size=None)
    # Megatron-LM's formula by hand: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for a GPT-3 style model
    expected = 72 * 2048 * 24 * 2048 ** 2 * (1 + 2048 / (6 * 2048) + 50304 / (12 * 24 * 2048))
    assert flops_per_sample(m, 50304) == pytest.approx(expected)
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 and peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("Tesla T4") is None and peak_tflops(None) is None


def test_tokenizer_facts_match_preprocessing(plan: dict) -> None:
    tok = dataset_tokenizer(plan["settings"]["data"]["tokenizer"])
    assert (tok.vocab_size, tok.eod, tok.pad) == (513, 512, -1)  # Megatron's NullTokenizer: eod = vocab_size
    with pytest.raises(TrainError, match="tokenizer"):
        dataset_tokenizer({"type": "gpt2-bpe", "vocab_file": "/nope/vocab.json", "merge_file": "/nope/merges.txt"})


def test_missing_prefix_message(tmp_path) -> None:
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(TrainError, match=r"x \(.bin/.idx\) is missing: .*x.idx not found"):
        check_prefix(str(tmp_path / "x"))


def test_sigterm_sets_the_stop_flag() -> None:
    flag = StopFlag()
    flag.install()
    try:
        assert not flag.set
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.set and flag.signum == signal.SIGTERM
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGTERM) is not flag._handler


def test_version_floor_message(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core")
    import megatron.core.package_info as info

    from lingjun_slurm.injob.train.entry import check_versions

    assert check_versions()["megatron-core"] == info.__version__
    monkeypatch.setattr(info, "__version__", "0.15.2")
    with pytest.raises(TrainError, match=r"megatron-core 0.15.2 is too old: .* >= 0.16.1"):
        check_versions()


def test_untracked_iteration_directories_are_never_deleted(tmp_path) -> None:
    """No tracker: an incomplete iteration directory (a first save that died) is moved aside, kept,
    and training starts from scratch; a complete one (metadata.json) is resumed from. Never a start
    from 0 that would later delete iter_0000100 as an 'unfinished save'."""
    from lingjun_slurm.injob.train.ckpt import latest

    assert latest(str(tmp_path / "none")) is None
    assert latest(str(tmp_path)) is None  # empty directory: a fresh start
    (tmp_path / "iter_0000100").mkdir()
    (tmp_path / "iter_0000100" / "__0_0.distcp").write_bytes(b"half")
    assert latest(str(tmp_path)) is None
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("iter_0000100.incomplete-")]
    assert (aside / "__0_0.distcp").read_bytes() == b"half"
    (tmp_path / "iter_0000050").mkdir()
    (tmp_path / "iter_0000050" / "metadata.json").write_text("{}")
    assert latest(str(tmp_path)) == 50 and (tmp_path / "iter_0000050").is_dir()
