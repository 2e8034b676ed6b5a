"""Training data: the tokenizer facts GPTDataset needs, GPTDataset over the preprocessed prefix,
and Megatron-LM's sample order (MegatronPretrainingSampler), resumable from consumed samples.

The tokenizer is the one preprocessing used (lingjun_slurm.injob.data.tokenizer): the same vocab
size and end-of-document id, so for `null` vocab_size + 1 tokens with eod = vocab_size
(Megatron's NullTokenizer), for the others the eod of the tokenizer files.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator

from . import TrainError
from .runtime import Runtime
from .settings import TrainSettings

log = logging.getLogger(__name__)

PAD_NONE = -1  # megatron.core.datasets.megatron_dataset._PAD_TOKEN_ID: no real token is padding


def check_prefix(prefix: str) -> None:
    """TrainError naming the prefix when its .bin/.idx pair is missing."""
    missing = [p for p in (f"{prefix}.bin", f"{prefix}.idx") if not os.path.isfile(p)]
    if missing:
        raise TrainError(f"the training data {prefix} (.bin/.idx) is missing: {', '.join(missing)} not found "
                         "(did the preprocess and merge stages run? data.prefix / the merge output)")


@dataclass(frozen=True)
class DatasetTokenizer:
    """The part of a Megatron tokenizer that GPTDataset reads: vocab_size, eod, pad, identifiers."""

    kind: str
    vocab_size: int
    eod: int
    describe: str = ""

    @property
    def pad(self) -> int:
        return PAD_NONE

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict({"class": f"lingjun_slurm.train.data.DatasetTokenizer[{self.kind}]",
                            "vocab_size": self.vocab_size, "eod": self.eod})


def dataset_tokenizer(tok_settings: dict[str, Any]) -> DatasetTokenizer:
    """vocab size and eod from the tokenizer files preprocessing used (no downloads)."""
    from ..data import DataError
    from ..data.tokenizer import TokenizerSpec, build

    try:
        tok = build(TokenizerSpec.from_settings(tok_settings), need_eod=False)
    except DataError as exc:
        raise TrainError(f"tokenizer: {exc}") from None
    # Without an eod (data preprocessed without append_eod) GPTDataset never needs one: the
    # masks only look for it with reset_position_ids / eod_mask_loss, which stay off.
    eod = int(tok.eod) if tok.eod is not None else int(tok.vocab_size)
    return DatasetTokenizer(tok.spec.type, int(tok.vocab_size), eod, tok.describe)


def sample_counts(settings: TrainSettings) -> list[int]:
    """[train, valid, test] samples, as Megatron-LM's build_train_valid_test_datasets asks for them."""
    t, gbs = settings.training, settings.parallel.global_batch
    evals = (t.iterations // t.eval_interval + 1) * t.eval_iters
    return [t.iterations * gbs, evals * gbs, t.eval_iters * gbs]


def build_datasets(settings: TrainSettings, tokenizer: DatasetTokenizer) -> tuple[Any, Any]:
    """(train, valid or None) GPTDatasets; rank 0 builds the index caches first, the others load them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    check_prefix(settings.data.prefix)
    os.makedirs(settings.dataset_cache, exist_ok=True)
    config = GPTDatasetConfig(
        random_seed=settings.training.seed, sequence_length=settings.model.seq_length,
        blend=([settings.data.prefix], None), split=settings.data.split, path_to_cache=settings.dataset_cache,
        tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, mmap_bin_files=True,
    )
    config.split_matrix = _usable_splits(settings.data.prefix, config.split_matrix)
    try:
        train, valid, _test = BlendedMegatronDatasetBuilder(
            GPTDataset, sample_counts(settings), lambda: True, config).build()
    except (AssertionError, ValueError, IndexError) as exc:
        raise TrainError(f"cannot build GPTDataset over {settings.data.prefix} (split {settings.data.split}): "
                         f"{type(exc).__name__}: {exc}") from None
    if train is None:
        raise TrainError(f"the split {settings.data.split} leaves no training documents in {settings.data.prefix}")
    return train, valid


def _usable_splits(prefix: str, split_matrix: list[Any]) -> list[Any]:
    """The split matrix without the test split (never read) and without empty splits.

    megatron-core's GPTDataset loops forever on a split that holds no document
    (_get_num_epochs adds empty epochs until it reaches the requested samples), which a small
    corpus with split 969,30,1 produces: its documents are counted here first, with the
    builder's own rounding.
    """
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    docs = IndexedDataset(prefix, mmap=True).sequence_lengths.shape[0]
    usable = []
    for i, bounds in enumerate(split_matrix):
        if bounds is None or i == 2:
            usable.append(None)
            continue
        beg, end = int(round(bounds[0] * float(docs))), int(round(bounds[1] * float(docs)))
        usable.append(bounds if end > beg else None)
    return usable


class Batches:
    """Micro-batches in MegatronPretrainingSampler's order: global sample `consumed + j` for
    j in the step's global batch, data-parallel rank r takes [r*mbs, (r+1)*mbs) of each
    mbs*dp slice. Deterministic from `consumed` alone, which is what a checkpoint stores."""

    def __init__(self, dataset: Any, micro_batch: int, dp: int, dp_rank: int, device: Any) -> None:
        self.dataset, self.mbs, self.dp, self.dp_rank, self.device = dataset, micro_batch, dp, dp_rank, device

    def indices(self, consumed: int, micro: int) -> list[int]:
        start = consumed + micro * self.mbs * self.dp + self.dp_rank * self.mbs
        n = len(self.dataset)
        return [(start + i) % n for i in range(self.mbs)]

    def micro_batch(self, consumed: int, micro: int) -> dict[str, Any]:
        import torch

        samples = [self.dataset[i] for i in self.indices(consumed, micro)]
        batch = {key: torch.stack([s[key] for s in samples]) for key in ("tokens", "labels", "loss_mask",
                                                                          "position_ids")}
        if self.device.type != "cpu":
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        return batch

    def step(self, consumed: int, num_micro: int) -> Iterator[dict[str, Any]]:
        """The step's micro-batches for this rank, lazily."""
        return (self.micro_batch(consumed, m) for m in range(num_micro))


def context_parallel_slice(batch: dict[str, Any], rt: Runtime) -> dict[str, Any]:
    """With context parallelism each rank keeps its two sequence chunks (megatron's load balancing)."""
    if rt.cp == 1:
        return batch
    from megatron.core.utils import get_batch_on_this_cp_rank

    return get_batch_on_this_cp_rank(batch)


def megatron_loader_draws(rt: Runtime, splits: int) -> None:
    """Consume the default torch (CPU) generator the way Megatron-LM's data iterators do, so that
    the generator state a checkpoint saves (torch_rng_state) is Megatron-LM's.

    pretrain_gpt.py builds its datasets only where is_dataset_built_on_rank() (first or last
    pipeline stage, tensor-parallel rank 0; pretrain_gpt.py:205-211 at core_v0.16.1), after
    load_checkpoint restored the RNG state, and wraps each one in a torch DataLoader
    (training.py build_train_valid_test_data_iterators, :3451-3495); creating an iterator of a
    DataLoader without its own generator draws one int64 from the default generator
    (torch/utils/data/dataloader.py _BaseDataLoaderIter.__init__, its _base_seed). `splits`: the
    DataLoaders Megatron-LM makes on such a rank (train, plus valid and test where they exist).
    Dropout does not see these draws: it draws from the CUDA generator (on the CPU cpu_compat's
    emulated one), as on a GPU, and the losses are the same without them (measured, TP=2). Verified
    with 100,0,0 splits (train only) at core_v0.16.1: with them, the saved RNG state equals
    Megatron-LM's bit for bit on every (pp, tp) rank (tests/train/test_cross_trainer.py)."""
    import torch

    if not ((rt.is_first_stage or rt.is_last_stage) and rt.tp_rank == 0):
        return
    for _ in range(splits):
        torch.empty((), dtype=torch.int64).random_()


def megatron_split_count(settings: TrainSettings, valid: Any) -> int:
    """How many DataLoaders Megatron-LM builds for this run: train, valid (when a validation
    dataset exists) and test (when the split gives it documents and eval_iters > 0; the builtin
    never builds the test split, see _usable_splits)."""
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split

    count = 1 + (valid is not None)
    weights = parse_and_normalize_split(settings.data.split)
    if len(weights) > 2 and weights[2] > 0 and settings.training.eval_iters > 0:
        count += 1
    return count
