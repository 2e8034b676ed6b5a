"""What spec.models shares with clusters.py: the patterns of values that reach #SBATCH lines or
pyxis mount lists, and the Strict base model.

A module of its own so that clusters.py (which `status`, `logs` and `list` import to find a
run's host) gets them without creating the ~30 spec model classes of spec/models.py, nor
running spec/load.py's imports (yaml, the checks, the network profiles): issue 15 item 9,
tests/unit/test_startup_imports.py. spec.models re-exports every name here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Values that end up on #SBATCH lines or in Slurm's own parsing: no quoting possible there.
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
SLURM_WORD_RE = r"^[A-Za-z0-9][A-Za-z0-9._+-]*(,[A-Za-z0-9][A-Za-z0-9._+-]*)*$"
CONSTRAINT_RE = r"^[A-Za-z0-9._&|\[\]*()!:,-]+$"
# Paths that appear on #SBATCH lines (log directory, --chdir) or in pyxis mount lists.
SAFE_PATH_RE = r"^/[A-Za-z0-9._+@=/-]*$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
# srun --cpu-bind values (srun(1)): one word, or a map/mask list of numbers.
CPU_BIND_RE = (r"^(profile|(verbose,)?(none|no|cores|sockets|ldoms|threads|rank|rank_ldom|"
               r"(map_cpu|mask_cpu|map_ldom|mask_ldom):(0x)?[0-9a-fA-F]+(,(0x)?[0-9a-fA-F]+)*))$")


class Strict(BaseModel):
    """Unknown keys are errors. Models are built on first use (defer_build), not at import:
    commands that read no spec (status, list, logs) never pay for building these validators."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)
