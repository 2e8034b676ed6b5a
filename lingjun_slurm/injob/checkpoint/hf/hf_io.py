"""Sharded safetensors, written and read one tensor at a time.

The format (https://github.com/huggingface/safetensors, README "Format"; safetensors 0.8 in the venv,
whose safe_open the tests read our files back with): 8 bytes little-endian header length N, N bytes of
JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} (padded with spaces
to a multiple of 8, as safetensors' own writer does), then the tensors' bytes, offsets relative to the
end of the header. Sharding as transformers' save_pretrained does it (modeling_utils.py,
transformers 5.25; huggingface_hub split_torch_state_dict_into_shards): model-0000k-of-0000N.safetensors
and model.safetensors.index.json {"metadata": {"total_size"}, "weight_map": {name: file}}; a shard is
closed before a tensor would take it past max_shard_bytes (a tensor larger than that gets a shard alone).

ShardedWriter keeps no tensor: each one's bytes go to the open shard's data file at once, and the
header is written in front of them when the shard closes (one copy on disk). Memory is the largest
single tensor. Shards are numbered when the last one is closed (the total is not known before).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Iterator

from ..errors import CheckpointError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DEFAULT_MAX_SHARD = 5 * 10**9  # transformers' save_pretrained max_shard_size default "5GB" (decimal)

# torch dtype name -> safetensors dtype (safetensors/src/tensor.rs Dtype; safetensors/torch.py _TYPES)
_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int64": "I64",
           "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def _dtype_code(tensor: Any) -> str:
    name = str(tensor.dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise CheckpointError(f"safetensors has no dtype for {tensor.dtype}")
    return _DTYPES[name]


def _raw(tensor: Any) -> memoryview:
    import torch

    t = tensor.detach().contiguous().cpu()
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # little-endian on every machine torch supports here


class ShardedWriter:
    """write(name, tensor) ... close() -> the files written. Writes into `out` (which must exist)."""

    def __init__(self, out: str | os.PathLike, max_shard_bytes: int = DEFAULT_MAX_SHARD,
                 metadata: dict[str, str] | None = None) -> None:
        self.out = Path(out)
        self.max = int(max_shard_bytes)
        self.metadata = {"format": "pt", **(metadata or {})}
        self._shards: list[tuple[Path, dict[str, Any]]] = []  # (data file, header) per closed shard
        self._header: dict[str, Any] = {}
        self._data: Any = None
        self._size = 0
        self.total = 0
        self.names: set[str] = set()

    def _open(self) -> None:
        path = self.out / f".shard-{len(self._shards) + 1:05d}.data"
        self._data = open(path, "wb")
        self._data_path = path
        self._header, self._size = {}, 0

    def _close_shard(self) -> None:
        if self._data is None:
            return
        self._data.close()
        self._shards.append((self._data_path, self._header))
        self._data = None

    def write(self, name: str, tensor: Any) -> None:
        if name in self.names:
            raise CheckpointError(f"tensor {name} written twice")
        self.names.add(name)
        raw = _raw(tensor)
        n = raw.nbytes
        if self._data is not None and self._size and self._size + n > self.max:
            self._close_shard()
        if self._data is None:
            self._open()
        self._header[name] = {"dtype": _dtype_code(tensor), "shape": list(tensor.shape),
                              "data_offsets": [self._size, self._size + n]}
        self._data.write(raw)
        self._size += n
        self.total += n

    def close(self) -> list[str]:
        """Write the shards and the index; returns the file names."""
        self._close_shard()
        count = len(self._shards)
        weight_map: dict[str, str] = {}
        names = []
        for k, (data_path, header) in enumerate(self._shards, 1):
            name = f"model-{k:05d}-of-{count:05d}.safetensors"
            head = json.dumps({"__metadata__": self.metadata, **header}, separators=(",", ":")).encode()
            head += b" " * (-len(head) % 8)
            with open(self.out / name, "wb") as dst, open(data_path, "rb") as src:
                dst.write(struct.pack("<Q", len(head)))
                dst.write(head)
                shutil.copyfileobj(src, dst, 16 * 2**20)
            data_path.unlink()
            for t in header:
                weight_map[t] = name
            names.append(name)
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return names + [INDEX]

    def abort(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data_path.unlink(missing_ok=True)
            self._data = None
        for data_path, _ in self._shards:
            data_path.unlink(missing_ok=True)


class SafetensorsReader:
    """The tensors of a Hugging Face model directory (sharded with an index, or model.safetensors),
    one at a time; reader(name) -> tensor (a callable for mapping.to_megatron)."""

    def __init__(self, hf_dir: str | os.PathLike) -> None:
        self.dir = Path(hf_dir)
        if not self.dir.is_dir():
            raise CheckpointError(f"{self.dir}: no such directory")
        index = self.dir / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({type(exc).__name__}: {exc})") from None
            self.files = {str(k): self.dir / str(v) for k, v in weight_map.items()}
        elif (self.dir / SINGLE).is_file():
            from safetensors import safe_open

            with safe_open(str(self.dir / SINGLE), framework="pt") as fh:
                self.files = {k: self.dir / SINGLE for k in fh.keys()}
        else:
            found = sorted(p.name for p in self.dir.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
            raise CheckpointError(f"{self.dir}: no {INDEX} and no {SINGLE}"
                                  + (f" (found {', '.join(found)}: only safetensors is read; convert with "
                                     "transformers' save_pretrained(safe_serialization=True))" if found else ""))
        self._handles: dict[Path, Any] = {}

    def keys(self) -> list[str]:
        return list(self.files)

    def _handle(self, path: Path) -> Any:
        from safetensors import safe_open

        if path not in self._handles:
            if not path.is_file():
                raise CheckpointError(f"{path}: missing (named by {INDEX})")
            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path]

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def __call__(self, name: str) -> Any:
        if name not in self.files:
            raise CheckpointError(f"{self.dir}: the model has no tensor {name}")
        return self._handle(self.files[name]).get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

    def tensors(self) -> Iterator[tuple[str, Any]]:
        for name in self.files:
            yield name, self(name)
