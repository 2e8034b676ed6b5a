"""The memory model against the paper it follows (Korthikanti et al. 2022, arXiv:2205.05198,
Table 2) and against exact parameter counts (issue 16 item 2)."""

from __future__ import annotations

import pytest

from lingjun_slurm.planner.memory import (Layout, PlanError, Recompute, Shape, estimate, in_flight,
                                          layer_activations, layer_parameters, stage_parameters)

# The paper's GPT layer: f = 4h, a*d = h, no GQA, GELU, dropout, 16-bit activations.
PAPER = Shape(num_layers=8, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, seq_length=2048,
              padded_vocab_size=51200)
S, B, H, A = 2048, 2, 1024, 16
SBH = S * B * H
SCORES = 5 * A * S * S * B
STATS = 2 * 8 * S * B  # the two LayerNorms' mean and rstd (fp32 per token), which the paper leaves out


def _act(shape: Shape = PAPER, attention: str = "local", selective: bool = False, **layout: object) -> int:
    return layer_activations(shape, Layout(micro_batch=B, **layout), "bf16", attention, selective)  # type: ignore[arg-type]


def test_table_2_no_parallelism() -> None:
    assert _act() == 34 * SBH + SCORES + STATS


@pytest.mark.parametrize("t", [2, 4, 8])
def test_table_2_tensor_parallel(t: int) -> None:
    assert _act(tensor=t) == 10 * SBH + 24 * SBH // t + SCORES // t + STATS


@pytest.mark.parametrize("t", [2, 4, 8])
def test_table_2_tensor_and_sequence_parallel(t: int) -> None:
    assert _act(tensor=t, sequence_parallel=True) == (34 * SBH + SCORES + STATS) // t


@pytest.mark.parametrize("t", [1, 2, 8])
def test_table_2_selective_recompute(t: int) -> None:
    """Selective recompute drops the 5as^2b term: 34sbh/t with SP, (10 + 24/t)sbh without."""
    assert _act(tensor=t, sequence_parallel=t > 1, selective=True) == (34 * SBH + STATS) // t
    assert _act(tensor=t, selective=True) == 10 * SBH + 24 * SBH // t + STATS


def test_flash_attention_keeps_no_scores() -> None:
    assert _act(attention="flash") == 34 * SBH + 4 * A * S * B + STATS


def test_swiglu_and_gqa_change_exactly_their_tensors() -> None:
    gated = Shape(**{**PAPER.__dict__, "swiglu": True})
    assert _act(gated) - _act() == 2 * S * B * 4096  # the gate's half of fc1's output, 2 bytes each
    gqa = Shape(**{**PAPER.__dict__, "num_query_groups": 4})
    flash = _act(attention="flash") - _act(gqa, attention="flash")
    assert flash == 2 * S * B * 2 * (16 - 4) * 64  # flash attention keeps K and V of 4 groups, not 16
    assert _act(gqa) == _act()  # the local attention repeats them to all 16 heads (and copies Q)


def test_no_dropout_no_masks() -> None:
    dry = Shape(**{**PAPER.__dict__, "hidden_dropout": 0.0, "attention_dropout": 0.0})
    assert _act() - _act(dry) == 2 * SBH + A * S * S * B * 3  # two hidden masks; attention mask + its output


def test_full_recompute_keeps_chunk_inputs() -> None:
    """uniform, 1 layer per chunk: 2sbh per layer kept (/t with SP), plus one layer recomputed."""
    lay = Layout(micro_batch=B, tensor=2, sequence_parallel=True)
    full = estimate(PAPER, lay, Recompute("full", "uniform", 1), attention="local")
    assert full.activation_terms["layers"] == 8 * 2 * SBH // 2
    assert full.activation_terms["recompute"] == _act(tensor=2, sequence_parallel=True)
    two = estimate(PAPER, lay, Recompute("full", "uniform", 4), attention="local")
    assert two.activation_terms["layers"] == 2 * 2 * SBH // 2  # 2 chunks of 4
    block = estimate(PAPER, lay, Recompute("full", "block", 3), attention="local")
    assert block.activation_terms["layers"] == 3 * 2 * SBH // 2 + 5 * _act(tensor=2, sequence_parallel=True)


