"""The shape of a spec file (pydantic v2). Cross-field rules live in checks.py.

Every string that reaches a shell is quoted at render time. A few values cannot be
quoted because Slurm or pyxis parse them themselves (#SBATCH lines, the pyxis mount
list); those fields are restricted here by a pattern, and the error says why.

Spec models are strict (SpecModel): YAML's `true` is not the integer 1, `3.0` is not an
integer, "yes" is not a boolean, and no number may be NaN or infinite (`.inf`, `1e400`).
Every number and string has a pinned limit, each with its reason beside it; docs/submitting.md
("What validation refuses") and docs/spec-reference.md list them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, field_validator

from ..common.timefmt import TIME_HELP, format_time, parse_time
# The patterns and the Strict base live in base.py (clusters.py shares them); re-exported here.
from .base import CONSTRAINT_RE, CPU_BIND_RE, ENV_NAME_RE, NAME_RE, SAFE_PATH_RE, SLURM_WORD_RE, Strict  # noqa: F401

SPEC_VERSION = 1
BUILTIN_STAGES = ("preprocess", "merge", "train", "checkpoint")

# ---- pinned limits -------------------------------------------------------------------------
# Iteration counts and intervals. The train script compares the checkpoint's iteration with
# `[ "$last" -lt ITERATIONS ]` (slurm_templates/train.sbatch.j2), and bash's test takes 64-bit
# integers only (2**63 gives "integer expression expected"); Megatron-LM counts samples as
# iterations x global_batch (training.py core_v0.16.1:3295-3309), and 10**12 x BATCH_MAX stays
# within int64. At one iteration a second, 10**12 is 30000 years.
COUNT_MAX = 10**12
# micro_batch and global_batch, in sequences: far above any published run, and small enough that
# COUNT_MAX x BATCH_MAX = 10**18 < 2**63.
BATCH_MAX = 10**6
# Model dimensions: cuBLAS's GEMMs take int m, n, k (cublasGemmEx), and token ids are int32 in
# Megatron's .bin files (indexed_dataset.py core_v0.16.1:107-118, DType.optimal_dtype).
DIM_MAX = 2**31 - 1
# Megatron seeds numpy with seed + 100 x pipeline rank (initialize.py core_v0.16.1:405-427), and
# np.random.seed takes 0 .. 2**32 - 1: 2**31 - 1 leaves room for any pipeline rank.
SEED_MAX = 2**31 - 1
# tensor x pipeline x context must divide the world size: at most nodes x tasks_per_node.
NODES_MAX = 100_000
TASKS_MAX = 1024
WORLD_MAX = NODES_MAX * TASKS_MAX
# Linux refuses an argument or environment string over MAX_ARG_STRLEN (32 pages = 131072 bytes
# with its NUL, execve(2)); every free string of a spec becomes one (an argv word, an exported
# variable, an #SBATCH value Slurm exports as SLURM_JOB_*). Half of it leaves room for the
# option or variable name in front of it.
ARG_STRLEN_MAX = 131072
TEXT_BYTES_MAX = ARG_STRLEN_MAX // 2
# PATH_MAX (4096 with its NUL) and NAME_MAX (255): longer paths fail with ENAMETOOLONG.
PATH_BYTES_MAX = 4095
NAME_BYTES_MAX = 255
# Slurm reads a time limit in seconds into a C int and rounds it up to minutes with
# (secs + 59) / 60 (time_str2secs/time_str2mins, src/common/parse_time.c): anything above
# INT_MAX - 59 seconds overflows, e.g. "99999-00:00:00" would silently become about 578 days.
TIME_S_MAX = 2**31 - 1 - 59
# sbatch reads --mem into a signed long long count of MiB and multiplies G by 1024 and T by
# 1024**2 in it (str_to_mbytes, src/common/proc_args.c).
MEM_MIB_MAX = 2**63 - 1

# Why each upper bound is what it is, for the error message (by the bound's value).
HANG_MAX = 7 * 86400  # training.hang_timeout, hang_startup_timeout
LIMIT_REASONS = {
    COUNT_MAX: "the train script compares iterations in bash, whose test takes 64-bit integers, and Megatron "
               "counts iterations x global_batch samples in int64",
    BATCH_MAX: "with iterations up to 10**12 it keeps iterations x global_batch within int64",
    DIM_MAX: "cuBLAS takes int dimensions and token ids are int32 in Megatron's .bin files",
    WORLD_MAX: "it must divide the world size, at most nodes x tasks_per_node",
    NODES_MAX: "no Slurm cluster is larger",
    HANG_MAX: "a week: no iteration, save or start-up should take longer, and the watchdog counts in seconds",
}
_AN_ITERATION_COUNT = "an iteration count, bounded as iterations is"
FIELD_LIMIT_REASONS = {
    "seed": "numpy takes seeds below 2**32, and Megatron adds 100 x the pipeline rank to this one",
    "lr_warmup_iters": _AN_ITERATION_COUNT,
    "lr_decay_iters": _AN_ITERATION_COUNT,
    "log_interval": _AN_ITERATION_COUNT,
    "eval_interval": _AN_ITERATION_COUNT,
    "save_interval": _AN_ITERATION_COUNT,
    "eval_iters": _AN_ITERATION_COUNT + "; Megatron's validation samples, (iterations // eval_interval + 1) x "
                  "eval_iters x global_batch, must also fit in int64 (checked with the others)",
    "keep_last": "more than the number of saves keeps all of them; bounded as iterations is",
    "num_layers": "a C int, as the other model dimensions",
    "rotary_base": "a C int, as the other model dimensions",
    "vocab_size": "token ids are int32 in Megatron's .bin files (indexed_dataset.py DType.optimal_dtype)",
}


def _nbytes(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _text_fits(value: str) -> str:
    n = _nbytes(value)
    if n > TEXT_BYTES_MAX:
        raise ValueError(f"{n} bytes is too long: at most {TEXT_BYTES_MAX} (each string becomes one argument or "
                         f"environment string of a program, and Linux refuses any over {ARG_STRLEN_MAX} bytes: "
                         "MAX_ARG_STRLEN, execve(2))")
    return value


def path_fits(value: str) -> str:
    n = _nbytes(value)
    if n > PATH_BYTES_MAX:
        raise ValueError(f"a path of {n} bytes cannot be opened: Linux allows {PATH_BYTES_MAX} "
                         "(PATH_MAX 4096 with its NUL; longer ones fail with ENAMETOOLONG)")
    for part in value.split("/"):
        if _nbytes(part) > NAME_BYTES_MAX and not any(ch in part for ch in "*?["):
            shown = part[:40] + "..."
            raise ValueError(f"the path component {shown!r} is {_nbytes(part)} bytes: Linux allows "
                             f"{NAME_BYTES_MAX} per file name (NAME_MAX; longer ones fail with ENAMETOOLONG)")
    return value


def mem_mib(value: str) -> int:
    """A Slurm --mem value ("NUMBER[K|M|G|T]", M by default) in MiB as sbatch counts it
    (str_to_mbytes, src/common/proc_args.c: K rounds up to whole MiB)."""
    unit = value[-1] if value[-1] in "KMGT" else "M"
    n = int(value[:-1] if value[-1] in "KMGT" else value)
    return {"K": (n + 1023) // 1024, "M": n, "G": n * 1024, "T": n * 1024 * 1024}[unit]


def _mem_fits(value: str) -> str:
    digits = value[:-1] if value[-1] in "KMGT" else value
    too_big = ValueError(f"{value[:40]!r} is more than Slurm can hold: sbatch reads --mem as a signed 64-bit "
                         "count of MiB (str_to_mbytes, src/common/proc_args.c)")
    if len(digits.lstrip("0")) > 19:
        raise too_big
    # Slurm adds 1023 to a K count before it divides (ROUNDUP): that sum must fit too.
    n = int(digits)
    if n > MEM_MIB_MAX or (n + 1023 if value[-1] == "K" else mem_mib(value)) > MEM_MIB_MAX:
        raise too_big
    return value


# Fields of a time limit that must stay under their unit's size, by the form's separators: every
# field but the first, whose size is free ("90" minutes, "48:00:00"). Slurm itself accepts any
# size (time_str2secs, src/common/parse_time.c, identical in slurm-22-05-8-1, 23-02-0-1,
# 23-11-0-1 and 25-11-7-1: sscanf "%d-%d:%d:%d" then d*86400 + h*3600 + m*60 + s, with no range
# check), so "25:99:99" runs 26:40:39: a typo Slurm would misread, refused here.
_TIME_FIELD_LIMITS = {
    # separators in the text -> (unit, limit) of each field after the first
    (":",): (("seconds", 60),),
    (":", ":"): (("minutes", 60), ("seconds", 60)),
    ("-",): (("hours", 24),),
    ("-", ":"): (("hours", 24), ("minutes", 60)),
    ("-", ":", ":"): (("hours", 24), ("minutes", 60), ("seconds", 60)),
}


def _carried_field(text: str) -> str:
    """Why a field of a parsed time limit is out of its range ('' when none is)."""
    seps = tuple(ch for ch in text if ch in "-:")
    fields = text.replace("-", ":").split(":")[1:]
    for (unit, limit), raw in zip(_TIME_FIELD_LIMITS.get(seps, ()), fields):
        if int(raw) >= limit:
            return f"{unit} {raw} is not below {limit};"
    return ""


def check_time(value: Any) -> int:
    """Seconds of a spec time limit, or ValueError: what sbatch would reject, Slurm's unlimited
    spellings (the tool needs a finite limit), and limits Slurm's int arithmetic cannot hold."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = repr(value)
        raise ValueError(f"expected {TIME_HELP}, got {shown[:60] + '...' if len(shown) > 60 else shown}")
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("INFINITE", "UNLIMITED") or text == "-1":
            raise ValueError(f"{value!r} is Slurm's unlimited (time_str2secs, src/common/parse_time.c); the tool "
                             "needs a finite limit (the train stage saves before it): give one, or leave time out "
                             "for the partition's default")
        if not text.isascii() or len(text) > 40:
            shown = repr(value)
            shown = shown[:60] + "..." if len(shown) > 60 else shown
            raise ValueError(f"expected {TIME_HELP} in ASCII digits, got {shown}")
    elif value > 10**12:
        raise ValueError(f"time limit {value} minutes is more than Slurm can hold: at most "
                         f"{format_time(TIME_S_MAX)} (Slurm counts seconds in a C int: time_str2secs, "
                         "src/common/parse_time.c)")
    seconds = parse_time(value)
    carried = _carried_field(str(value).strip())
    if carried:
        raise ValueError(f"time limit {value!r}: {carried} Slurm would not refuse it but carry it silently "
                         f"(time_str2secs in src/common/parse_time.c adds d*86400 + h*3600 + m*60 + s) and "
                         f"run {format_time(seconds)}; write {format_time(seconds)!r} if that is meant")
    if seconds > TIME_S_MAX:
        raise ValueError(f"time limit {value!r} ({seconds} s) is more than Slurm can hold: at most "
                         f"{format_time(TIME_S_MAX)} ({TIME_S_MAX} s; Slurm counts seconds in a C int, "
                         "time_str2secs in src/common/parse_time.c, and would silently wrap a larger one)")
    return seconds


