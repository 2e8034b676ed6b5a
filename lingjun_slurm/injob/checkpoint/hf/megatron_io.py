"""Megatron torch_dist checkpoints, one global tensor at a time, without a process group.

Reading (MegatronSource). A torch_dist checkpoint (megatron-core dist_checkpointing, sharded_backend
"torch_dist") is a torch.distributed.checkpoint (DCP) directory: ``.metadata`` maps every ShardedTensor's
key to its GLOBAL shape and dtype and the chunks that the ranks wrote (``__R_N.distcp``), whatever TP/PP
layout saved it. megatron-core's own load strategy (dist_checkpointing/strategies/torch.py,
TorchDistLoadShardedStrategy) is torch's ``torch.distributed.checkpoint.load`` with a planner over those
keys, so reading a key into a preallocated tensor of its global shape with
``torch.distributed.checkpoint.load({key: t}, storage_reader=FileSystemReader(dir), no_dist=True)``
(torch/distributed/checkpoint/state_dict_loader.py, torch 2.13: ``no_dist`` "load without a process
group") merges the TP shards and PP stages of that one tensor, and nothing else is read. The layers are
stored stacked: megatron-core's TransformerBlock.sharded_state_dict prepends the layer axis
(``decoder.layers.self_attention.linear_qkv.weight`` is ``[num_layers, ...]``; verified on the builtin's
checkpoints and on Megatron-LM's own in tests/fixtures/megatron/checkpoints, TP=2 and PP=2 included).

The checkpoint's "common" state (``args`` Namespace, ``iteration``, ``checkpoint_version``) is
common.pt (megatron-core <= 0.18, dist_checkpointing/strategies/common.py) or, from core_v0.19.0, the
ShardedObject ``common_state/shard_0_1`` inside the shards (verify.py COMMON_STATE_KEY). It is unpickled
here with an Unpickler that stands in a placeholder for a class this environment lacks (a newer
megatron-core's enum): a newer writer is not damage, and what could not be read is said in ``notes``.
The model settings come from those args (Megatron-LM's names, megatron/training/arguments.py), then from
the tensors' shapes and keys, then from ``model`` given by the caller (the plan's settings.model), which wins.

Writing (write_megatron). A GPTModel built here with TP = PP = 1 (megatron-core local layer spec, one
process, gloo on a HashStore), its parameters set from the tensors, saved with megatron-core's own
``dist_checkpointing.save`` of ``{"model": model.sharded_state_dict(), "iteration": 0, "args": ...,
"checkpoint_version": 3.0}``: the state dict Megatron-LM's generate_state_dict writes
(megatron/training/checkpointing.py core_v0.16.1 :880-911) without optimizer, scheduler and RNG state,
which ``--finetune`` (and ``--no-load-optim --no-load-rng``) never read: the sharded state dict
to load leaves them out when args.finetune or the checkpoint's args.no_save_optim / no_save_rng (written
True here; :1559-1581), the optimizer and RNG loads are skipped with --finetune (:1785, :1841) and
the iteration is 0 (:1731); without --finetune, load_checkpoint's optimizer.load_state_dict fails.
torch_dist is layout independent: a TP=1 save loads at any TP/PP (the vocabulary is padded for the
target TP by the caller). Then the tracker ``latest_checkpointed_iteration.txt`` = ``0``, which
Megatron-LM's read_metadata accepts (``assert iteration > -1 or release``, checkpointing.py :310).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import CheckpointError, CheckpointUsageError
from ..layout import MEGATRON_CONFIG, TRACKER, iter_name

CHECKPOINT_VERSION = 3.0  # Megatron-LM checkpointing.py generate_state_dict (core_v0.16.1 :893)
COMMON = "common.pt"
COMMON_STATE_KEY = "common_state/shard_0_1"  # megatron-core >= 0.19 (verify.py)
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron-LM's --make-vocab-size-divisible-by default (train/model.py)

WORD_EMBEDDINGS = "embedding.word_embeddings.weight"
POSITION_EMBEDDINGS = "embedding.position_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
QKV = "decoder.layers.self_attention.linear_qkv.weight"
PROJ_BIAS = "decoder.layers.self_attention.linear_proj.bias"
FC1 = "decoder.layers.mlp.linear_fc1.weight"
FC2 = "decoder.layers.mlp.linear_fc2.weight"
LN_BIAS = "decoder.layers.self_attention.linear_qkv.layer_norm_bias"
FINAL_LN_BIAS = "decoder.final_layernorm.bias"


def padded_vocab_size(orig: int, tensor_parallel: int, divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's _vocab_size_with_padding (megatron/training/tokenizer/tokenizer.py): up to a multiple
    of divisible_by x TP. The same rule as lingjun_slurm.injob.train.model.padded_vocab_size."""
    multiple = divisible_by * tensor_parallel
    return ((orig + multiple - 1) // multiple) * multiple


# ---- the common state, read leniently ------------------------------------------------------------------


class Unreadable:
    """Stands in for a class the pickle names that this environment lacks (a newer megatron-core's)."""

    missing: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<unreadable {type(self).__qualname__}>"


class _LenientUnpickler(pickle.Unpickler):
    missing: list[str]

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            self.missing.append(f"{module}.{name}")
            return type(name, (Unreadable,), {"__module__": module})


class _LenientPickle:
    """A pickle_module for torch.load: pickle with _LenientUnpickler, the missing names collected."""

    def __init__(self) -> None:
        self.missing: list[str] = []
        outer = self

        class Unpickler(_LenientUnpickler):
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, **k)
                self.missing = outer.missing

        self.Unpickler = Unpickler
        self.load = pickle.load
        self.__name__ = "pickle"


