"""Metrics: one JSON object per line in {workdir}/runs/{run_id}/metrics.jsonl (rank 0 only),
and human-readable log lines every log_interval.

Records (all have "type", "time" (UNIX seconds) and "run_id"):
  start  iteration (resumed from, 0 when fresh), world_size, tp/pp/cp/dp, device, precision,
         layer_spec, parameters, padded_vocab_size, tokens_per_step
  train  iteration, loss, lr, grad_norm, step_time_s, tokens_per_s, consumed_samples,
         and on GPUs tflops_per_gpu and mfu (when the GPU is in PEAK_BF16_TFLOPS)
  eval   iteration, loss, ppl, eval_iters
  save   iteration, seconds, path
  stop   iteration, reason ("done" | "signal" | "already done")
A restart repeats the steps after the checkpoint it resumed from: a later "train" record for
the same iteration supersedes an earlier one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, TextIO

from .settings import ModelSettings

log = logging.getLogger(__name__)

# Dense BF16/FP16 tensor-core peak per GPU (TFLOP/s, no sparsity), matched on torch.cuda.get_device_name().
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("H800", 989.0), ("H20", 148.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("A10", 125.0),
)


def peak_tflops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_BF16_TFLOPS:
        if key in device_name:
            return value
    return None


def flops_per_sample(m: ModelSettings, padded_vocab: int) -> float:
    """Megatron-LM's num_floating_point_operations for one sequence (dense GPT; fwd + bwd = 3 x fwd)."""
    kv_channels = m.hidden_size // m.num_attention_heads
    q_ratio = kv_channels * m.num_attention_heads / m.hidden_size
    gated = 1.5 if m.activation == "swiglu" else 1.0
    return (12 * m.seq_length * m.num_layers * m.hidden_size ** 2 * (
        (1 + m.num_query_groups / m.num_attention_heads + m.seq_length / m.hidden_size) * q_ratio
        + (m.ffn_hidden_size / m.hidden_size) * gated
        + padded_vocab / (2 * m.num_layers * m.hidden_size)))


# TensorBoard scalars under Megatron-LM's own tags (megatron/training/training.py training_log
# and evaluate_and_print_results at core_v0.16.1, :1883-2047 and :3259-3267), so the dashboards
# Megatron-LM users already have read these runs too. metrics.jsonl field -> tags.
TB_TRAIN = (("loss", "lm loss"), ("lr", "learning-rate"), ("grad_norm", "grad-norm"),
            ("step_time_s", "iteration-time"), ("tflops_per_gpu", "throughput"),
            ("max_memory_allocated", "mem-max-allocated-bytes"), ("tokens_per_s", "tokens-per-second"))
TB_VS_SAMPLES = ("lm loss", "learning-rate", "grad-norm")  # Megatron-LM adds "<tag> vs samples" for these
TENSORBOARD_DIR = "tensorboard"  # <run_dir>/tensorboard/, beside metrics.jsonl