HF_PREFIX = "hf:"


def _init_from(value: str) -> str:
    """training.init_from: "hf:" and an absolute directory (a Hugging Face model: config.json and
    safetensors), as the job's tasks see it. Other sources are refused by name, so a later "megatron:"
    form stays open."""
    if not value.startswith(HF_PREFIX):
        head = value.split(":", 1)[0] + ":" if ":" in value[:20] else ""
        raise ValueError(f"{value[:60]!r} is not a source this tool converts: write hf:/ABSOLUTE/PATH, a Hugging "
                         f"Face model directory{f' ({head} is not a known prefix)' if head else ''}")
    path = value[len(HF_PREFIX):]
    if not path.startswith("/"):
        raise ValueError(f"{value[:60]!r}: the path after hf: must be absolute (the job's tasks resolve it on the "
                         "nodes, not from where you submit)")
    if not path.strip("/"):
        raise ValueError(f"{value[:60]!r}: / is not a model directory; give the directory with config.json")
    if "\x00" in path:
        raise ValueError("a path cannot hold a NUL byte")
    path_fits(path)
    return value


Bounded = Annotated[str, AfterValidator(_text_fits)]
Name = Annotated[str, StringConstraints(pattern=NAME_RE)]
SlurmWord = Annotated[str, StringConstraints(pattern=SLURM_WORD_RE), AfterValidator(_text_fits)]
SafePath = Annotated[str, StringConstraints(pattern=SAFE_PATH_RE), AfterValidator(path_fits)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_RE), AfterValidator(_text_fits)]
# Free text is quoted wherever it is used, but a NUL byte cannot be passed to any program.
Text = Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\x00]*$"), AfterValidator(_text_fits)]
AbsPath = Annotated[str, StringConstraints(min_length=2, pattern=r"^/[^\x00]*$"), AfterValidator(path_fits)]
TimeLimit = Union[str, int]
Memory = Annotated[str, StringConstraints(pattern=r"^[0-9]+[KMGT]?$"), AfterValidator(_mem_fits)]
InitFrom = Annotated[str, AfterValidator(_init_from)]


