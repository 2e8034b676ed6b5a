"""hf_io (sharded safetensors, read back by the real safetensors library) and megatron_io.MegatronSource
(torch_dist read a global tensor at a time, without a process group) on the builtin's checkpoints and
on Megatron-LM's own (tests/fixtures/megatron/checkpoints, SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("megatron.core")

from lingjun_slurm.injob.checkpoint.errors import CheckpointError, CheckpointUsageError  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.hf_io import INDEX, SafetensorsReader, ShardedWriter  # noqa: E402
from lingjun_slurm.injob.checkpoint.hf.megatron_io import MegatronSource  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "megatron" / "checkpoints"


def _tensors() -> dict[str, "torch.Tensor"]:
    gen = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(64, 32, generator=gen),  # 8192 bytes
            "b.weight": torch.randn(16, 16, generator=gen).to(torch.bfloat16),  # 512
            "c.ids": torch.arange(10, dtype=torch.int64),  # 80
            "d.big": torch.randn(200, 20, generator=gen),  # 16000 > max: a shard alone
            "e.bias": torch.randn(7, generator=gen)}


def test_sharded_writer_is_read_back_by_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    tensors = _tensors()
    writer = ShardedWriter(tmp_path, max_shard_bytes=9000)
    for name, t in tensors.items():
        writer.write(name, t)
    files = writer.close()
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert shards == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert files == shards + [INDEX]
    assert not list(tmp_path.glob(".shard-*"))  # the data files are gone
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    # a.weight + b + c fit under 9000 bytes; d.big alone; e.bias after it
    assert index["weight_map"] == {"a.weight": shards[0], "b.weight": shards[0], "c.ids": shards[0],
                                   "d.big": shards[1], "e.bias": shards[2]}
    for name, t in tensors.items():
        with safe_open(str(tmp_path / index["weight_map"][name]), framework="pt") as fh:
            got = fh.get_tensor(name)
            assert fh.metadata() == {"format": "pt"}
        assert got.dtype == t.dtype and torch.equal(got, t), name
    reader = SafetensorsReader(tmp_path)
    assert sorted(reader.keys()) == sorted(tensors)
    assert reader.shape("a.weight") == (64, 32) and torch.equal(reader("b.weight"), tensors["b.weight"])


def test_reader_of_a_single_file_and_refusals(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"x": torch.ones(3)}, str(tmp_path / "model.safetensors"))  # the real library's output
    reader = SafetensorsReader(tmp_path)
    assert reader.keys() == ["x"] and torch.equal(reader("x"), torch.ones(3))
    with pytest.raises(CheckpointError, match="has no tensor y"):
        reader("y")
    other = tmp_path / "bin"
    other.mkdir()
    (other / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"found pytorch_model\.bin: only safetensors is read"):
        SafetensorsReader(other)
    writer = ShardedWriter(tmp_path)
    writer.write("x", torch.ones(1))
    with pytest.raises(CheckpointError, match="written twice"):
        writer.write("x", torch.ones(1))
    writer.abort()
    assert not list(tmp_path.glob(".shard-*"))


@pytest.mark.parametrize("layout", ["core_v0.16.1/tp2", "core_v0.16.1/pp2", "core_v0.19.0/tp2",
                                    "main-d98e8a64ddf3/pp2"])
def test_megatron_source_reads_megatron_lm_checkpoints(layout: str) -> None:
    """Megatron-LM's own TP=2 / PP=2 saves: global shapes, a layer alone equals the whole tensor's slice."""
    src = MegatronSource.open(FIXTURES / layout)
    assert src.iteration == 3 and src.path.name == "iter_0000003"
    keys = src.keys()
    assert "decoder.layers.self_attention.linear_qkv.weight" in keys
    assert not [k for k in keys if k.startswith(("optimizer.", "rng_state")) or "_extra_state" in k]
    assert src.shape("decoder.layers.self_attention.linear_qkv.weight") == (2, 96, 32)
    assert src.padded_vocab == (256 if layout.endswith("tp2") else 128)
    for key in keys:
        whole = src.load(key)
        assert tuple(whole.shape) == src.shape(key)
        if src.num_layers(key):
            for i in range(src.num_layers(key)):
                assert torch.equal(src.load(key, i), whole[i]), (key, i)
    assert src.model["num_attention_heads"] == 4 and src.model["normalization"] == "LayerNorm"
    assert src.model["activation"] == "gelu" and src.missing_settings() == []


def test_vocabulary_follows_the_writers_null_tokenizer() -> None:
    """--vocab-size 127 (<= 0.17: + 1 eod id) and 128 (>= 0.18: eod inside) both mean 128 ids."""
    old = MegatronSource.open(FIXTURES / "core_v0.16.1" / "single")
    new = MegatronSource.open(FIXTURES / "core_v0.19.0" / "single")
    assert old.vocab_size()[0] == 128 and new.vocab_size()[0] == 128
    assert old.notes == []
    # a newer megatron-core's class in the args is said, not taken for damage
    assert any("InferenceCudaGraphScope" in n and "newer megatron-core" in n for n in new.notes)


def test_megatron_source_on_the_builtin_checkpoints(megatron_checkpoints: Path) -> None:
    src = MegatronSource.open(megatron_checkpoints)
    assert src.iteration == 30 and src.path.name == "iter_0000030"
    assert src.missing_settings() == ["num_attention_heads", "num_query_groups"]  # its args lack them
    src = MegatronSource.open(megatron_checkpoints, iteration=10, model={"num_attention_heads": 4})
    assert src.iteration == 10 and src.missing_settings() == []
    assert src.model["num_query_groups"] == 4 and src.model["ffn_hidden_size"] == 128
    # GPTModel's share_embeddings_and_output_weights defaults to False: output_layer.weight is there
    assert src.model["untie_embeddings"] is True and src.model["bias_linear"] is True
    with pytest.raises(CheckpointError, match="iter_0000015 does not exist"):
        MegatronSource.open(megatron_checkpoints, iteration=15)
    with pytest.raises(CheckpointUsageError, match="no such directory"):
        MegatronSource.open(megatron_checkpoints / "nope")