def read_common(iter_dir: Path) -> tuple[dict, list[str]]:
    """(the common state dict, notes). {} with a note when there is none or it cannot be read."""
    import torch

    notes: list[str] = []
    data: bytes | None = None
    path = iter_dir / COMMON
    if path.is_file():
        data = path.read_bytes()
    else:
        from ..verify import _common_state_bytes

        data = _common_state_bytes(iter_dir)
        if data is None:
            return {}, [f"{iter_dir.name}: no {COMMON} and no {COMMON_STATE_KEY}: the model settings come from "
                        "the tensors and the plan"]
    lenient = _LenientPickle()
    try:
        common = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False, pickle_module=lenient)
    except Exception as exc:  # damaged or a format this torch cannot read
        return {}, [f"{iter_dir.name}: cannot read the common state ({type(exc).__name__}: {exc}): the model "
                    "settings come from the tensors and the plan"]
    if lenient.missing:
        notes.append(f"{iter_dir.name}: its common state names classes this environment lacks "
                     f"({', '.join(sorted(set(lenient.missing)))}; a newer megatron-core wrote it): read the rest")
    if isinstance(common, list) and len(common) == 1:  # the ShardedObject's data of megatron-core >= 0.19
        common = common[0]
    if not isinstance(common, dict):
        return {}, notes + [f"{iter_dir.name}: the common state is a {type(common).__name__}, not a dict"]
    return common, notes


# ---- model settings ------------------------------------------------------------------------------------

# Megatron-LM argument names (megatron/training/arguments.py) -> the spec's ModelSpec names.
_ARGS_TO_MODEL = {"num_layers": "num_layers", "hidden_size": "hidden_size",
                  "num_attention_heads": "num_attention_heads", "ffn_hidden_size": "ffn_hidden_size",
                  "seq_length": "seq_length", "max_position_embeddings": "max_position_embeddings",
                  "normalization": "normalization", "rotary_base": "rotary_base",
                  "add_bias_linear": "bias_linear", "layernorm_epsilon": "norm_epsilon",
                  "norm_epsilon": "norm_epsilon", "kv_channels": "kv_channels",
                  "rotary_percent": "rotary_percent", "qk_layernorm": "qk_layernorm",
                  "add_qkv_bias": "add_qkv_bias", "num_experts": "num_experts",
                  "rotary_interleaved": "rotary_interleaved",
                  "apply_residual_connection_post_layernorm": "apply_residual_connection_post_layernorm",
                  "layernorm_zero_centered_gamma": "layernorm_zero_centered_gamma",
                  "use_rope_scaling": "rope_scaling", "rope_scaling_factor": "rope_scaling_factor",
                  "rotary_seq_len_interpolation_factor": "rotary_seq_len_interpolation_factor"}
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
            "normalization", "activation", "position_embedding", "untie_embeddings", "bias_linear")