def _no_items() -> list[Any]:
    """default_factory of the list fields, instead of `list` (start-up, issue 15). pydantic asks
    every default factory whether it takes the validated data (pydantic 2.14
    _internal/_fields.py takes_validated_data_argument: inspect.signature(factory)); for the
    builtin `list` inspect parses its text signature with tokenize, whose first use compiles
    tokenize's large regex, 10-20 ms of a `validate`. A plain function's signature costs nothing."""
    return []


class SpecModel(Strict):
    """A spec section: no type coercion (strict) and finite numbers only. (clusters.py's models
    share Strict, not this.)"""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class RunSpec(SpecModel):
    name: Name = Field(description="Run name; job names become <run-id>-<stage>. Letters, digits, '.', '_', '-'.")
    workdir: SafePath = Field(
        description="Run directory on storage shared by all nodes (absolute). Plans, scripts and records live here."
    )
    log_dir: Optional[SafePath] = Field(
        default=None, description="Directory for Slurm stdout/stderr logs (absolute). Default: <workdir>/logs."
    )
    ship_code: bool = Field(
        default=True,
        description="At submit, put this lingjun_slurm (as a wheel, unpacked) in the run directory; built-in stages "
                    "import it from there (PYTHONPATH), so images need not have it.",
    )
    ship_wheels: list[AbsPath] = Field(
        default_factory=_no_items,
        description="More wheel files to ship the same way (e.g. megatron-core built for the image's Python).",
    )


