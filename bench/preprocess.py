"""Throughput and memory of the built-in preprocess stage (issue #4), with a reference measured in
the same run, and optionally Megatron-LM's own tools/preprocess_data.py on the same corpus.

    .venv/bin/python bench/preprocess.py [--mb 55] [--tokenizer gpt2|hf|sp|null] [--workers 1,2]
                                         [--megatron-lm PATH [--megatron-python PY]] [--json]

Corpus: real text from this interpreter's site-packages (.py, .md, .rst, .txt files, in sorted
order), one jsonl line {"text": <file contents>} per file, until --mb megabytes; cached under
/tmp/lingjun-bench-preprocess/. Tokenizer (default gpt2): a byte-level BPE (vocab 8192) trained
locally on the first 4 MB of the corpus, saved as GPT-2 vocab.json/merges.txt (hf: the same model
as tokenizer.json; gpt2-slow: the gpt2 files with one repeated id, which sends them down the
Python path; sp: a sentencepiece BPE; null: not meaningful for text). No downloads.

Every configuration runs in a fresh interpreter (`preprocess.main(plan, 0)`, one shard); the
memory column is the peak PSS of that process tree (stage + its workers), sampled every 20 ms in
a second run of the same configuration: the sampler costs CPU (0.5-1.4 s of a 10 s run on 2
CPUs), so the timed run does not sample.

Reference, same run: reading the corpus line by line and json.loads of every line, one process
(the floor any jsonl preprocessor pays). Ratios: our MB/s over the reference MB/s, and over our
1-worker MB/s.

The whole data stage against the tokenizer's own limit (issue 18; `--stage-mb 50`, on by default,
`--stage-mb 0` skips it; the HF tokenizer): `lingjun-slurm submit --executor local` of a data-only
spec (make nothing else) from its start to the merged .bin/.idx, at 1 and 2 workers, with 1 shard
(the merge runs inside the preprocess task) and 2 shards (a merge job), and for reference raw
`Tokenizer.encode_batch_fast` of the same tokenizer on the same corpus, the same texts in batches
of 1024, at the thread count the stage uses in all (RAYON_NUM_THREADS = the CPUs: one worker
gives the tokenizer every CPU, N workers CPUs/N each), in a fresh interpreter in the same run.
The limit and the configurations are run round by round (--repeat rounds, medians), so that a
shared machine's slow spells fall on all of them alike; memory comes from separate sampled runs.
Printed per row: the wall time and its parts from the local executor's record (submit until the
first task starts, each task), the limit's time over the stage's ("x limit", goal >= 0.9) for the
whole stage and for the preprocess task alone, and peak PSS of the whole process tree; and the
1-worker stage at half and all of the corpus, to show memory flat in input size.

--megatron-lm PATH runs PATH/tools/preprocess_data.py (with PYTHONPATH=PATH, and the interpreter
--megatron-python, default this one) on the same corpus and tokenizer files with --append-eod and
the same --workers, prints its MB/s and our speed ratio, and compares its
<prefix>_text_document.bin/.idx with ours byte for byte. For GPT2BPETokenizer it passes
--legacy-tokenizer when the script accepts it (see docs/preprocessing.md: without it, core_v0.16's
script builds the tokenizer through HF AutoTokenizer('gpt2'), which needs the Hub). Not run in
this repository's CI: Megatron-LM is not installable here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(tempfile.gettempdir()) / "lingjun-bench-preprocess"
SUFFIXES = (".py", ".md", ".rst", ".txt")


def build_corpus(megabytes: int) -> Path:
    path = CACHE / f"corpus-{megabytes}mb.jsonl"
    if path.is_file():
        return path
    import site

    CACHE.mkdir(parents=True, exist_ok=True)
    roots = sorted({p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)})
    target, size = megabytes * 1_000_000, 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for root in roots:
            for folder, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    if not name.endswith(SUFFIXES):
                        continue
                    try:
                        text = Path(folder, name).read_text(encoding="utf-8")
                    except (OSError, UnicodeDecodeError):
                        continue
                    line = json.dumps({"text": text}) + "\n"
                    out.write(line)
                    size += len(line)
                    if size >= target:
                        break
                if size >= target:
                    break
    if size < target:
        print(f"note: only {size / 1e6:.1f} MB of text found under {roots}", file=sys.stderr)
    tmp.rename(path)
    return path


def _sample_texts(corpus: Path, limit: int = 4_000_000) -> list[str]:
    texts, size = [], 0
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            size += len(line)
            if size >= limit:
                break
    return texts


def build_tokenizer(kind: str, corpus: Path) -> dict[str, Any]:
    folder = CACHE / f"tok-{'gpt2' if kind == 'gpt2-slow' else kind}"
    if kind == "null":
        return {"type": "null", "vocab_size": 50000}
    if kind == "sp":
        model = folder / "sp.model"
        if not model.is_file():
            import sentencepiece

            folder.mkdir(parents=True, exist_ok=True)
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(t for text in _sample_texts(corpus, 2_000_000) for t in text.splitlines() if t),
                model_prefix=str(folder / "sp"), vocab_size=8192, model_type="bpe", byte_fallback=True,
                minloglevel=2, input_sentence_size=200000, shuffle_input_sentence=False)
        return {"type": "sentencepiece", "path": str(model)}
    vocab, merges, tok_json = folder / "vocab.json", folder / "merges.txt", folder / "tokenizer.json"
    if not (vocab.is_file() and tok_json.is_file()):
        from tokenizers.implementations import ByteLevelBPETokenizer

        folder.mkdir(parents=True, exist_ok=True)
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_sample_texts(corpus), vocab_size=8192, min_frequency=2,
                                special_tokens=["<|endoftext|>"], show_progress=False)
        bpe.save_model(str(folder))
        bpe.save(str(tok_json))
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    if kind == "hf":
        return {"type": "huggingface", "path": str(folder)}
    if kind == "gpt2-slow":
        # The same vocab plus one token that repeats id 0: gpt2_bpe.fast_path_problem then sends it
        # down the Python path (SlowBPE), which holds the GIL: where workers (processes) pay.
        slow = CACHE / "tok-gpt2-slow"
        slow.mkdir(parents=True, exist_ok=True)
        table = json.loads(vocab.read_text(encoding="utf-8"))
        table["<|lingjun-bench-repeated-id|>"] = 0
        (slow / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
        return {"type": "gpt2-bpe", "vocab_file": str(slow / "vocab.json"), "merge_file": str(merges)}
    return {"type": "gpt2-bpe", "vocab_file": str(vocab), "merge_file": str(merges)}


def reference_json_mb_s(corpus: Path) -> tuple[float, int]:
    start, size, docs = time.perf_counter(), 0, 0
    with open(corpus, "rb") as fh:
        for line in fh:
            json.loads(line.decode("utf-8"))
            size += len(line)
            docs += 1
    return size / 1e6 / (time.perf_counter() - start), docs


def _tree_pss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def timed(cmd: list[str], env: dict[str, str], sample: bool = True) -> tuple[float, int, str]:
    """Wall seconds, peak PSS of the process tree (0 unless `sample`), stderr tail.

    The sampler reads /proc/PID/smaps of every process in the tree every 20 ms (psutil
    memory_full_info), which costs CPU: 0.5-1.4 s of a 10 s run on 2 CPUs, more with more
    processes. So the timed runs do not sample, and memory is taken in runs of its own."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    stop = threading.Event()

    def sampler_loop() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_pss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sampler_loop, daemon=True)
    if sample:
        sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - start
    stop.set()
    if sample:
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return seconds, peak[0], (out + err)[-2000:]


