"""The node side of the pre-flight: one task per node, writes DIR/<node>.json.

    python3 -m lingjun_slurm.stages preflight --plan PLAN.json --out DIR

Environment: SLURMD_NODENAME (the node; else the host name), SLURM_JOB_ID, SLURM_RESTART_COUNT,
SLURM_PROCID, LINGJUN_NODES (the job's nodes, space-separated, as the batch script expands
them), CUDA_VISIBLE_DEVICES (as Slurm sets it), the job's NCCL_* variables;
LINGJUN_PREFLIGHT_ROOT: a prefix for /sys, /proc and /etc (tests; "{node}" in it is the node's name); LINGJUN_PREFLIGHT_SHARE_TIMEOUT:
seconds to wait for the other nodes' tokens (else settings.preflight.share_timeout_s, else 60).

Checks (each {"name", "ok", "skipped", "detail"}):
  gpu-count       GPUs visible (nvidia-smi -L, else /proc/driver/nvidia/gpus/*) and usable through
                  CUDA_VISIBLE_DEVICES, as many as the train stage asks per node;
  ib-ports, roce-gid, socket-if
                  the job's NCCL environment against this node's sysfs, by lingjun-health
                  --only ... --no-drain --json with the network profile's thresholds;
  shared-workdir, shared-checkpoint-dir
                  a token written into <dir>/.preflight-<job>.<restart>/ as the task's first act
                  (its container has started by then) is read by every node; each node reads the
                  others' for the window (share timeout) after its own and records when it stopped,
                  so the judge measures a miss from the writer's start, not the reader's;
  free-space      room in the checkpoint directory for min_checkpoints checkpoints;
  clock           measurements for the judge (see `clock` below); judged there.

Standard library only (Python >= 3.8); the planner (for the checkpoint size) is imported lazily.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import MIN_CHECKPOINTS, SCHEMA, SHARE_TIMEOUT_S, file_name, knobs, token_dir_name, train_stage, write_json

HEALTH_PROGRAM = Path(__file__).resolve().parents[2] / "nodes" / "health" / "lingjun-health"
NCCL_CHECKS = ("ib-ports", "roce-gid", "socket-if")
POLL_S = 0.25
_statvfs = os.statvfs  # tests replace it


def _check(name: str, ok: bool, detail: str, skipped: bool = False) -> Dict[str, Any]:
    return {"name": name, "ok": bool(ok), "skipped": bool(skipped), "detail": detail}


# ---------------------------------------------------------------------------------- GPUs
def _visible(entries: List[str], indices: List[int], uuids: List[str]) -> List[int]:
    """The GPUs a CUDA_VISIBLE_DEVICES list selects, as the CUDA runtime reads it: indices or
    (prefixes of) UUIDs, up to the first entry that names no device."""
    got: List[int] = []
    for entry in entries:
        entry = entry.strip()
        pick = None
        if re.fullmatch(r"\d+", entry):
            if int(entry) < len(indices):
                pick = int(entry)
        elif entry.startswith(("GPU-", "MIG-")):
            pick = next((i for i, u in enumerate(uuids) if u and u.startswith(entry)), None)
        if pick is None:
            break
        if pick not in got:
            got.append(pick)
    return got


def check_gpus(want: int, root: str, env: Dict[str, str]) -> Dict[str, Any]:
    if not want:
        return _check("gpu-count", True, "the train stage asks for no GPUs", skipped=True)
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    listed: Optional[List[str]] = None
    uuids: List[str] = []
    source, why = "", ""
    if smi:
        try:
            proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, env=env,
                                  stdin=subprocess.DEVNULL)
            rows = re.findall(r"^GPU (\d+): .*?(?:\(UUID: ([^)\s]+)\))?\s*$", proc.stdout, re.M)
            if proc.returncode == 0 or rows:
                listed = [r[0] for r in rows]
                uuids = [r[1] for r in rows]
                source = "nvidia-smi -L"
            else:
                last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
                why = f"nvidia-smi -L failed (rc {proc.returncode}: {last[0][:120]})"
        except subprocess.TimeoutExpired:
            why = "nvidia-smi -L timed out after 20 s"
        except OSError as exc:
            why = f"nvidia-smi -L cannot run ({exc})"
    if listed is None:
        proc_dir = root + "/proc/driver/nvidia/gpus"
        try:
            listed = sorted(os.listdir(proc_dir))
            uuids = [""] * len(listed)
            source = "/proc/driver/nvidia/gpus"
        except OSError:
            reason = why or "no nvidia-smi"
            return _check("gpu-count", False, f"{reason} and no /proc/driver/nvidia/gpus: no GPU driver visible, "
                                              f"expected {want} GPUs")
    n = len(listed)
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        usable, where = n, f"{n} GPUs ({source})"
    else:
        entries = [e for e in cvd.split(",")] if cvd.strip() else []
        usable = len(_visible(entries, list(range(n)), uuids))
        where = f"{n} GPUs ({source}), {usable} of them in CUDA_VISIBLE_DEVICES={cvd}"
    if usable != want:
        return _check("gpu-count", False, f"{where}, expected {want}" + (f" ({why})" if why else ""))
    return _check("gpu-count", True, where)


# ---------------------------------------------------------------------------------- NCCL
def thresholds_name(profile: Optional[str]) -> str:
    """The lingjun-health thresholds for a network profile: the file of the same name, else tcp."""
    if profile and (HEALTH_PROGRAM.parent / "thresholds" / f"{profile}.conf").is_file():
        return profile
    return "tcp"


def health_config(plan: dict, gpus: int) -> str:
    stage = train_stage(plan) or {}
    lines = ["# written by lingjun_slurm.injob.preflight for this job's pre-flight",
             f"SKU={thresholds_name(stage.get('network_profile'))}", f"GPU_COUNT={gpus}"]
    for key, value in sorted((knobs(plan).get("thresholds") or {}).items()):
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", str(key)) or "\n" in str(value) or "\r" in str(value):
            raise ValueError(f"settings.preflight.thresholds: bad entry {key!r}")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def check_nccl(plan: dict, gpus: int, node: str, root: str, env: Dict[str, str]) -> List[Dict[str, Any]]:
    bash = shutil.which("bash", path=env.get("PATH"))
    if not bash:
        return [_check(c, False, "bash not found: lingjun-health cannot run") for c in NCCL_CHECKS]
    folder = tempfile.mkdtemp(prefix="lingjun-preflight-")
    try:
        config = os.path.join(folder, "health.conf")
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(health_config(plan, gpus))
        argv = [bash, str(HEALTH_PROGRAM), "--config", config, "--no-drain", "--json", "--only",
                ",".join(NCCL_CHECKS), "--node", node]
        if root:
            argv += ["--root", root]
        run_env = {k: v for k, v in env.items() if k != "LINGJUN_HEALTH_ROOT"}
        run_env["TMPDIR"] = folder
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=75, env=run_env,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return [_check(c, False, "lingjun-health timed out after 75 s") for c in NCCL_CHECKS]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        doc = json.loads(proc.stdout)
        checks = doc["checks"]
    except (ValueError, KeyError, TypeError):
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
        return [_check(c, False, f"lingjun-health could not check (rc {proc.returncode}): {last[:200]}")
                for c in NCCL_CHECKS]
    out = [_check(c["check"], c["status"] != "FAIL", c["detail"], skipped=c["status"] == "SKIP") for c in checks]
    return out


# ---------------------------------------------------------------------------------- shared dirs
def _write_token(path: str, doc: dict) -> Dict[str, float]:
    """Write a token; the node's clock just before and after, and the file's mtime as the file
    system (the NFS server) stamped it."""
    tmp = path + ".tmp"
    before = time.time()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (json.dumps(doc) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    after = time.time()
    mtime = os.stat(tmp).st_mtime
    os.replace(tmp, path)  # rename keeps the mtime; readers never see half a token
    return {"before": before, "after": after, "mtime": mtime}


def write_tokens(dirs: Dict[str, str], me: str, job: str, restart: str) -> Dict[str, Dict[str, Any]]:
    """This node's token into each dir: the task's first act, so that the others' wait for it is
    measured from when this task started (after its container started), not from when theirs did."""
    sub = token_dir_name(job, restart)
    state: Dict[str, Dict[str, Any]] = {}
    for label, path in dirs.items():
        entry: Dict[str, Any] = {"path": path, "probe_dir": os.path.join(path, sub), "written": False,
                                 "seen": {}, "missing": [], "error": None}
        state[label] = entry
        try:
            os.makedirs(entry["probe_dir"], exist_ok=True)
            written_at = time.time()
            doc = {"node": me, "job": job, "restart": restart, "host": socket.gethostname(), "pid": os.getpid(),
                   "written_at": written_at}
            entry["clock"] = _write_token(os.path.join(entry["probe_dir"], file_name(me, ".token")), doc)
            entry["written_at"] = written_at
            entry["written"] = True
        except OSError as exc:
            entry["error"] = f"cannot write a token into {path}: {exc.strerror or exc}"
    return state


def wait_tokens(state: Dict[str, Dict[str, Any]], others: List[str], job: str, restart: str,
                timeout: float, deadline: Optional[float] = None) -> Dict[str, Dict[str, Any]]:
    """Poll each dir for every other node's token until all are read or the window (TIMEOUT s after
    this node wrote its own; DEADLINE, a time.monotonic(), when given) has passed.

    The last poll starts at or after the window's end, and each dir records when it did
    (`waited_until`, this node's clock): the judge counts a token this node did not read against
    the sharing of the directory only when it was written at least TIMEOUT s before that
    (judge.shared_verdict); a peer whose task started later is judged on its own reading."""
    if deadline is None:
        deadline = time.monotonic() + timeout
    for entry in state.values():
        entry["missing"] = list(others)
    while True:
        pending = False
        polled_at, polled_mono = time.time(), time.monotonic()
        for entry in state.values():
            if not entry["written"]:
                continue
            entry["waited_until"] = polled_at
            try:
                names = set(os.listdir(entry["probe_dir"]))  # a readdir revalidates NFS's cached lookups
            except OSError:
                names = set()
            for other in list(entry["missing"]):
                name = file_name(other, ".token")
                if name not in names:
                    continue
                try:
                    with open(os.path.join(entry["probe_dir"], name), encoding="utf-8") as fh:
                        tok = json.load(fh)
                except (OSError, ValueError):
                    continue
                if tok.get("node") != other or tok.get("job") != job or tok.get("restart") != restart:
                    continue
                entry["seen"][other] = {"seen_at": time.time(), "written_at": tok.get("written_at")}
                entry["missing"].remove(other)
            pending = pending or bool(entry["missing"])
        if not pending or polled_mono >= deadline:
            break
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic()) + 0.001))
    for entry in state.values():
        entry["all_seen_at"] = time.time() if entry["written"] and not entry["missing"] else None
    return state


def probe_shared(dirs: Dict[str, str], me: str, others: List[str], job: str, restart: str,
                 timeout: float) -> Dict[str, Dict[str, Any]]:
    """Write this node's token into each dir, then wait (at most TIMEOUT s) for every other node's."""
    state = write_tokens(dirs, me, job, restart)
    return wait_tokens(state, others, job, restart, timeout)


def shared_checks(state: Dict[str, Dict[str, Any]], timeout: float) -> List[Dict[str, Any]]:
    out = []
    for label, entry in state.items():
        name = "shared-" + label.replace("_", "-")
        if entry["error"]:
            out.append(_check(name, False, entry["error"]))
        elif entry["missing"]:
            out.append(_check(name, False, f"{entry['path']}: no token from {', '.join(entry['missing'])} within "
                                           f"{timeout:g} s of writing its own (not the same directory there, or "
                                           f"their task started later or not at all: preflight-judge decides)"))
        else:
            out.append(_check(name, True, f"{entry['path']}: tokens of {len(entry['seen'])} other nodes read"))
    return out


# ---------------------------------------------------------------------------------- free space
def checkpoint_bytes(plan: dict) -> "tuple[Optional[int], str]":
    """The size of one checkpoint: settings.preflight.checkpoint_bytes, else the planner's estimate
    (lingjun_slurm.planner.estimate.make(...).checkpoint_bytes) from the plan alone."""
    given = knobs(plan).get("checkpoint_bytes")
    if isinstance(given, int) and given > 0:
        return given, "settings.preflight.checkpoint_bytes"
    try:
        from types import SimpleNamespace

        from lingjun_slurm.planner import estimate

        stages = [SimpleNamespace(kind=st.get("kind"), network=SimpleNamespace(profile=st.get("network_profile")),
                                  resources=SimpleNamespace(**st.get("resources") or {}))
                  for st in plan.get("stages") or []]
        wrapper = SimpleNamespace(stages=stages, to_json=lambda: plan)
        planning = SimpleNamespace(gpu=None, margin=0.10, mfu=0.40, storage_gbps=5.0, attention=None,
                                   transformer_engine=None, vocab_size=None)
        got = estimate.make(wrapper, planning, read_tokenizer=False)
        note = "the planner's estimate"
        if "vocab_size" in got.inputs.unknown:
            note += f" (vocabulary assumed {got.inputs.vocab_size})"
        return int(got.checkpoint_bytes), note
    except Exception as exc:  # a plan the planner cannot read, a missing module in the image
        return None, f"the planner cannot estimate it ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"


def check_free_space(plan: dict, path: str) -> Dict[str, Any]:
    from lingjun_slurm.common.bytesfmt import human_bytes

    count = knobs(plan).get("min_checkpoints", MIN_CHECKPOINTS)
    size, source = checkpoint_bytes(plan)
    if size is None:
        return _check("free-space", True, f"checkpoint size unknown: {source}; not checked", skipped=True)
    probe = path
    while probe and not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        st = _statvfs(probe)
    except OSError as exc:
        return _check("free-space", False, f"statvfs {probe}: {exc.strerror or exc}")
    free = st.f_bavail * st.f_frsize
    need = size * int(count)
    detail = (f"{path}: {human_bytes(free)} free, {count} checkpoints need {human_bytes(need)} "
              f"({human_bytes(size)} each, {source})")
    return _check("free-space", free >= need, detail)


# ---------------------------------------------------------------------------------- main
def clock_record(state: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """What the judge bounds the clocks with (lingjun_slurm.injob.preflight.judge.clock_verdict):
    per shared dir, this node's clock around its token's write and the mtime the file system
    gave it (an NFS server stamps mtime with its own clock), the local times it read each
    other node's token, and when it had read them all."""
    return {label: {"write": entry.get("clock"), "seen": entry["seen"], "all_seen_at": entry.get("all_seen_at")}
            for label, entry in state.items() if entry["written"]}


def main(plan: dict, out: Path, env: Optional[Dict[str, str]] = None) -> int:
    env = dict(os.environ if env is None else env)
    started = time.time()
    timings: Dict[str, float] = {}
    node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    job = env.get("SLURM_JOB_ID") or "nojob"
    restart = env.get("SLURM_RESTART_COUNT") or "0"
    nodes = (env.get("LINGJUN_NODES") or node).split()
    others = [n for i, n in enumerate(nodes) if n != node and n not in nodes[:i]]
    # "{node}" in the prefix is this node's name: one-host test clusters give each node its own tree.
    root = (env.get("LINGJUN_PREFLIGHT_ROOT") or "").replace("{node}", node).rstrip("/")
    k = knobs(plan)
    timeout = float(env.get("LINGJUN_PREFLIGHT_SHARE_TIMEOUT") or k.get("share_timeout_s") or SHARE_TIMEOUT_S)
    stage = train_stage(plan) or {}
    gpus = int((stage.get("resources") or {}).get("gpus_per_node") or 0)
    checks: List[Dict[str, Any]] = []

    def timed(name: str, fn: Any, *args: Any) -> Any:
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            timings[name] = round(time.monotonic() - t, 3)

    ckpt = plan.get("checkpoint_dir") or os.path.join(plan.get("workdir") or ".", "checkpoints")
    dirs = {"workdir": plan.get("workdir") or "", "checkpoint_dir": ckpt}
    dirs = {label: path for label, path in dirs.items() if path}
    # The tokens first: this task starts only once its container has (pyxis/enroot unpack the
    # image before the task runs: minutes for a large image, and not at the same time on every
    # node), and the other nodes' wait for this node's token is judged from when it was written.
    state = timed("tokens", write_tokens, dirs, node, job, restart)
    deadline = time.monotonic() + timeout
    checks.append(timed("gpu-count", check_gpus, gpus, root, env))
    try:
        checks += timed("nccl", check_nccl, plan, gpus, node, root, env)
    except ValueError as exc:
        checks += [_check(c, False, str(exc)) for c in NCCL_CHECKS]
    free = timed("free-space", check_free_space, plan, ckpt)
    state = timed("shared", wait_tokens, state, others, job, restart, timeout, deadline)
    checks += shared_checks(state, timeout)
    checks.append(free)
    clock = clock_record(state)
    checks.append(_check("clock", True, "measured; judged across the nodes by preflight-judge", skipped=not clock))
    report = {"schema": SCHEMA, "node": node, "host": socket.gethostname(), "job": job, "restart": restart,
              "procid": env.get("SLURM_PROCID"), "nodes": nodes, "checks": checks,
              "shared": {label: {"path": e["path"], "written": e["written"], "error": e["error"],
                                 "seen": sorted(e["seen"]), "missing": e["missing"],
                                 "written_at": e.get("written_at"), "waited_until": e.get("waited_until"),
                                 "timeout_s": timeout} for label, e in state.items()},
              "clock": clock, "started_at": started, "timings": timings}
    report["timings"]["total"] = round(time.time() - started, 3)
    out.mkdir(parents=True, exist_ok=True)
    write_json(str(out / file_name(node, ".json")), report)
    for c in checks:
        if not c["ok"]:
            print(f"lingjun-slurm: preflight: node {node}: {c['name']}: {c['detail']}", flush=True)
    return 0  # the report says it; a failing task would make srun end the other nodes' probes
