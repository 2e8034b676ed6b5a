"""The builtin Megatron GPT trainer (megatron-core, no Megatron-LM checkout needed).

    python3 -m lingjun_slurm.stages train --plan PLAN.json  ->  stages/train.py main(plan)

Modules:
  settings    plan["settings"] -> TrainSettings (pure; no torch)
  runtime     rank/world from the environment, process groups, devices, seeds
  cpu_compat  megatron-core's CUDA-only spots redirected to the CPU (active only without CUDA)
  model       TransformerConfig, GPTModel (TE or local layer spec), megatron DDP
  optim       megatron optimizer (+ distributed optimizer) and OptimizerParamScheduler
  data        tokenizer facts, GPTDataset over the .bin/.idx prefix, Megatron's sample order
  ckpt        torch_dist checkpoints in Megatron-LM's layout, resume
  metrics     metrics.jsonl, log lines, FLOPs and MFU
  loop        the training loop: steps, eval, SIGTERM -> save -> exit 0

Nothing here is imported by the CLI; torch and megatron-core are imported inside functions
or by the modules that need them (settings is pure). See docs/training.md.
"""

from __future__ import annotations


class TrainError(Exception):
    """A problem the user can fix (settings, data, versions); printed as one line, exit 1."""