class Resources(SpecModel):
    """Slurm resources of one stage. Unset fields fall back to cluster.defaults."""

    partition: Optional[SlurmWord] = Field(default=None, description="Slurm partition (--partition).")
    nodes: Optional[int] = Field(default=None, ge=1, le=NODES_MAX, description="Number of nodes (--nodes).")
    tasks_per_node: Optional[int] = Field(
        default=None, ge=1, le=TASKS_MAX, description="Tasks per node (--ntasks-per-node). Train: one per GPU."
    )
    gpus_per_node: Optional[int] = Field(default=None, ge=0, le=64, description="GPUs per node (--gpus-per-node); 0 for none.")
    cpus_per_task: Optional[int] = Field(default=None, ge=1, le=4096, description="CPUs per task (--cpus-per-task).")
    mem: Optional[Memory] = Field(default=None, description='Memory per node (--mem), e.g. "64G"; "0" for all of it.')
    time: Optional[TimeLimit] = Field(default=None, description=f"Time limit (--time): {TIME_HELP}; after the first "
                                                                "field, minutes and seconds under 60 and hours under "
                                                                "24 (Slurm would carry 25:99:99 silently).")
    exclusive: Optional[bool] = Field(default=None, description="Whole nodes (--exclusive); default from cluster.exclusive.")

    @field_validator("time", mode="before")
    @classmethod
    def _time_parses(cls, value: TimeLimit | None) -> TimeLimit | None:
        if value is not None:  # before coercion: YAML's true must not become 1 minute
            check_time(value)
        return value


class NetworkSpec(SpecModel):
    profile: Optional[Name] = Field(
        default=None, description="Network profile name (see `lingjun-slurm nccl-env --list`)."
    )
    instance_type: Optional[Text] = Field(
        default=None, description="Instance type / VM size that selects a profile, e.g. ml.gu7xf.8xlarge-gu108."
    )
    overrides: dict[EnvName, Optional[Text]] = Field(
        default_factory=dict, description="Per-variable overrides; a null value unsets the profile's variable."
    )


class ClusterSpec(SpecModel):
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="NCCL / RDMA network profile.")
    account: Optional[SlurmWord] = Field(default=None, description="Slurm account (--account).")
    qos: Optional[SlurmWord] = Field(default=None, description="Quality of service (--qos).")
    reservation: Optional[SlurmWord] = Field(default=None, description="Reservation (--reservation).")
    constraint: Optional[Annotated[str, StringConstraints(pattern=CONSTRAINT_RE), AfterValidator(_text_fits)]] = Field(
        default=None, description="Node features (--constraint), e.g. 'a100&ib'."
    )
    exclusive: bool = Field(default=False, description="Ask for whole nodes for every stage (--exclusive).")
    sbatch_extra: dict[Bounded, Union[Bounded, int, bool]] = Field(
        default_factory=dict,
        description="Extra sbatch options from an allow-list (mail-type, mail-user, comment, exclude, ...).",
    )
    defaults: Resources = Field(default_factory=Resources, description="Resources every stage starts from.")
    stages: dict[Bounded, Resources] = Field(
        default_factory=dict, description="Per-stage resources for preprocess, merge, train, checkpoint."
    )


class Mount(SpecModel):
    src: SafePath = Field(description="Host path (absolute).")
    dst: SafePath = Field(description="Path inside the container (absolute).")
    flags: list[Literal["ro", "rw", "nosuid", "nodev", "noexec", "rbind", "bind", "private", "rprivate", "slave",
                        "rslave", "shared", "rshared", "x-create=dir", "x-create=file", "x-create=auto"]] = Field(
        default_factory=_no_items, description="Mount flags, joined with '+' for pyxis (e.g. [ro])."
    )


class ContainerSpec(SpecModel):
    runtime: Literal["pyxis", "none"] = Field(
        default="pyxis", description="'pyxis' runs stages in an enroot container; 'none' runs on the host."
    )
    image: Optional[Text] = Field(
        default=None,
        description="Image: [USER@][REGISTRY#]IMAGE[:TAG], REGISTRY/IMAGE[:TAG] (enroot >= 4.0; docs/images.md), "
                    "or a .sqsh path starting with / or ./.",
    )
    enroot_version: Optional[Bounded] = Field(
        default=None,
        description="enroot version on the cluster's nodes (`enroot version`, e.g. '3.5.0'), when known: "
                    "below 4.0 a REGISTRY/IMAGE reference is refused with its REGISTRY#IMAGE spelling.",
    )
    mounts: list[Union[Bounded, Mount]] = Field(
        default_factory=_no_items, description="Bind mounts as SRC:DST[:FLAGS] strings or {src, dst, flags}."
    )
    workdir: Optional[SafePath] = Field(
        default=None, description="Working directory inside the container (--container-workdir). Default: the "
                                  "directory the stage's batch script runs in (the run directory).")
    mount_home: bool = Field(default=False, description="Mount the user's home (--container-mount-home).")
    remap_root: bool = Field(default=False, description="Appear as root inside (--container-remap-root).")
    writable: bool = Field(default=True, description="Writable root filesystem (--container-writable).")
    name: Optional[Name] = Field(
        default=None,
        description="Name the container for reuse across the srun steps of one job (--container-name). The name "
                    "used is <name>-<run key>-<image key>-<job id>, and each job removes its container at its end "
                    "(docs/rendering.md#containers).",
    )
    stage: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: a first job of the chain imports a registry image once (enroot import) into "
                    "cache_dir, keyed by its digest, and every stage runs that .sqsh; never: every srun imports "
                    "the image itself. A .sqsh image is always used as it is.",
    )
    cache_dir: Optional[SafePath] = Field(
        default=None,
        description="Host directory on shared storage for staged images (yours, not writable by others). "
                    "Default: <workdir>/images.",
    )
    env_passthrough: list[EnvName] = Field(
        default_factory=_no_items,
        description="More host variables to force into the container (--container-env), beyond those the job sets.",
    )


