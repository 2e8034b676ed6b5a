"""`lingjun-slurm plan SPEC [--json]`: GPU memory per rank, time and checkpoint size of the train
stage, before anything runs (lingjun_slurm/planner; docs/planning.md). No torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..common.errors import EXIT_INVALID, LingjunError


class PlanInputError(LingjunError):
    """The layout cannot be estimated (a size that does not divide): exit 2, naming the spec."""

    exit_code = EXIT_INVALID


def estimate_spec(spec_file: Path) -> tuple[Any, Any]:
    """(loaded spec, Estimate) for a spec file; PlanInputError for a layout that cannot work."""
    from ..plan import build_plan
    from ..planner.estimate import make
    from ..planner.memory import PlanError
    from ..spec import load_spec
    from ..injob.train import TrainError

    loaded = load_spec(spec_file)
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source=loaded.source)
    try:
        return loaded, make(plan, loaded.spec.planning)
    except (PlanError, TrainError) as exc:
        raise PlanInputError(f"{spec_file}: cannot plan the train stage: {exc}") from None


@click.command("plan")
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The estimate as JSON (docs/planning.md has the shape).")
def plan(spec_file: Path, as_json: bool) -> None:
    """Estimate the train stage: GPU memory per rank (weights, gradients, optimizer, activations),
    whether it fits, what to change when it does not, time per iteration and checkpoint size."""
    from ..planner.estimate import format_text

    _, est = estimate_spec(spec_file)
    if as_json:
        click.echo(json.dumps(est.to_json(), indent=1, sort_keys=True))
    else:
        click.echo(format_text(est))


def fit_warning(spec: Any, plan_obj: Any, source: str) -> tuple[str, bool] | None:
    """(message, certain) when the train stage does not fit its GPU, else None. Nothing is
    estimated when the GPU cannot be known (planning.gpu unset, a profile without one GPU type):
    then there is nothing to compare with, and validate stays as fast as it was."""
    from ..common.bytesfmt import human_bytes
    from ..gpus import PROFILE_GPUS
    from ..planner.estimate import make, train_profile
    from ..planner.memory import PlanError
    from ..injob.train import TrainError

    if not any(st.kind == "train" for st in plan_obj.stages):
        return None
    if not spec.planning.gpu and train_profile(plan_obj) not in PROFILE_GPUS:
        return None
    try:
        est = make(plan_obj, spec.planning, read_tokenizer=False)
    except (PlanError, TrainError):
        return None  # render/submit report a layout that cannot work in their own words
    if est.fits is not False:
        return None
    r = est.recommendation or {}
    rc = r.get("recompute")
    advice = []
    if rc:
        advice.append(f"training.recompute {{granularity: {rc['granularity']}, method: {rc['method']}, "
                      f"num_layers: {rc['num_layers']}}}")
    if r.get("tensor") is not None and (r["tensor"], r["pipeline"]) != (est.inputs.layout.tensor,
                                                                        est.inputs.layout.pipeline):
        advice.append(f"parallelism tensor {r['tensor']}, pipeline {r['pipeline']}, "
                      f"sequence_parallel {str(r['sequence_parallel']).lower()}")
    gpu = est.inputs.gpu
    assert gpu is not None
    msg = (f"{source}: the train stage needs {human_bytes(est.memory.total)} per GPU, over the "
           f"{human_bytes(est.usable_bytes or 0)} usable on {gpu.name} ({est.inputs.margin:.0%} margin): it does not fit"
           + (f"; try {' and '.join(advice)}" if advice else f"; {r.get('reason', '')}")
           + f" (lingjun-slurm plan {source})")
    if est.inputs.unknown:
        msg += f"; assumed, not known here: {', '.join(est.inputs.unknown)}"
    return msg, est.certain