def model_from_args(args: Any) -> dict[str, Any]:
    """ModelSpec-named settings from a Megatron-LM / builtin args Namespace (only what it has)."""
    if args is None:
        return {}
    a = vars(args) if hasattr(args, "__dict__") else dict(args)
    out: dict[str, Any] = {}
    for src, dst in _ARGS_TO_MODEL.items():
        v = a.get(src)
        if v is not None and not isinstance(v, Unreadable):
            out[dst] = v
    if a.get("swiglu") is not None:
        out["activation"] = "swiglu" if a["swiglu"] else "gelu"
    if a.get("position_embedding_type") is not None:
        out["position_embedding"] = str(a["position_embedding_type"])
    if a.get("untie_embeddings_and_output_weights") is not None:
        out["untie_embeddings"] = bool(a["untie_embeddings_and_output_weights"])
    if a.get("num_attention_heads") is not None:
        groups = a.get("num_query_groups")
        gqa = a.get("group_query_attention")
        # Megatron-LM: num_query_groups counts only with --group-query-attention (arguments.py validate_args)
        out["num_query_groups"] = int(groups) if (gqa or gqa is None) and groups else int(a["num_attention_heads"])
    return out


def model_from_tensors(shapes: dict[str, tuple[int, ...]], known: dict[str, Any]) -> dict[str, Any]:
    """What the keys and global shapes say of the model (used where the args say nothing)."""
    out: dict[str, Any] = {}
    if WORD_EMBEDDINGS in shapes:
        out["hidden_size"] = shapes[WORD_EMBEDDINGS][1]
    if QKV in shapes:
        out["num_layers"] = shapes[QKV][0]
    if FC2 in shapes:
        out["ffn_hidden_size"] = shapes[FC2][-1]
    ffn = known.get("ffn_hidden_size", out.get("ffn_hidden_size"))
    if FC1 in shapes and ffn:
        out["activation"] = "swiglu" if shapes[FC1][1] == 2 * ffn else "gelu"
    out["normalization"] = "LayerNorm" if (LN_BIAS in shapes or FINAL_LN_BIAS in shapes) else "RMSNorm"
    out["position_embedding"] = "learned_absolute" if POSITION_EMBEDDINGS in shapes else "rope"
    if POSITION_EMBEDDINGS in shapes:
        out["max_position_embeddings"] = shapes[POSITION_EMBEDDINGS][0]
    out["untie_embeddings"] = OUTPUT_LAYER in shapes
    out["bias_linear"] = PROJ_BIAS in shapes
    heads = known.get("num_attention_heads")
    hidden = known.get("hidden_size", out.get("hidden_size"))
    if QKV in shapes and heads and hidden:
        kv = known.get("kv_channels") or hidden // heads
        groups, rem = divmod(shapes[QKV][1] // kv - heads, 2)
        if not rem and groups > 0:
            out["num_query_groups"] = groups
    return out


@dataclass
class MegatronSource:
    """One iteration of a torch_dist checkpoint, read a global tensor at a time."""

    path: Path  # the iteration directory
    iteration: int | str | None
    model: dict[str, Any]
    args: Any = None
    common: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _meta: Any = None

    @classmethod
    def open(cls, ckpt_dir: str | os.PathLike, iteration: int | None = None,
             model: dict[str, Any] | None = None) -> "MegatronSource":
        """ckpt_dir: a checkpoint directory (tracker + iter_NNNNNNN/) or one iteration directory.
        model: settings that win over what the checkpoint records (the plan's settings.model)."""
        ckpt = Path(ckpt_dir)
        if not ckpt.exists():
            raise CheckpointUsageError(f"{ckpt}: no such directory")
        if (ckpt / MEGATRON_CONFIG).is_file() and not (ckpt / TRACKER).exists() and iteration is None:
            iter_dir, it = ckpt, None
            from ..layout import ITER_RE

            m = ITER_RE.fullmatch(ckpt.name)
            it = int(m.group(1)) if m else ("release" if ckpt.name == "release" else None)
        else:
            from ..verify import resolve

            iter_dir, it = resolve(ckpt, iteration)
        with _quiet():
            from torch.distributed.checkpoint import FileSystemReader

            try:
                meta = FileSystemReader(str(iter_dir)).read_metadata()
            except Exception as exc:
                from ..verify import version_mismatch

                mismatch = version_mismatch(iter_dir)
                if mismatch is not None:
                    raise CheckpointError(mismatch.line(iter_dir.name)) from None
                raise CheckpointError(f"{iter_dir}: cannot read the torch_dist metadata (.metadata): "
                                      f"{type(exc).__name__}: {exc}") from None
        common, notes = read_common(iter_dir)
        src = cls(path=iter_dir, iteration=common.get("iteration", it) if it != "release" else it, model={},
                  args=common.get("args"), common=common, notes=notes, _meta=meta)
        src.model = src._settings(model or {})
        return src

    def _settings(self, given: dict[str, Any]) -> dict[str, Any]:
        from_args = model_from_args(self.args)
        known = {**from_args, **{k: v for k, v in given.items() if v is not None}}
        from_tensors = model_from_tensors({k: self.shape(k) for k in self.keys()}, known)
        model = {**from_tensors, **known}
        if "num_query_groups" not in model and model.get("num_attention_heads"):
            model["num_query_groups"] = model["num_attention_heads"]
        model.setdefault("seq_length", model.get("max_position_embeddings"))
        if model.get("position_embedding") == "rope" and "rotary_base" not in model:
            model["rotary_base"] = 10000
            self.notes.append("rotary_base is not recorded in the checkpoint: 10000 (Megatron-LM's default) assumed")
        if "norm_epsilon" not in model:
            # the builtin trainer's TransformerConfig(layernorm_epsilon=1e-5) (train/model.py); Megatron-LM's
            # --norm-epsilon default 1e-5 (arguments.py)
            model["norm_epsilon"] = 1e-5
        return model

    def missing_settings(self) -> list[str]:
        return [k for k in REQUIRED if self.model.get(k) is None]

    # -- tensors --
    def keys(self) -> list[str]:
        """The model's tensor keys (global names), without optimizer state, RNG state and extra state."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        return [k for k, v in self._meta.state_dict_metadata.items()
                if isinstance(v, TensorStorageMetadata) and not k.startswith("optimizer.")
                and "_extra_state" not in k and not k.startswith("rng_state")]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._meta.state_dict_metadata[key].size)

    def dtype(self, key: str) -> Any:
        return self._meta.state_dict_metadata[key].properties.dtype

    def nbytes(self, key: str) -> int:
        n = 1
        for d in self.shape(key):
            n *= d
        return n * self.dtype(key).itemsize

    def num_layers(self, key: str) -> int | None:
        """The stacked layer axis's length for a "decoder.layers.*" key, None for other keys."""
        return self.shape(key)[0] if key.startswith("decoder.layers.") else None

    def load(self, key: str, layer: int | None = None) -> Any:
        """The whole global tensor `key`, merged from every rank's chunks, on the CPU; with `layer`,
        only that index of the leading (layer) axis of a stacked "decoder.layers.*" key, read
        alone (torch's create_read_items_for_chunk_list over the saved chunks): memory is one layer's tensor."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        if key not in self._meta.state_dict_metadata:
            raise CheckpointError(f"{self.path}: no tensor {key} in the checkpoint")
        shape = self.shape(key)
        if layer is None:
            out = torch.empty(shape, dtype=self.dtype(key))
            planner = None
        else:
            if not 0 <= layer < shape[0]:
                raise CheckpointError(f"{self.path}: {key} has {shape[0]} layers, not {layer + 1}")
            out = torch.empty((1, *shape[1:]), dtype=self.dtype(key))
            planner = _SlicePlanner(key, (layer, *[0] * (len(shape) - 1)), out.shape)
        with _quiet():
            try:
                dcp.load({key: out}, storage_reader=FileSystemReader(str(self.path)), planner=planner, no_dist=True)
            except BaseException as exc:  # CheckpointException is a BaseException
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                text = " ".join(str(exc).split())[:500]
                raise CheckpointError(f"{self.path}: cannot read {key}: {type(exc).__name__}: {text}") from None
        return out if layer is None else out[0]

    def tensors(self) -> Iterator[tuple[str, Any]]:
        for key in self.keys():
            yield key, self.load(key)

    @property
    def padded_vocab(self) -> int:
        return self.shape(WORD_EMBEDDINGS)[0] if WORD_EMBEDDINGS in self.keys() else self.shape(OUTPUT_LAYER)[0]

    def vocab_size(self) -> tuple[int, str]:
        """(the number of token ids, where that comes from): the tokenizer's, without the padding.
        The null tokenizer: the builtin's (train/data.py) and Megatron-LM <= 0.17's _NullTokenizer have
        --vocab-size + 1 ids (eod = vocab_size); from 0.18 NullTokenizer counts the eod inside --vocab-size
        (lingjun_slurm/megatron/versions.py null_vocab_arg), and those args have null_tokenizer_eod_id
        (seen in tests/fixtures/megatron/checkpoints/core_v0.18.2, absent in core_v0.17.1)."""
        a = vars(self.args) if self.args is not None and hasattr(self.args, "__dict__") else {}
        given = self.model.get("vocab_size")
        if a.get("hf_vocab_size"):  # written by write_megatron: the Hugging Face model's ids
            return int(a["hf_vocab_size"]), "the imported Hugging Face model's vocab_size"
        if a.get("tokenizer_type") == "NullTokenizer" and a.get("vocab_size"):
            n = int(a["vocab_size"])
            if a.get("trainer") != "lingjun_slurm.train" and "null_tokenizer_eod_id" in a:
                return n, f"null tokenizer --vocab-size {n} (Megatron-LM >= 0.18: the eod is inside)"
            return n + 1, f"null tokenizer vocab_size {n} + 1 (eod)"
        if given:
            return int(given) + 1, f"the model's vocab_size {given} + 1 (null tokenizer's eod)"
        return self.padded_vocab, "the checkpoint records no tokenizer vocabulary: kept every padded row"

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())

    def lines(self) -> list[str]:
        return [f"read {self.path} (iteration {self.iteration}): {len(self.keys())} tensors"] + \
            [f"note: {n}" for n in self.notes]


def _slice_planner_class() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class SlicePlanner(DefaultLoadPlanner):
        """Reads one box (offsets, sizes) of one global tensor into a tensor of that box's size
        (torch/distributed/checkpoint/default_planner.py DefaultLoadPlanner, torch 2.13)."""

        def __init__(self, key: str, offsets: tuple[int, ...], sizes: Any) -> None:
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self.key, self.box = key, ChunkStorageMetadata(offsets=torch_size(offsets), sizes=torch_size(sizes))

        def create_local_plan(self) -> Any:
            md = self.metadata.state_dict_metadata[self.key]
            self.plan = LoadPlan(create_read_items_for_chunk_list(self.key, md, [self.box]))
            return self.plan

        def lookup_tensor(self, index: Any) -> Any:
            return self.state_dict[self.key]

    return SlicePlanner


def torch_size(dims: Any) -> Any:
    import torch

    return torch.Size([int(d) for d in dims])


def _SlicePlanner(key: str, offsets: tuple[int, ...], sizes: Any) -> Any:
    return _slice_planner_class()(key, offsets, sizes)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = logging.getLogger("megatron").level
        logging.getLogger("megatron").setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.getLogger("megatron").setLevel(old)


# ---- one process, TP = PP = 1 ---------------------------------------------------------------------------


@contextlib.contextmanager
def single_process() -> Iterator[None]:
    """A 1-rank gloo group on an in-memory store and megatron's parallel state at TP = PP = 1 (what
    tests/checkpoint/make_checkpoints.py does), torn down after; an existing group is reused as it is."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    own = not dist.is_initialized()
    saved = (torch.cuda.synchronize, torch.cuda.current_device)
    if not torch.cuda.is_available():  # megatron's CPU save path calls these (make_checkpoints.py)
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        if own:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            parallel_state.initialize_model_parallel(1, 1)
        elif dist.get_world_size() != 1:
            raise CheckpointError("write_megatron runs in one process: a process group of "
                                  f"{dist.get_world_size()} ranks is already up")
        elif not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        with contextlib.suppress(Exception):
            model_parallel_cuda_manual_seed(1234)
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved  # type: ignore[assignment]
        if own:
            parallel_state.destroy_model_parallel()
            dist.destroy_process_group()