OURS = """
import json, sys
from lingjun_slurm.injob.stages import preprocess
sys.exit(preprocess.main(json.load(open(sys.argv[1])), 0))
"""


def timed_and_sampled(run: Any, out: Path) -> tuple[float, int, str]:
    """`run(out, sample)` twice: timed without the memory sampler, then sampled (into out.mem)."""
    seconds, _, log = run(out, False)
    _, pss, _ = run(out.with_name(out.name + ".mem"), True)
    return seconds, pss, log


def run_ours(corpus: Path, tok: dict[str, Any], workers: int, out: Path, sample: bool = False) -> tuple[float, int, str]:
    data = {"tool": "builtin", "inputs": [str(corpus)], "json_keys": ["text"], "train_key": None, "tokenizer": tok,
            "append_eod": True, "shards": 1, "workers": workers, "output_prefix": str(out / "corpus"),
            "prefix": None, "split": "969,30,1", "shard_dir": str(out / "shards")}
    plan = out / "plan.json"
    out.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"settings": {"data": data}}))
    env = dict(os.environ, PYTHONPATH=str(REPO), LINGJUN_PROGRESS_INTERVAL_S="3600")
    return timed([sys.executable, "-c", OURS, str(plan)], env, sample)


def run_megatron(path: Path, python: str, corpus: Path, tok: dict[str, Any], workers: int,
                 out: Path, sample: bool = False) -> tuple[float, int, str]:
    script = path / "tools" / "preprocess_data.py"
    env = dict(os.environ, PYTHONPATH=str(path))
    help_text = subprocess.run([python, str(script), "--help"], env=env, capture_output=True, text=True).stdout
    types = {"gpt2-bpe": "GPT2BPETokenizer", "huggingface": "HuggingFaceTokenizer",
             "sentencepiece": "GPTSentencePieceTokenizer", "null": "NullTokenizer"}
    cmd = [python, str(script), "--input", str(corpus), "--output-prefix", str(out / "mlm"), "--json-keys", "text",
           "--workers", str(workers), "--append-eod", "--tokenizer-type", types[tok["type"]]]
    if tok["type"] == "gpt2-bpe":
        cmd += ["--vocab-file", tok["vocab_file"], "--merge-file", tok["merge_file"]]
        if "--legacy-tokenizer" in help_text:
            cmd.append("--legacy-tokenizer")
    elif tok["type"] == "null":
        cmd += ["--vocab-size", str(tok["vocab_size"])]
    else:
        cmd += ["--tokenizer-model", tok["path"]]
        if tok["type"] == "huggingface" and "--tokenizer-hf-include-special-tokens" in help_text:
            cmd.append("--tokenizer-hf-include-special-tokens")  # our default add_special_tokens: true
    out.mkdir(parents=True, exist_ok=True)
    return timed(cmd, env, sample)


