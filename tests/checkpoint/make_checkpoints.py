"""Write real Megatron torch_dist checkpoints on the CPU: `python make_checkpoints.py OUT [ITER...]`.

A tiny GPTModel (2 layers, hidden 32, vocab 128, get_gpt_layer_local_spec(), no
TransformerEngine) in one process with a 1-rank gloo group on an in-memory store and
parallel_state.initialize_model_parallel(1, 1). Each iteration is saved with
megatron.core.dist_checkpointing.save({"model": sharded_state_dict, "iteration": N,
"args": Namespace, "checkpoint_version": 3.0, "rng_state": ShardedObject}) into OUT/iter_NNNNNNN
(common.pt then holds an argparse.Namespace with a megatron enum, as Megatron-LM's does), and latest_checkpointed_iteration.txt is
written after each save, the way Megatron-LM does.

Two CUDA calls on the CPU save path are redirected (torch.cuda.synchronize in the async
writer's preload, torch.cuda.current_device in the finalize step of state_dict_saver).
The heavy imports stay inside main(): the writer's spawn-context Manager re-imports
__main__, and the `if __name__ == "__main__"` guard keeps it from saving again.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(out: str, iterations: list[int]) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    torch.manual_seed(1234)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
                               params_dtype=torch.float32, pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128,
                     max_sequence_length=64)
    for it in iterations:
        with torch.no_grad():  # the weights differ between iterations, as after training steps
            for p in model.parameters():
                p.add_(0.01)
        path = os.path.join(out, f"iter_{it:07d}")
        os.makedirs(path)
        args = argparse.Namespace(num_layers=2, hidden_size=32, params_dtype=torch.float32, save_interval=10,
                                  attention_backend=AttnBackend.auto, iteration=it)
        state = {"model": model.sharded_state_dict(), "iteration": it, "args": args, "checkpoint_version": 3.0,
                 "rng_state": ShardedObject("rng_state", {"torch": torch.get_rng_state()}, (1,), (0,), replica_id=0)}
        dist_checkpointing.save(state, path)
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(it))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [10, 20, 30])