def transformer_config(model: dict[str, Any], dtype: Any = None, **over: Any) -> Any:
    """megatron-core's TransformerConfig for `model` (as train/model.py transformer_config builds it,
    without dropout and parallelism)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    dtype = dtype or torch.float32
    swiglu = model.get("activation") == "swiglu"
    kwargs: dict[str, Any] = dict(
        num_layers=int(model["num_layers"]), hidden_size=int(model["hidden_size"]),
        num_attention_heads=int(model["num_attention_heads"]),
        num_query_groups=int(model.get("num_query_groups") or model["num_attention_heads"]),
        ffn_hidden_size=int(model["ffn_hidden_size"]), kv_channels=model.get("kv_channels"),
        normalization=model.get("normalization") or "LayerNorm",
        layernorm_epsilon=float(model.get("norm_epsilon") or 1e-5),
        activation_func=F.silu if swiglu else F.gelu, gated_linear_unit=swiglu,
        add_bias_linear=bool(model.get("bias_linear", True)),
        add_qkv_bias=bool(model.get("add_qkv_bias", model.get("bias_linear", True))),
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, use_cpu_initialization=True, perform_initialization=False)
    kwargs.update(over)
    return TransformerConfig(**kwargs)


def build_gpt(model: dict[str, Any], padded_vocab: int, dtype: Any = None, pre_process: bool = True,
              post_process: bool = True, **config_over: Any) -> Any:
    """A GPTModel for `model` (megatron-core's local layer spec) inside single_process() (or any
    initialized parallel state: config_over takes tensor/pipeline_model_parallel_size)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    config = transformer_config(model, dtype, **config_over)
    kwargs: dict[str, Any] = {"pre_process": pre_process, "post_process": post_process}
    if model.get("rotary_percent") is not None:
        kwargs["rotary_percent"] = float(model["rotary_percent"])
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(
                        normalization=config.normalization),
                    vocab_size=padded_vocab,
                    max_sequence_length=int(model.get("max_position_embeddings") or model.get("seq_length") or 2048),
                    share_embeddings_and_output_weights=not model.get("untie_embeddings"),
                    position_embedding_type=model.get("position_embedding") or "learned_absolute",
                    rotary_base=int(model.get("rotary_base") or 10000),
                    rope_scaling=bool(model.get("rope_scaling", False)),
                    rope_scaling_factor=float(model.get("rope_scaling_factor") or 8.0), **kwargs)