class Tokenizer(SpecModel):
    type: Literal["huggingface", "gpt2-bpe", "sentencepiece", "null"] = Field(
        description="Tokenizer kind; no downloads happen at run time."
    )
    path: Optional[AbsPath] = Field(
        default=None, description="huggingface: tokenizer.json or its directory; sentencepiece: the .model file."
    )
    vocab_file: Optional[AbsPath] = Field(default=None, description="gpt2-bpe: vocab.json.")
    merge_file: Optional[AbsPath] = Field(default=None, description="gpt2-bpe: merges.txt.")
    vocab_size: Optional[int] = Field(default=None, ge=2, le=DIM_MAX, description="null: vocabulary size.")
    add_special_tokens: Optional[bool] = Field(
        default=None,
        description="huggingface: put the post-processor's special tokens (e.g. BOS) into the ids, as Megatron-LM's "
                    "--tokenizer-hf-include-special-tokens does. Default: true.",
    )


class DataSpec(SpecModel):
    tool: Literal["builtin", "megatron-lm"] = Field(
        default="builtin",
        description="builtin: lingjun_slurm's streaming preprocessor; megatron-lm: the image's preprocess_data.py.",
    )
    inputs: list[AbsPath] = Field(default_factory=_no_items, description="jsonl files or globs (absolute).")
    json_keys: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$", max_length=NAME_BYTES_MAX)]] = Field(
        default_factory=lambda: ["text"], description="JSON keys to tokenize; one output dataset per key."
    )
    train_key: Optional[Bounded] = Field(default=None, description="Which json key trains the model (default: the first).")
    tokenizer: Optional[Tokenizer] = Field(default=None, description="Tokenizer used by preprocessing and training.")
    append_eod: bool = Field(default=True, description="Append an end-of-document token to every document.")
    shards: int = Field(default=1, ge=1, le=10000, description="Preprocess array size (one task per shard).")
    # Slurm's `--array=0-N%M`: slurmctld parses the number after `%` with atoi into the array's
    # max_run_tasks (> 0 sets the limit: src/slurmctld/job_mgr.c _create_job_array, slurm-22-05-8-1
    # lines 5019-5024) and job_array_start_test holds further tasks with reason JobArrayTaskLimit
    # while tot_run_tasks >= max_run_tasks (lines 16200-16216).
    max_running: Optional[int] = Field(
        default=None, ge=1, le=10000,
        description="At most this many preprocess array tasks run at once (Slurm's --array=0-N%max_running; "
                    "the local executor honours it too). Default (unset): no limit beyond the cluster's.",
    )
    workers: Optional[int] = Field(
        default=None, ge=1, le=1024,
        description="Tokenizer worker processes per shard. Default (unset): builtin chooses in the task from its CPUs "
                    "and the tokenizer (huggingface, gpt2-bpe fast path, sentencepiece: 1 per 16 CPUs; null and "
                    "the GPT-2 Python path: 1 per CPU, at most 32); megatron-lm gets the task's CPUs ($(nproc)).",
    )
    output_prefix: Optional[AbsPath] = Field(
        default=None, description="Output prefix; files are {prefix}_{key}_document.bin/.idx. Default: <workdir>/data/corpus."
    )
    prefix: Optional[AbsPath] = Field(
        default=None, description="Existing dataset prefix for training when preprocess is skipped (no .bin/.idx suffix)."
    )
    split: Annotated[str, StringConstraints(pattern=r"^[0-9]+(,[0-9]+){0,2}$")] = Field(
        default="969,30,1", description="Train/valid/test split weights."
    )

    @field_validator("split")
    @classmethod
    def _split_normalizes(cls, value: str) -> str:
        """Megatron divides each weight by their sum as float64 (parse_and_normalize_split and
        normalize, megatron/core/datasets at core_v0.16.1): a zero or infinite sum gives NaN splits."""
        weights = [float(w) for w in value.split(",")]
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"split weights must be finite as float64 numbers; got {value[:40]!r}...")
        if sum(weights) == 0:
            raise ValueError(f"split {value!r}: the weights must not all be 0 (Megatron divides by their sum)")
        return value


class ModelSpec(SpecModel):
    preset: Optional[Name] = Field(default=None, description="Named architecture (gpt-126m, gpt-1.3b, llama3-8b, tiny).")
    num_layers: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    hidden_size: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    num_attention_heads: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    num_query_groups: Optional[int] = Field(default=None, ge=1, le=DIM_MAX, description="Grouped-query attention groups.")
    ffn_hidden_size: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    seq_length: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    max_position_embeddings: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    vocab_size: Optional[int] = Field(default=None, ge=2, le=DIM_MAX,
                                      description="Only for the null tokenizer / synthetic runs.")
    normalization: Optional[Literal["LayerNorm", "RMSNorm"]] = None
    activation: Optional[Literal["gelu", "swiglu"]] = None
    position_embedding: Optional[Literal["learned_absolute", "rope"]] = None
    rotary_base: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)
    untie_embeddings: Optional[bool] = None
    bias_linear: Optional[bool] = None
    hidden_dropout: Optional[float] = Field(default=None, ge=0, lt=1)
    attention_dropout: Optional[float] = Field(default=None, ge=0, lt=1)


