"""NCCL network profiles: lookup by name or instance type, overrides, and rendering.

The same resolved block feeds the sbatch scripts, `lingjun-slurm nccl-env` and the
cluster-init project's /etc/nccl.conf, so the three can never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from .common.errors import UsageError
from .presets import load
from .common.shell import quote

__all__ = ["FORMATS", "SCOPES", "EnvVar", "NcclReference", "NetworkEnv", "Profile", "Revision", "get_profile",
           "node_file_names", "profile_for_instance", "profiles", "quote", "render", "resolve", "unset_refusal",
           "unset_rules"]

FORMATS = ("sh", "env", "nccl.conf", "json")
# Where a profile variable is set. "jobs" (the default): every job the tool renders (training and the
# other stages, nccl-tests), `nccl-env` and /etc/nccl.conf. "nccl-tests": only `lingjun-slurm nccl-test`
# jobs, where it replaces a "jobs" variable of the same name (in its place) or is added after them:
# what a source sets for its benchmark runs only stays out of training jobs.
SCOPES = ("jobs", "nccl-tests")


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    reason: str


@dataclass(frozen=True)
class NcclReference:
    """A published nccl-tests figure: `op`_perf busbw of at least busbw_gbps GB/s at message size
    `size` (nccl-tests notation such as "16G", or "peak" for the best size) on nodes x gpus_per_node."""

    op: str
    busbw_gbps: float
    size: str
    nodes: int
    gpus_per_node: int
    source: str
    gpu: str = ""  # the GPU model it was measured on ("H100"): the smoke test matches torch's device name


@dataclass(frozen=True)
class PortRate:
    """One network port's line rate (Gb/s) and the ports per node, as the profile's own sources name
    them: the collective smoke test's cross-node floor (docs/fault-tolerance.md)."""

    gbps: float
    ports_per_node: int
    source: str


@dataclass(frozen=True)
class Revision:
    """One upstream file a profile's values were taken from, at a fixed commit."""

    repo: str
    path: str
    commit: str
    date: str
    used_for: str


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    instance_types: tuple[str, ...]
    env: tuple[EnvVar, ...]  # scope "jobs"
    mounts: tuple[str, ...] = ()
    nccl_references: tuple[NcclReference, ...] = ()
    nccl_tests_env: tuple[EnvVar, ...] = ()  # scope "nccl-tests"
    revisions: tuple[Revision, ...] = ()
    # srun --cpu-bind for the train stage's tasks where the SKU's CPU/GPU topology is published:
    # (tasks per node it is for, value, source); used when training.cpu_bind is "profile".
    cpu_bind: tuple[int, str, str] | None = None
    port: PortRate | None = None

    def env_for(self, scope: str = "jobs") -> tuple[EnvVar, ...]:
        """The profile's variables in a scope (see SCOPES), in order."""
        if scope not in SCOPES:
            raise UsageError(f"unknown network scope {scope!r}; choose one of {', '.join(SCOPES)}")
        if scope == "jobs":
            return self.env
        extra = {v.name: v for v in self.nccl_tests_env}
        merged = [extra.pop(v.name, v) for v in self.env]
        return tuple(merged + [v for v in self.nccl_tests_env if v.name in extra])


@dataclass(frozen=True)
class NetworkEnv:
    """A profile after the spec's overrides: what a job exports, in order."""

    profile: str
    description: str
    vars: tuple[EnvVar, ...]
    unset: tuple[str, ...] = field(default_factory=tuple)
    mounts: tuple[str, ...] = field(default_factory=tuple)
    # The unset variables that the node's /etc/nccl.conf sets: exported with the value NCCL reads as
    # "not set" (nccl_unset.yaml), since NCCL would take the file's value for an unset one.
    cleared: tuple[EnvVar, ...] = field(default_factory=tuple)

    def names(self) -> list[str]:
        """Every variable the block exports (the cleared ones too): what --container-env lists, so
        that neither the image's ENV nor its own /etc/nccl.conf puts a value back."""
        return [v.name for v in self.vars] + [v.name for v in self.cleared]