def set_weights(gpt: Any, tensors: Iterable[tuple[str, Any]]) -> list[str]:
    """Copy checkpoint tensors into `gpt`'s parameters: stacked "decoder.layers.<rest>" keys ([L, ...],
    split per layer) or per-layer "decoder.layers.<i>.<rest>" keys, named as in the checkpoint (the
    local spec's input_layernorm / pre_mlp_layernorm are saved as linear_qkv/linear_fc1.layer_norm_*:
    mapping.module_key). Returns the model's parameters no tensor set (empty when complete). A shape
    that differs is a CheckpointError naming the key and both shapes."""
    import torch

    from .mapping import module_key, stacked_key

    state = {k: v for k, v in gpt.state_dict().items() if "_extra_state" not in k}
    done: set[str] = set()
    with torch.no_grad():
        for key, tensor in tensors:
            stacked, index = stacked_key(key)
            if index is None and key.startswith("decoder.layers."):
                rest = key[len("decoder.layers."):]
                targets = [(f"decoder.layers.{i}.{rest}", tensor[i]) for i in range(tensor.shape[0])]
            else:
                targets = [(key, tensor)]
            for ckpt_name, value in targets:
                name = module_key(ckpt_name)
                if name not in state:
                    raise CheckpointError(f"tensor {ckpt_name} has no place in the model: the settings do not "
                                          "match the weights")
                if tuple(state[name].shape) != tuple(value.shape):
                    raise CheckpointError(f"tensor {ckpt_name}: shape {tuple(value.shape)} but the model's is "
                                          f"{tuple(state[name].shape)}")
                state[name].copy_(value.to(state[name].dtype))
                done.add(name)
    return sorted(set(state) - done)


