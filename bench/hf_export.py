"""Peak memory of `checkpoint export` against the checkpoint's size (issue 29: streaming tensor by tensor).

    .venv/bin/python bench/hf_export.py [--layers 8] [--hidden 512] [--ffn 1536] [--vocab 16000]
                                        [--dir DIR] [--keep] [--json]

Makes a Llama-style model with random weights from a transformers LlamaConfig (no download), saves it
with save_pretrained and imports it (lingjun_slurm.injob.checkpoint.hf.importer, --no-check) into a
torch_dist checkpoint DIR/ckpt (fp32). Then, each in a fresh process, measures the peak RSS
(getrusage ru_maxrss) of:

  reference     importing torch, megatron-core, transformers and the hf package, opening the checkpoint
                and reading the largest tensor the export reads (a stacked layer key one layer at a time,
                the others whole: the embedding here)
  export        export_checkpoint(..., check=False), fp32 (the streaming part alone)
  export+proof  export_checkpoint(..., check=True): the proof holds both sides' global tensors (embeddings,
                final norm, output layer) and one decoder layer at a time (proof.py, layer_by_layer)

and prints the checkpoint's size, each peak, and export - reference against the checkpoint size (the
memory the export adds to what any process reading one tensor needs). All measured in the same run on
the same machine; no threshold. Writes only under DIR (default: a new directory under /tmp, removed at the
end unless --keep). Needs torch, megatron-core, transformers and safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, resource, sys, warnings
warnings.simplefilter("ignore")
mode, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3]
import torch, megatron.core, transformers, safetensors  # noqa: F401
from lingjun_slurm.injob.checkpoint.hf.megatron_io import MegatronSource
from lingjun_slurm.injob.checkpoint.hf.export import export_checkpoint
if mode == "reference":
    src = MegatronSource.open(ckpt)
    best = max(src.keys(), key=lambda k: src.nbytes(k) // (src.num_layers(k) or 1))
    t = src.load(best, 0 if src.num_layers(best) else None)
    info = {"tensor": best, "tensor_bytes": t.numel() * t.element_size()}
else:
    r = export_checkpoint(ckpt, out, dtype="fp32", check=(mode == "export+proof"))
    info = {"written_bytes": r.bytes_written, "proof": r.proof.max_abs_diff if r.proof else None}
info["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
print(json.dumps(info))
'''


def make_checkpoint(work: Path, layers: int, hidden: int, ffn: int, vocab: int) -> Path:
    code = f"""
import warnings; warnings.simplefilter("ignore")
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from lingjun_slurm.injob.checkpoint.hf.importer import import_checkpoint
cfg = LlamaConfig(vocab_size={vocab}, hidden_size={hidden}, intermediate_size={ffn}, num_hidden_layers={layers},
                  num_attention_heads={max(1, hidden // 64)}, num_key_value_heads={max(1, hidden // 128)},
                  max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-5)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained({str(work / 'hf')!r})
import_checkpoint({str(work / 'hf')!r}, {str(work / 'ckpt')!r}, check=False)
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=_env())
    return work / "ckpt"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def measure(mode: str, ckpt: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(ckpt), str(out)], capture_output=True, text=True,
                          cwd=REPO, env=_env())
    if proc.returncode:
        raise SystemExit(f"{mode} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = a.dir or Path(tempfile.mkdtemp(prefix="lingjun-bench-hf-export-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        ckpt = make_checkpoint(work, a.layers, a.hidden, a.ffn, a.vocab)
        size = sum(p.stat().st_size for p in (ckpt / "iter_0000000").iterdir() if p.is_file())
        ref = measure("reference", ckpt, work / "unused")
        exp = measure("export", ckpt, work / "out1")
        proof = measure("export+proof", ckpt, work / "out2")
        mib = 2**20
        result = {"checkpoint_bytes": size, "reference": ref, "export": exp, "export_proof": proof,
                  "export_minus_reference_over_checkpoint": (exp["peak_rss"] - ref["peak_rss"]) / size,
                  "export_proof_minus_reference_over_checkpoint": (proof["peak_rss"] - ref["peak_rss"]) / size}
        if a.json:
            print(json.dumps(result, indent=2))
            return
        print(f"checkpoint: {size / mib:.1f} MiB (fp32, {a.layers} layers, hidden {a.hidden}, ffn {a.ffn}, "
              f"vocab {a.vocab})")
        print(f"reference     peak RSS {ref['peak_rss'] / mib:8.1f} MiB  (imports + {ref['tensor']}: "
              f"{ref['tensor_bytes'] / mib:.1f} MiB)")
        print(f"export        peak RSS {exp['peak_rss'] / mib:8.1f} MiB  (export - reference = "
              f"{(exp['peak_rss'] - ref['peak_rss']) / mib:.1f} MiB = "
              f"{result['export_minus_reference_over_checkpoint']:.3f} x the checkpoint)")
        print(f"export+proof  peak RSS {proof['peak_rss'] / mib:8.1f} MiB  (export+proof - reference = "
              f"{(proof['peak_rss'] - ref['peak_rss']) / mib:.1f} MiB = "
              f"{result['export_proof_minus_reference_over_checkpoint']:.3f} x the checkpoint)")
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