def test_pipeline_in_flight_micro_batches() -> None:
    """1F1B: stage i holds min(PP - i, m); interleaved: Megatron-LM's 1 + (PP-1)/(PP*V) on stage 0."""
    assert [in_flight(Layout(pipeline=4, num_microbatches=8), i) for i in range(4)] == [4, 3, 2, 1]
    assert in_flight(Layout(pipeline=4, num_microbatches=2), 0) == 2
    v = Layout(pipeline=4, virtual_pipeline=2, num_microbatches=16)
    assert in_flight(v, 0) == pytest.approx(4 * (1 + 3 / 8))


def test_parameters_of_a_gpt2_medium_layer() -> None:
    """GPT-2 medium's layer (h 1024, LayerNorm, biases): 12h^2 + 13h = 12,596,224 parameters."""
    assert layer_parameters(PAPER, 1) == 12 * H * H + 13 * H
    # TP=2: weights and column-parallel biases (QKV 3h, fc1 4h) halve; norms (2 x 2h) and the
    # row-parallel biases (projection and fc2, h each) are whole on every rank
    assert layer_parameters(PAPER, 2) == 6 * H * H + 3 * H // 2 + 4 * H // 2 + 4 * H + 2 * H


def test_embeddings_live_on_the_first_and_last_stages() -> None:
    lay = Layout(pipeline=2)
    layers = 4 * layer_parameters(PAPER, 1)
    assert stage_parameters(PAPER, lay, 0) == layers + 51200 * H + 2048 * H
    assert stage_parameters(PAPER, lay, 1) == layers + 2 * H + 51200 * H  # tied: the shared copy
    one = Layout()
    assert stage_parameters(PAPER, one, 0) == 8 * layer_parameters(PAPER, 1) + 51200 * H + 2048 * H + 2 * H


def test_eighteen_bytes_per_parameter_or_six_plus_twelve_over_dp() -> None:
    plain = estimate(PAPER, Layout(data=8))
    dist = estimate(PAPER, Layout(data=8, distributed_optimizer=True))
    n = plain.parameters
    assert (plain.weights + plain.gradients + plain.optimizer) == 18 * n
    assert dist.weights + dist.gradients == 6 * n and dist.optimizer == pytest.approx(12 * n / 8, abs=1)


@pytest.mark.parametrize("bad, why", [
    (dict(tensor=3), "16 attention heads do not split over tensor 3"),
    (dict(pipeline=3), "8 layers do not split into 3 pipeline stages"),
    (dict(context=3), "seq_length 2048 does not split over context 3"),
])
def test_layouts_that_cannot_work_say_why(bad: dict, why: str) -> None:
    with pytest.raises(PlanError, match=why):
        estimate(PAPER, Layout(**bad))


def test_local_gqa_with_rope_keeps_the_rotated_q_and_repeated_k_v_only() -> None:
    """The local attention repeats K and V to every head: the rotated K and the QKV output are
    not kept, the rotated Q and the two repeated tensors are (3ad per token)."""
    gqa_rope = Shape(**{**PAPER.__dict__, "num_query_groups": 4, "learned_position_embeddings": False})
    assert _act(gqa_rope) == _act()  # 3ad either way: Q (rotated or copied), K and V repeated
    rope = Shape(**{**PAPER.__dict__, "learned_position_embeddings": False})
    assert _act(rope) - _act() == 2 * S * B * 2 * 1024  # no GQA: rotated Q and K beside the QKV output


def test_query_groups_that_do_not_split_over_tp_are_refused() -> None:
    with pytest.raises(PlanError, match="2 query groups do not split over tensor 4"):
        estimate(Shape(**{**PAPER.__dict__, "num_query_groups": 2}), Layout(tensor=4))