def megatron_args(model: dict[str, Any], padded_vocab: int, tensor_parallel: int, pipeline: int,
                  vocab_size: int | None, tokenizer_type: str | None) -> argparse.Namespace:
    """vocab_size: the Hugging Face model's ids (recorded as vocab_size and hf_vocab_size; a
    null-tokenizer run of the same vocabulary would say vocab_size - 1, see MegatronSource.vocab_size).
    The args a converted checkpoint records, in Megatron-LM's names (what its --load reads or
    compares: ckpt.py's module docstring lists them; check_checkpoint_args core_v0.16.1 :102-141)."""
    heads = int(model["num_attention_heads"])
    groups = int(model.get("num_query_groups") or heads)
    return argparse.Namespace(
        num_layers=int(model["num_layers"]), hidden_size=int(model["hidden_size"]),
        ffn_hidden_size=int(model["ffn_hidden_size"]), num_attention_heads=heads, num_query_groups=groups,
        group_query_attention=groups != heads, kv_channels=model.get("kv_channels") or int(model["hidden_size"]) // heads,
        seq_length=model.get("seq_length"), max_position_embeddings=model.get("max_position_embeddings"),
        # Megatron-LM's default True whatever the position embedding (arguments.py --no-position-embedding is
        # deprecated); check_checkpoint_args compares it (checkpointing.py core_v0.16.1 :125), as ckpt.py writes it
        add_position_embedding=True,
        position_embedding_type=model.get("position_embedding"), rotary_base=model.get("rotary_base"),
        normalization=model.get("normalization"), layernorm_epsilon=model.get("norm_epsilon", 1e-5),
        norm_epsilon=model.get("norm_epsilon", 1e-5),
        swiglu=model.get("activation") == "swiglu", add_bias_linear=bool(model.get("bias_linear")),
        add_qkv_bias=bool(model.get("add_qkv_bias", model.get("bias_linear"))),
        untie_embeddings_and_output_weights=bool(model.get("untie_embeddings")),
        padded_vocab_size=padded_vocab, vocab_size=vocab_size, tokenizer_type=tokenizer_type,
        make_vocab_size_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        tensor_model_parallel_size=tensor_parallel, pipeline_model_parallel_size=pipeline,
        context_parallel_size=1, data_parallel_size=1, world_size=tensor_parallel * pipeline,
        iteration=0, consumed_train_samples=0, consumed_valid_samples=0, skipped_train_samples=0,
        no_save_optim=True, no_save_rng=True, use_dist_ckpt=True, ckpt_format="torch_dist",
        hf_vocab_size=vocab_size, converted_by="lingjun_slurm.injob.checkpoint.hf")