class ParallelismSpec(SpecModel):
    tensor: int = Field(default=1, ge=1, le=WORLD_MAX, description="Tensor parallel size.")
    pipeline: int = Field(default=1, ge=1, le=WORLD_MAX, description="Pipeline parallel size.")
    context: int = Field(default=1, ge=1, le=WORLD_MAX, description="Context parallel size.")
    sequence_parallel: bool = Field(default=False, description="Sequence parallelism (needs tensor > 1).")
    micro_batch: int = Field(default=1, ge=1, le=BATCH_MAX, description="Micro batch size per data-parallel rank.")
    global_batch: int = Field(default=8, ge=1, le=BATCH_MAX, description="Global batch size.")
    distributed_optimizer: bool = Field(default=False, description="Shard optimizer state over data parallel ranks.")
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False


class RecomputeSpec(SpecModel):
    granularity: Optional[Literal["selective", "full"]] = None
    method: Optional[Literal["uniform", "block"]] = None
    num_layers: Optional[int] = Field(default=None, ge=1, le=DIM_MAX)


class MegatronLMSpec(SpecModel):
    version: Union[Bounded, float] = Field(
        description="Megatron-LM / megatron-core version in the image, e.g. '0.16.1' or 'core_v0.16.1'."
    )
    path: AbsPath = Field(default="/opt/megatron-lm", description="Megatron-LM checkout inside the image.")