RAW = """
import json, sys, time
from tokenizers import Tokenizer
t0 = time.perf_counter()
tok = Tokenizer.from_file(sys.argv[2])
lines = open(sys.argv[1], "rb").read().splitlines()
texts = [json.loads(line)["text"] for line in lines]
t1 = time.perf_counter()
tokens = 0
for i in range(0, len(texts), 1024):
    tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:i + 1024], add_special_tokens=True))
t2 = time.perf_counter()
print(json.dumps({"load_parse_s": t1 - t0, "encode_s": t2 - t1, "tokens": tokens}))
"""


def raw_runs(corpus: Path, tok_json: Path, threads: int, repeat: int) -> list[dict[str, float]]:
    """The tokenizer's own speed on the corpus: encode_batch_fast only, `repeat` fresh interpreters."""
    runs = []
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, "-c", RAW, str(corpus), str(tok_json)], capture_output=True, text=True,
                              env=dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true"))
        if proc.returncode != 0:
            raise SystemExit(f"raw encode failed: {proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout))
    return runs


def raw_limit(corpus: Path, tok_json: Path, threads: int, repeat: int) -> dict[str, float]:
    """The median of raw_runs."""
    import statistics

    runs = raw_runs(corpus, tok_json, threads, repeat)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def stage_spec(work: Path, corpus: Path, tok: dict[str, Any], workers: int, shards: int) -> Path:
    import yaml

    doc = {"version": 1, "run": {"name": f"data-w{workers}-s{shards}", "workdir": str(work)},
           "cluster": {"network": {"profile": "tcp"}}, "container": {"runtime": "none"},
           "data": {"inputs": [str(corpus)], "tokenizer": tok, "shards": shards, "workers": workers},
           "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32},
           "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}}}
    path = work.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_stage(corpus: Path, tok: dict[str, Any], workers: int, shards: int, work: Path,
              sample: bool = False) -> dict[str, Any]:
    """`submit --executor local` of the data-only spec: wall, parts, and (with `sample`, in a run
    that is not timed) peak PSS of the tree."""
    work.mkdir(parents=True)
    spec = stage_spec(work, corpus, tok, workers, shards)
    env = dict(os.environ, PYTHONPATH=str(REPO), LINGJUN_STATE_DIR=str(work / "state"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.time()
    seconds, pss, _ = timed([sys.executable, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local"],
                            env, sample=sample)
    state = json.loads(next((work / "runs").glob("*/local-state.json")).read_text())
    parts: dict[str, float] = {}
    first = min(t["start"] for t in state["tasks"] if t.get("start"))
    parts["until the first task"] = round(first - start, 2)
    for t in state["tasks"]:
        if t.get("start") and t.get("end"):
            name = t["stage"] + (f"[{t['task']}]" if t.get("task") is not None else "")
            parts[name] = round(t["end"] - t["start"], 2)
    pre = [t for t in state["tasks"] if t["stage"] == "preprocess" and t.get("start") and t.get("end")]
    span = max(t["end"] for t in pre) - min(t["start"] for t in pre)  # the array's tasks run side by side
    return {"seconds": seconds, "parts": parts, "preprocess_s": span, "peak_pss_mb": round(pss / 1e6)}


CONFIGS = [(1, 1), (1, 2), (2, 1), (2, 2)]  # (workers, shards)


def stage_report(corpus_mb: int, repeat: int) -> list[str]:
    """The limit and every configuration, interleaved round by round (a shared machine's noise
    falls on all of them alike); medians of `repeat` rounds; memory in separate sampled runs."""
    import statistics

    corpus = build_corpus(corpus_mb)
    tok = build_tokenizer("hf", corpus)
    tok_json = Path(tok["path"]) / "tokenizer.json"
    cpus = os.cpu_count() or 1
    root = Path(tempfile.mkdtemp(prefix="lingjun-bench-stage-"))
    limits: list[dict[str, float]] = []
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for i in range(repeat):
        limits.extend(raw_runs(corpus, tok_json, cpus, 1))
        for workers, shards in CONFIGS:
            runs[(workers, shards)].append(run_stage(corpus, tok, workers, shards, root / f"w{workers}s{shards}r{i}"))
    limit = {k: statistics.median(r[k] for r in limits) for k in limits[0]}
    one = raw_limit(corpus, tok_json, 1, 1)
    mb = corpus.stat().st_size / 1e6
    lines = [f"whole data stage on {corpus.name} ({mb:.1f} MB), HF byte-level BPE, {cpus} CPUs, median of {repeat}",
             f"limit: encode_batch_fast at {cpus} thread(s): {limit['encode_s']:.2f} s ({mb / limit['encode_s']:.1f} MB/s; "
             f"runs {', '.join(format(r['encode_s'], '.2f') for r in limits)}; 1 thread {one['encode_s']:.2f} s); "
             f"reading + json.loads before it: {limit['load_parse_s']:.2f} s",
             "| workers | shards | wall s | x limit (stage) | preprocess s (first start to last end) | x limit (preprocess) | parts | peak PSS MB |",
             "|---|---|---|---|---|---|---|---|"]
    for workers, shards in CONFIGS:
        rows = runs[(workers, shards)]
        wall = statistics.median(r["seconds"] for r in rows)
        best = min(rows, key=lambda r: abs(r["seconds"] - wall))
        pre = statistics.median(r["preprocess_s"] for r in rows)
        memory = run_stage(corpus, tok, workers, shards, root / f"w{workers}s{shards}mem", sample=True)
        lines.append(f"| {workers} | {shards} | {wall:.2f} | {limit['encode_s'] / wall:.2f} | {pre:.2f} | "
                     f"{limit['encode_s'] / pre:.2f} | "
                     f"{', '.join(f'{k} {v}' for k, v in best['parts'].items())} | {memory['peak_pss_mb']} |")
    half = build_corpus(max(1, corpus_mb // 2))
    small = run_stage(half, tok, 1, 1, root / "half", sample=True)
    lines.append(f"memory: 1 worker, 1 shard: peak PSS {small['peak_pss_mb']} MB at {half.stat().st_size / 1e6:.1f} MB "
                 f"of input, see the table for {mb:.1f} MB")
    return lines


def same_bytes(a: Path, b: Path) -> bool:
    return all(Path(f"{a}{ext}").read_bytes() == Path(f"{b}{ext}").read_bytes() for ext in (".bin", ".idx"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=55, help="corpus size in MB (default 55)")
    ap.add_argument("--tokenizer", choices=["gpt2", "gpt2-slow", "hf", "sp", "null"], default="gpt2")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    ap.add_argument("--megatron-lm", type=Path, help="a Megatron-LM checkout to compare with")
    ap.add_argument("--megatron-python", default=sys.executable, help="interpreter for Megatron-LM")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--stage-mb", type=int, default=50, help="the whole data stage vs the tokenizer's limit on a "
                                                             "corpus this large (0: skip; default 50)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per whole-stage row (median)")
    args = ap.parse_args()
    if args.stage_mb:
        print("\n".join(stage_report(args.stage_mb, args.repeat)), flush=True)

    corpus = build_corpus(args.mb)
    tok = build_tokenizer(args.tokenizer, corpus)
    mb = corpus.stat().st_size / 1e6
    ref_mb_s, docs = reference_json_mb_s(corpus)
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="lingjun-bench-run-"))
    base_mb_s = None
    for workers in [int(w) for w in args.workers.split(",")]:
        seconds, pss, log = timed_and_sampled(lambda o, smp: run_ours(corpus, tok, workers, o, smp),
                                              work / f"ours-{workers}")
        found = re.search(r"tokens in ([0-9.]+) s", log)
        row = {"what": f"lingjun builtin, {workers} worker(s)", "workers": workers, "seconds": round(seconds, 2),
               "stage_seconds": float(found.group(1)) if found else None,
               "docs_s": round(docs / seconds), "mb_s": round(mb / seconds, 2), "peak_pss_mb": round(pss / 1e6)}
        base_mb_s = base_mb_s or row["mb_s"]
        row["x_json_read"] = round(row["mb_s"] / ref_mb_s, 3)
        row["x_1st"] = round(row["mb_s"] / base_mb_s, 2)
        if args.megatron_lm:
            mseconds, mpss, _ = timed_and_sampled(
                lambda o, smp: run_megatron(args.megatron_lm, args.megatron_python, corpus, tok, workers, o, smp),
                work / f"mlm-{workers}")
            row["megatron_mb_s"] = round(mb / mseconds, 2)
            row["megatron_peak_pss_mb"] = round(mpss / 1e6)
            row["x_megatron"] = round(mseconds / seconds, 2)
            row["bytes_identical"] = same_bytes(work / f"ours-{workers}" / "shards" / "shard_00000_text_document",
                                                work / f"mlm-{workers}" / "mlm_text_document")
        rows.append(row)
    summary = {"corpus": str(corpus), "corpus_mb": round(mb, 1), "documents": docs, "tokenizer": tok,
               "cpus": os.cpu_count(), "reference_json_read_mb_s": round(ref_mb_s, 1), "runs": rows}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"corpus {corpus} ({mb:.1f} MB, {docs:,} documents), tokenizer {args.tokenizer}, {os.cpu_count()} CPUs")
    print(f"reference: line reading + json.loads, 1 process: {ref_mb_s:.1f} MB/s")
    for row in rows:
        line = (f"{row['what']}: {row['seconds']} s ({row['stage_seconds']} s after start-up), "
                f"{row['docs_s']:,} docs/s, {row['mb_s']} MB/s "
                f"({row['x_json_read']}x json read, {row['x_1st']}x the first row), peak PSS {row['peak_pss_mb']} MB")
        if "megatron_mb_s" in row:
            line += (f"; Megatron-LM {row['megatron_mb_s']} MB/s (peak {row['megatron_peak_pss_mb']} MB), "
                     f"ours {row['x_megatron']}x faster, outputs identical: {row['bytes_identical']}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