def write_megatron(out_dir: str | os.PathLike, tensors: Iterable[tuple[str, Any]], model: dict[str, Any],
                   tensor_parallel: int = 1, pipeline: int = 1, iteration: int = 0, *,
                   padded_vocab: int | None = None, vocab_size: int | None = None,
                   tokenizer_type: str | None = None) -> Path:
    """A torch_dist checkpoint of `tensors` (Megatron global keys, vocabulary already padded for
    tensor_parallel) in out_dir/iter_NNNNNNN + tracker; returns the iteration directory.
    tensor_parallel / pipeline are recorded in args (what Megatron-LM's --load compares for its
    RNG/reshard decisions): the files themselves load at any layout."""
    import torch
    from megatron.core import dist_checkpointing

    out = Path(out_dir)
    iter_dir = out / iter_name(iteration)
    if iter_dir.exists():
        raise CheckpointError(f"{iter_dir} already exists")
    tensors = list(tensors)  # a GPTModel of the whole model is built: import holds the model once
    if padded_vocab is None:
        padded_vocab = next(t.shape[0] for k, t in tensors if k in (WORD_EMBEDDINGS, OUTPUT_LAYER))
    with _quiet(), single_process():
        try:
            gpt = build_gpt(model, padded_vocab)
        except (AssertionError, ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"megatron-core refuses the model settings: {type(exc).__name__}: {exc}") from None
        missing = set_weights(gpt, tensors)
        del tensors
        if missing:
            raise CheckpointError(f"no tensor for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
        state = {"model": gpt.sharded_state_dict(), "iteration": iteration, "checkpoint_version": CHECKPOINT_VERSION,
                 "args": megatron_args(model, padded_vocab, tensor_parallel, pipeline, vocab_size, tokenizer_type),
                 "num_floating_point_operations_so_far": 0.0}
        iter_dir.mkdir(parents=True)
        from ...train.ckpt import start_writer_manager

        start_writer_manager()  # a forked result-queue Manager: megatron's own spawns and re-imports __main__
        with torch.no_grad():
            dist_checkpointing.save(state, str(iter_dir))
    (out / TRACKER).write_text(str(iteration))
    return iter_dir