def tensorboard_writer(run_dir: str) -> Any:
    """torch's SummaryWriter for <run_dir>/tensorboard/, or None without the tensorboard package
    (torch.utils.tensorboard imports it; it is not one of the trainer's dependencies)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    except Exception as exc:  # a tensorboard that does not import with this protobuf / setuptools
        log.warning("tensorboard is installed but does not import (%s: %s): no TensorBoard event files",
                    type(exc).__name__, exc)
        return None
    try:
        # flush_secs: a killed job (SIGKILL, a lost node) loses at most half a minute of events
        return SummaryWriter(log_dir=os.path.join(run_dir, TENSORBOARD_DIR), max_queue=1000, flush_secs=30)
    except Exception as exc:
        log.warning("cannot write TensorBoard event files into %s: %s", run_dir, exc)
        return None


# node_exporter textfile collector (docs/monitoring.md; lingjun_slurm/injob/host/promfile.py): the
# batch script exports these when monitoring.textfile_dir is set (slurm_templates/train.sbatch.j2).
# LINGJUN_TEXTFILE_DIR is <run_dir>/textfile, in the run directory (no mount of its own in the
# container), not node_exporter's directory: rank 0 stages its samples there and the hang watchdog
# merges them into the job's one file on the batch host (promfile.Stage, promfile.read_staged).
TEXTFILE_DIR_ENV = "LINGJUN_TEXTFILE_DIR"
TEXTFILE_JOB_ENV = "LINGJUN_TEXTFILE_JOB"  # the batch script's job key (the file's name has it)
TEXTFILE_STAGE_ENV = "LINGJUN_TEXTFILE_STAGE"
PROM_MIN_INTERVAL_S = 1.0  # at most one rewrite a second between saves (a scrape is every 15 s or more)
# metrics.jsonl "train" field -> family (promfile.FAMILIES)
PROM_TRAIN = (("iteration", "lingjun_train_iteration"), ("loss", "lingjun_train_loss"),
              ("lr", "lingjun_train_learning_rate"), ("tokens_per_s", "lingjun_train_tokens_per_second"),
              ("step_time_s", "lingjun_train_step_seconds"), ("tflops_per_gpu", "lingjun_train_tflops_per_gpu"),
              ("mfu", "lingjun_train_mfu_ratio"), ("max_memory_allocated", "lingjun_train_memory_peak_bytes"))


class PromFile:
    """Rank 0's series for node_exporter's textfile collector: the last "train" record and the last
    save, labels run, stage, slurm_job, node, rank, staged as samples in `directory`
    (<run_dir>/textfile/lingjun-slurm_<job>_<node>.json, promfile.Stage). The hang watchdog merges
    them with its own into the job's one .prom file at every poll (promfile.read_staged); rank="0"
    keeps them apart from its series (both carry lingjun_metrics_updated_timestamp_seconds)."""

    def __init__(self, directory: str, run_id: str, rank: int) -> None:
        from ..host import promfile

        job = os.environ.get(TEXTFILE_JOB_ENV) or os.environ.get("SLURM_JOB_ID") or "none"
        node = promfile.node_name()
        try:
            os.makedirs(directory, exist_ok=True)  # the batch script makes it; a missing one is said at write
        except OSError:
            pass
        self._writer = promfile.Stage(directory, job, node,
                                      {"run": run_id, "stage": os.environ.get(TEXTFILE_STAGE_ENV) or "train",
                                       "slurm_job": job, "node": node, "rank": str(rank)},
                                      warn=lambda text: log.warning("metrics for Prometheus: %s", text))
        self._last: dict[str, Any] = {}
        self._save: dict[str, Any] = {}
        self._written = 0.0

    @property
    def path(self) -> str:
        return self._writer.path

    def update(self, kind: str, fields: dict[str, Any], force: bool = False) -> None:
        if kind == "train":
            self._last = fields
        elif kind == "save":
            self._save, force = fields, True
        else:
            return
        now = time.monotonic()
        if force or now - self._written >= PROM_MIN_INTERVAL_S:
            self.flush()
            self._written = now

    def remove(self) -> None:
        self._writer.remove()

    def flush(self) -> None:
        samples: list[tuple[str, dict[str, str], Any]] = []
        for key, family in PROM_TRAIN:
            value = self._last.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                samples.append((family, {}, value))
        if isinstance(self._save.get("iteration"), int):
            samples.append(("lingjun_checkpoint_iteration", {}, self._save["iteration"]))
            samples.append(("lingjun_checkpoint_saved_timestamp_seconds", {}, self._save["time"]))
        samples.append(("lingjun_metrics_updated_timestamp_seconds", {}, round(time.time(), 3)))
        self._writer.write(samples)


class Metrics:
    """Writes metrics.jsonl and log lines, and TensorBoard event files when tensorboard is
    installed, and a file for node_exporter's textfile collector when the batch script exported
    LINGJUN_TEXTFILE_DIR; a no-op writer on ranks other than 0."""

    def __init__(self, path: str, run_id: str, enabled: bool, log_interval: int) -> None:
        self.path, self.run_id, self.enabled, self.log_interval = path, run_id, enabled, max(1, log_interval)
        self._fh: TextIO | None = None
        self._window: list[dict[str, Any]] = []
        self._tb: Any = None
        self.prom: PromFile | None = None
        if enabled:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")
            self._tb = tensorboard_writer(os.path.dirname(path) or ".")
            textfile_dir = os.environ.get(TEXTFILE_DIR_ENV)
            if textfile_dir:
                self.prom = PromFile(textfile_dir, run_id, 0)

    def record(self, kind: str, **fields: Any) -> None:
        if not self._fh:
            return
        rec = {"type": kind, "time": round(time.time(), 3), "run_id": self.run_id, **fields}
        self._fh.write(json.dumps(rec, allow_nan=True) + "\n")
        self._fh.flush()
        if self.prom is not None:
            self.prom.update(kind, rec)

    def train(self, total_iterations: int, **fields: Any) -> None:
        if not self.enabled:
            return
        self.record("train", **fields)
        self._window.append(fields)
        it = fields["iteration"]
        if self._tb is not None:
            samples = fields.get("consumed_samples")
            for key, tag in TB_TRAIN:
                value = fields.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(tag, value, it)
                    if tag in TB_VS_SAMPLES and isinstance(samples, int):
                        self._tb.add_scalar(f"{tag} vs samples", value, samples)
        if it % self.log_interval == 0 or it == total_iterations:
            self._log_window(total_iterations)

    def _log_window(self, total: int) -> None:
        w, self._window = self._window, []
        if not w:
            return
        last = w[-1]
        loss = sum(r["loss"] for r in w) / len(w)
        step_ms = 1000 * sum(r["step_time_s"] for r in w) / len(w)
        tps = sum(r["tokens_per_s"] for r in w) / len(w)
        parts = [f"iteration {last['iteration']:>8d}/{total}", f"loss {loss:.6f}", f"lr {last['lr']:.3e}"]
        if last.get("grad_norm") is not None:
            parts.append(f"grad norm {last['grad_norm']:.3f}")
        parts += [f"{step_ms:.1f} ms/step", f"{tps:,.0f} tokens/s"]
        if last.get("tflops_per_gpu") is not None:
            parts.append(f"{last['tflops_per_gpu']:.1f} TFLOP/s/GPU")
        if last.get("mfu") is not None:
            parts.append(f"MFU {100 * last['mfu']:.1f}%")
        text = " | ".join(parts)
        log.info(text)

    def eval(self, iteration: int, loss: float, eval_iters: int) -> None:
        if not self.enabled:
            return
        ppl = math.exp(min(loss, 50.0)) if math.isfinite(loss) else float("nan")
        self.record("eval", iteration=iteration, loss=loss, ppl=ppl, eval_iters=eval_iters)
        if self._tb is not None:
            self._tb.add_scalar("lm loss validation", loss, iteration)
            # Megatron-LM's ppl is exp(min(20, loss)) (training.py:3257 at core_v0.16.1)
            self._tb.add_scalar("lm loss validation ppl", math.exp(min(20.0, loss)) if math.isfinite(loss) else ppl,
                                iteration)
        log.info(f"validation at iteration {iteration} | loss {loss:.6f} | ppl {ppl:.3f}")

    def close(self) -> None:
        if self.prom is not None:
            # Its series end with the trainer: the watchdog then writes its own series only, and no
            # stale staged file is left for a later attempt.
            self.prom.remove()
            self.prom = None
        if self._fh:
            self._fh.close()
            self._fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