def _scope(entry: Mapping[str, object], profile: str) -> str:
    scope = str(entry.get("scope", "jobs"))
    if scope not in SCOPES:
        raise ValueError(f"network profile {profile}: {entry['name']}: unknown scope {scope!r} ({', '.join(SCOPES)})")
    return scope


def profiles() -> dict[str, Profile]:
    out: dict[str, Profile] = {}
    for name, raw in load("network_profiles.yaml").items():
        scoped: dict[str, list[EnvVar]] = {scope: [] for scope in SCOPES}
        for e in raw["env"]:
            scoped[_scope(e, name)].append(EnvVar(e["name"], str(e["value"]), e["reason"]))
        out[name] = Profile(
            name=name,
            description=raw["description"],
            source=raw["source"],
            instance_types=tuple(raw.get("instance_types") or ()),
            env=tuple(scoped["jobs"]),
            nccl_tests_env=tuple(scoped["nccl-tests"]),
            revisions=tuple(Revision(repo=r["repo"], path=r["path"], commit=str(r["commit"]), date=str(r["date"]),
                                     used_for=" ".join(str(r["used_for"]).split()))
                            for r in raw.get("revision") or ()),
            mounts=tuple(raw.get("mounts") or ()),
            cpu_bind=(int(raw["cpu_bind"]["tasks_per_node"]), str(raw["cpu_bind"]["value"]),
                      " ".join(str(raw["cpu_bind"]["source"]).split())) if raw.get("cpu_bind") else None,
            nccl_references=tuple(
                NcclReference(op=r["op"], busbw_gbps=float(r["busbw_gbps"]), size=str(r["size"]), nodes=int(r["nodes"]),
                              gpus_per_node=int(r["gpus_per_node"]), source=" ".join(str(r["source"]).split()),
                              gpu=str(r.get("gpu") or ""))
                for r in raw.get("nccl_tests_reference") or ()),
            port=PortRate(gbps=float(raw["port"]["gbps"]), ports_per_node=int(raw["port"]["ports_per_node"]),
                          source=" ".join(str(raw["port"]["source"]).split())) if raw.get("port") else None,
        )
    return out


def get_profile(name: str) -> Profile:
    table = profiles()
    if name not in table:
        raise UsageError(f"unknown network profile {name!r}; known profiles: {', '.join(sorted(table))}")
    return table[name]


def profile_for_instance(instance_type: str) -> Profile:
    for prof in profiles().values():
        if instance_type in prof.instance_types:
            return prof
    known = sorted(t for p in profiles().values() for t in p.instance_types)
    raise UsageError(f"no network profile lists instance type {instance_type!r}; known: {', '.join(known)}")


def node_file_names(profile: Profile) -> frozenset[str]:
    """The variables the cluster-init project writes to the node's /etc/nccl.conf for this profile
    (render(..., "nccl.conf") of the "jobs" scope keeps the NCCL_* ones)."""
    return frozenset(v.name for v in profile.env if v.name.startswith("NCCL_"))


@dataclass(frozen=True)
class UnsetRule:
    """How a job undoes a variable /etc/nccl.conf sets: export `value` (None: it cannot)."""

    value: str | None
    source: str
    instead: str = ""


def unset_rules() -> dict[str, UnsetRule]:
    """nccl_unset.yaml: per NCCL variable, the value NCCL reads exactly as if it were not set."""
    raw = load("nccl_unset.yaml")
    rules = {name: UnsetRule("", f"{raw['integer_params']['source']}; {where}")
             for name, where in raw["integer_params"]["names"].items()}
    for name, entry in raw["strings"].items():
        rules[name] = UnsetRule(entry["value"], " ".join(str(entry["source"]).split()), str(entry.get("instead", "")))
    return rules