class TrainingSpec(SpecModel):
    entrypoint: Literal["builtin", "megatron-lm"] = Field(
        default="builtin",
        description="builtin: lingjun_slurm's megatron-core trainer; megatron-lm: the image's pretrain_gpt.py.",
    )
    iterations: int = Field(default=1000, ge=1, le=COUNT_MAX)
    lr: float = Field(default=3.0e-4, gt=0)
    min_lr: float = Field(default=3.0e-5, ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    lr_warmup_iters: int = Field(default=0, ge=0, le=COUNT_MAX)
    lr_decay_iters: Optional[int] = Field(default=None, ge=1, le=COUNT_MAX)
    weight_decay: float = Field(default=0.1, ge=0)
    clip_grad: float = Field(default=1.0, ge=0)
    adam_beta1: float = Field(default=0.9, gt=0, lt=1)
    adam_beta2: float = Field(default=0.95, gt=0, lt=1)
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    seed: int = Field(default=1234, ge=0, le=SEED_MAX)
    recompute: RecomputeSpec = Field(default_factory=RecomputeSpec)
    log_interval: int = Field(default=10, ge=1, le=COUNT_MAX)
    eval_interval: int = Field(default=1000, ge=1, le=COUNT_MAX)
    eval_iters: int = Field(default=10, ge=0, le=COUNT_MAX)
    save_grace_s: int = Field(
        default=300, ge=60, le=3600,
        description="Seconds before the time limit at which Slurm signals the job to save and exit.",
    )
    max_restarts: int = Field(default=3, ge=0, le=100, description="Requeues after a time-limit save.")
    preflight: Optional[bool] = Field(
        default=None,
        description="Check every allocated node before training (GPUs, the image starting, the NCCL devices and "
                    "interface against the node's sysfs, one shared workdir and checkpoint dir with room for two "
                    "checkpoints, clocks); a failed node is excluded and the job requeued. Default: on when the "
                    "train stage has GPUs (docs/fault-tolerance.md).",
    )
    preflight_collective_timeout: int = Field(
        default=60, ge=0, le=3600,
        description="Seconds the pre-flight's collective smoke test may take: all_reduce and all_gather at a few "
                    "sizes over the whole allocation in the run's image with the job's NCCL environment (gloo on "
                    "CPUs), judged against the network's published floors and the allocation's own median; a slow "
                    "node is narrowed down (pairs of nodes) and excluded like any bad node. A hang past this bound "
                    "fails the smoke test, not the job's time. 0: no collective smoke test "
                    "(docs/fault-tolerance.md).",
    )
    hang_timeout: int = Field(
        default=1800, ge=0, le=HANG_MAX,
        description="Seconds without a new iteration after which every rank's Python stacks are collected into the "
                    "run directory and the step is ended, to resume from the last checkpoint; 0: no watchdog. "
                    "Raised at run time to the log interval times the measured step time when that is longer.",
    )
    hang_startup_timeout: int = Field(
        default=3600, ge=0, le=HANG_MAX,
        description="Seconds allowed before the first iteration (model build, checkpoint load, dataset indexes); "
                    "0: no limit before the first iteration.",
    )
    exclude_bad_nodes: int = Field(
        default=2, ge=0, le=1000,
        description="At most this many nodes excluded from the job's requeues when a failure is attributed to "
                    "them (pre-flight, a hang's stuck rank, a node failure), never so many that the job no longer "
                    "fits its partition; 0: never exclude.",
    )
    straggler_action: Literal["off", "log", "exclude", "requeue"] = Field(
        default="log",
        description="What the watchdog does with a straggler, a rank whose own step time (compute, without the wait "
                    "in collectives where the trainer tells them apart) stays above straggler_threshold x the median "
                    "for straggler_windows windows in a row: log (name it in the job log and `status`), exclude (and "
                    "exclude its node at the next requeue), requeue (requeue now without its node, when the time "
                    "saved over the remaining iterations exceeds this run's measured restart cost); off: not "
                    "measured (docs/fault-tolerance.md).",
    )
    straggler_threshold: float = Field(
        default=1.2, gt=1, le=100,
        description="A rank is slow in a window when its median step time is above this many times the median of "
                    "its peers (the ranks of its pipeline stage).",
    )
    straggler_windows: int = Field(
        default=10, ge=1, le=10000,
        description="Consecutive slow windows before a rank is named a straggler.",
    )
    straggler_window_s: int = Field(
        default=60, ge=1, le=HANG_MAX,
        description="Length of one straggler window in seconds.",
    )
    drain_bad_nodes: bool = Field(
        default=False,
        description="Also drain an excluded node with the reason (scontrol needs Slurm operator rights, which the "
                    "admin grants).",
    )
    cpu_bind: Optional[Annotated[str, StringConstraints(pattern=CPU_BIND_RE)]] = Field(
        default=None,
        description="srun --cpu-bind for the train tasks: 'profile' (the network profile's published "
                    "CPU/GPU topology, e.g. Azure ND H100/H200 v5), or a value such as cores, ldoms, "
                    "map_ldom:0,0,1,1 or mask_cpu:0xff,...; default: Slurm's own binding.",
    )
    extra_args: list[Text] = Field(
        default_factory=_no_items, description="More pretrain_gpt.py arguments, passed verbatim (each one quoted)."
    )
    init_from: Optional[InitFrom] = Field(
        default=None,
        description="Start from a Hugging Face model: hf:/ABSOLUTE/DIR (config.json and safetensors, as the nodes "
                    "see it). Before the first iteration the train stage converts it once to an iteration-0 "
                    "torch_dist checkpoint for this spec's TP/PP and vocabulary padding (the logits proven equal) and "
                    "loads it with finetune semantics: iteration 0, no optimizer or RNG state. A requeue resumes "
                    "from the run's own checkpoints, never from the model again (docs/checkpoints.md).",
    )


class PlanningSpec(SpecModel):
    """What `lingjun-slurm plan` cannot read from the rest of the spec (docs/planning.md)."""

    gpu: Optional[Literal["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]] = Field(
        default=None,
        description="GPU of the train nodes; default: the network profile's (azure-nd-h100-v5, azure-nd-h200-v5), "
                    "else unknown (Lingjun instance types and azure-nd-a100-v4 do not say which).",
    )
    margin: float = Field(default=0.10, ge=0, lt=1,
                          description="Share of GPU memory kept free for the CUDA context, NCCL buffers, "
                                      "the allocator's fragmentation and temporary buffers.")
    mfu: float = Field(default=0.40, gt=0, le=1,
                       description="Model FLOPs utilisation assumed for the time estimates (measured: "
                                   "metrics.jsonl's mfu).")
    storage_gbps: float = Field(default=5.0, gt=0, le=10000,
                                description="Write bandwidth of the checkpoint directory, GB/s, for the save time.")
    attention: Optional[Literal["local", "flash"]] = Field(
        default=None,
        description="Attention kernels: flash (TransformerEngine fused / flash-attention) or local (megatron-core's "
                    "unfused, keeps the s x s scores); default: flash when transformer_engine, else local.",
    )
    transformer_engine: Optional[bool] = Field(
        default=None, description="Whether the image has TransformerEngine; default: unknown (flash assumed).")
    vocab_size: Optional[int] = Field(default=None, ge=2, le=DIM_MAX,
                                      description="Tokenizer vocabulary when plan cannot read the tokenizer here.")


class ExportHFSpec(SpecModel):
    """checkpoint.export_hf: the checkpoint stage ends by exporting the latest checkpoint to Hugging Face."""

    dir: Optional[AbsPath] = Field(
        default=None,
        description="Where the Hugging Face models go, one directory per exported iteration (iter_NNNNNNN). "
                    "Default: <workdir>/hf.")
    dtype: Literal["bf16", "fp32"] = Field(default="bf16", description="Data type of the written safetensors.")
    check: bool = Field(default=True, description="Prove the export: run both models on a fixed batch on the CPU "
                                                 "and compare the logits; a mismatch fails the stage.")


class CheckpointSpec(SpecModel):
    dir: Optional[AbsPath] = Field(default=None, description="Checkpoint directory. Default: <workdir>/checkpoints.")
    save_interval: int = Field(default=1000, ge=1, le=COUNT_MAX)
    format: Literal["torch_dist"] = Field(default="torch_dist", description="Checkpoint format.")
    keep_last: int = Field(default=3, ge=1, le=COUNT_MAX, description="Retention: keep this many newest checkpoints.")
    copy_to: Optional[Text] = Field(
        default=None, description="Copy/upload target: an absolute path or an fsspec URL (az://, s3://, ...)."
    )
    verify: bool = Field(default=True, description="Verify completeness and hashes before retention and copy.")
    export_hf: Optional[ExportHFSpec] = Field(
        default=None,
        description="Export the latest checkpoint as a Hugging Face model (safetensors, config.json) after "
                    "verification: {dir, dtype: bf16|fp32, check}. Llama- and GPT-2-style models "
                    "(docs/checkpoints.md).",
    )


class MonitoringSpec(SpecModel):
    """Where the run's numbers go besides its own records (docs/monitoring.md, docs/report.md)."""

    gpu_hour_price: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Price of one GPU-hour, in your currency: the goodput ledger (status --goodput, report) adds "
                    "the cost. Default: clusters.yaml's gpu_hour_price for the cluster, else no cost.")
    textfile_dir: Optional[AbsPath] = Field(
        default=None,
        description="A node_exporter textfile collector directory of the jobs' own (e.g. "
                    "/var/lib/prometheus/node-exporter-lingjun-slurm, never the system one): the hang watchdog keeps "
                    "one lingjun-slurm_<job>_<node>.prom file there on the batch host while the job runs, with the "
                    "series the trainer stages in <run_dir>/textfile. Default: clusters.yaml's textfile_dir, else "
                    "none (no files).")


class StageToggle(SpecModel):
    skip: bool = Field(default=False, description="Leave this built-in stage out of the chain.")


class CommandStage(SpecModel):
    name: Name = Field(description="Stage name (unique; not a built-in name).")
    command: Text = Field(description="Shell command run by bash inside the stage (this is meant to run).")
    before: Optional[Literal["preprocess", "merge", "train", "checkpoint"]] = Field(
        default=None, description="Place the stage just before this built-in stage."
    )
    after: Optional[Name] = Field(
        default=None,
        description="Place the stage just after this built-in stage, or after an earlier command stage (by name).",
    )
    dependency: Literal["afterok", "afterany", "afternotok"] = Field(
        default="afterok", description="How it depends on the stage before it."
    )
    container: bool = Field(default=True, description="Run inside the run's container (when runtime is pyxis).")
    resources: Resources = Field(default_factory=Resources)


class StagesSpec(SpecModel):
    preprocess: StageToggle = Field(default_factory=StageToggle)
    merge: StageToggle = Field(default_factory=StageToggle)
    train: StageToggle = Field(default_factory=StageToggle)
    checkpoint: StageToggle = Field(default_factory=StageToggle)
    commands: list[CommandStage] = Field(default_factory=_no_items, description="User command stages.")


class Spec(SpecModel):
    """One training run: data preprocessing, Megatron GPT training and checkpoint handling."""

    model_config = ConfigDict(extra="forbid", title="lingjun-slurm spec")

    version: Literal[1] = Field(default=SPEC_VERSION, description="Spec format version.")

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_an_integer(cls, value: Any) -> Any:
        if isinstance(value, (bool, float)):  # pydantic's Literal[1] takes True and 1.0 even when strict
            raise ValueError(f"Input should be 1 (got {value!r})")
        return value
    run: RunSpec = Field(description="Name and shared directories of the run.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Slurm resources, account and network.")
    container: ContainerSpec = Field(default_factory=ContainerSpec, description="pyxis/enroot container, or none.")
    megatron_lm: Optional[MegatronLMSpec] = Field(
        default=None, description="The image's Megatron-LM, needed when a stage uses it."
    )
    env: dict[EnvName, Text] = Field(default_factory=dict, description="Variables set in every stage.")
    data: DataSpec = Field(default_factory=DataSpec, description="Corpus, tokenizer and preprocessing.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="GPT architecture: a preset plus overrides.")
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec, description="TP/PP/CP, batch sizes; DP is derived.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Entrypoint, schedule, precision, restarts.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Saving, verification, retention, copy.")
    planning: PlanningSpec = Field(default_factory=PlanningSpec,
                                   description="Inputs of the memory and time estimate (lingjun-slurm plan).")
    stages: StagesSpec = Field(default_factory=StagesSpec, description="Skip built-in stages, add command stages.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec,
                                       description="Cost of a GPU-hour; node_exporter textfile directory.")


# ---- Hugging Face conversion paths (training.init_from, checkpoint.export_hf) ----------------------
def init_from_path(spec: Spec) -> Optional[str]:
    """The Hugging Face directory of training.init_from (without "hf:"), or None."""
    value = spec.training.init_from
    return value[len(HF_PREFIX):] if value else None


def init_dir(spec: Spec) -> str:
    """Where the train stage writes the converted iteration-0 checkpoint: outside the run's checkpoint
    directory, so retention never counts it and a resume never mistakes it for the run's own."""
    return f"{spec.run.workdir.rstrip('/')}/hf-init"


def export_dir(spec: Spec) -> Optional[str]:
    """checkpoint.export_hf's directory (one iter_NNNNNNN model in it per export), or None."""
    exp = spec.checkpoint.export_hf
    if exp is None:
        return None
    return exp.dir or f"{spec.run.workdir.rstrip('/')}/hf"