def unset_refusal(profile: Profile, name: str) -> str | None:
    """Why a spec cannot unset `name` on this profile's nodes, or None when it can."""
    if name not in node_file_names(profile):
        return None
    rule = unset_rules().get(name)
    if rule is not None and rule.value is not None:
        return None
    why = (f"NCCL applies the node's /etc/nccl.conf (profile {profile.name} sets {name} there) to every variable "
           f"a job leaves unset, and no value of {name} means 'not set'")
    if rule is None:
        return f"{why} that lingjun-slurm knows of (lingjun_slurm/presets/nccl_unset.yaml): give a value instead"
    return f"{why} ({rule.source}): {rule.instead}"


def resolve(profile: Profile, overrides: Mapping[str, str | None] | None = None, scope: str = "jobs") -> NetworkEnv:
    """The profile's variables in `scope` ("nccl-tests" for nccl-test jobs), then the overrides:
    a value replaces or adds a variable, None removes it. A removed variable that the node's
    /etc/nccl.conf sets is exported with the value NCCL reads as not set (NetworkEnv.cleared);
    one without such a value is refused (UsageError), as the spec's checks do with its line."""
    overrides = dict(overrides or {})
    result: list[EnvVar] = []
    unset: list[str] = []
    for var in profile.env_for(scope):
        if var.name not in overrides:
            result.append(var)
            continue
        new = overrides.pop(var.name)
        if new is None:
            unset.append(var.name)
        else:
            result.append(EnvVar(var.name, str(new), f"overridden in the spec (profile {profile.name}: {var.value})"))
    for name, value in overrides.items():
        if value is None:
            unset.append(name)
        else:
            result.append(EnvVar(name, str(value), "set in the spec"))
    cleared = []
    for name in unset:
        if name not in node_file_names(profile):
            continue
        refusal = unset_refusal(profile, name)
        if refusal:
            raise UsageError(f"cannot unset {name}: {refusal}")
        rule = unset_rules()[name]
        cleared.append(EnvVar(name, str(rule.value), rule.source))
    return NetworkEnv(profile.name, profile.description, tuple(result), tuple(unset), profile.mounts, tuple(cleared))


def _no_newlines(env: NetworkEnv, fmt: str) -> None:
    for var in env.vars:
        if "\n" in var.value or "\r" in var.value:
            raise UsageError(f"{var.name}: a value with a newline cannot be written in {fmt} format")


def render(env: NetworkEnv, fmt: str) -> str:
    """Render a resolved block as sh (export lines), env (KEY=VALUE), nccl.conf or json."""
    if fmt == "json":
        doc = {
            "profile": env.profile,
            "description": env.description,
            "env": [{"name": v.name, "value": v.value, "reason": v.reason} for v in env.vars],
            "unset": list(env.unset),
            "cleared": [{"name": v.name, "value": v.value, "reason": v.reason} for v in env.cleared],
        }
        return json.dumps(doc, indent=2) + "\n"
    lines = [f"# NCCL network profile: {env.profile} ({env.description})"]
    if fmt == "sh":
        for var in env.vars:
            lines += [f"# {var.reason}", f"export {var.name}={quote(var.value)}"]
        cleared = {v.name: v for v in env.cleared}
        for name in env.unset:
            if name in cleared:
                lines += [f"# unset by the spec; the node's /etc/nccl.conf sets {name} and NCCL applies it to an unset",
                          "# variable, so export the value NCCL reads as not set (docs/network-profiles.md)",
                          f"export {name}={quote(cleared[name].value)}"]
            else:
                lines += ["# unset by the spec", f"unset {name}"]
    elif fmt in ("env", "nccl.conf"):
        _no_newlines(env, fmt)
        for var in env.vars:
            if fmt == "nccl.conf" and not var.name.startswith("NCCL_"):
                lines.append(f"# {var.name} is not an NCCL parameter: set it in the job environment")
                continue
            lines += [f"# {var.reason}", f"{var.name}={var.value}"]
        if fmt == "env":
            for var in env.cleared:
                lines += ["# unset by the spec: the value NCCL reads as not set, over /etc/nccl.conf's",
                          f"{var.name}={var.value}"]
    else:
        raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return "\n".join(lines) + "\n"
