"""Extract the command-line vocabulary of several Slurm releases into options.json (dev script).

    python tools/slurm_options.py SLURM_GIT_DIR [TAG ...] > tests/fixtures/slurm/versions/options.json

SLURM_GIT_DIR is a clone of github.com/SchedMD/slurm (a bare git dir works); the default tags
are the newest release of each supported series listed in DEFAULT_TAGS. Nothing of Slurm is
copied: for each tag the script reads these files with `git show TAG:PATH` and keeps only names.

  sbatch, srun   src/common/slurm_opt.c: every `slurm_cli_opt_t` named in common_options[];
                 an option counts for sbatch when it has .set_func or .set_func_sbatch, for
                 srun when it has .set_func or .set_func_srun (.name is the long option).
  squeue         src/squeue/opts.c     long_options[] names
  sacct          src/sacct/options.c   long_options[] names
  sacct_fields   src/sacct/sacct.c     fields[] names (--format field names)
  scancel        src/scancel/opt.c     long_options[] names
  scontrol       src/scontrol/*.c      words compared with xstrncasecmp/xstrcasecmp (subcommands
                 and `show` entities such as config, hostnames, node)

Output: {"<series>": {"tag": ..., "files": {...}, "<command>": [sorted names]}}.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

DEFAULT_TAGS = {
    "22.05": "slurm-22-05-11-1",
    "23.02": "slurm-23-02-8-1",
    "23.11": "slurm-23-11-11-1",
    "24.05": "slurm-24-05-8-1",
    "24.11": "slurm-24-11-7-1",
    "25.05": "slurm-25-05-8-1",
    "25.11": "slurm-25-11-7-1",
}

FILES = {
    "common": "src/common/slurm_opt.c",
    "squeue": "src/squeue/opts.c",
    "sacct": "src/sacct/options.c",
    "sacct_fields": "src/sacct/sacct.c",
    "scancel": "src/scancel/opt.c",
    "scontrol": "src/scontrol/",
}

_OPT_BLOCK = re.compile(r"static slurm_cli_opt_t (slurm_opt_\w+) = \{(.*?)\n\};", re.S)
_COMMON_LIST = re.compile(r"slurm_cli_opt_t \*common_options\[\] = \{(.*?)\};", re.S)
_LONG_OPTIONS = re.compile(r"struct option long_options\[\] = \{(.*?)\};", re.S)
_LONG_NAME = re.compile(r"\{\s*\"([A-Za-z0-9][A-Za-z0-9_-]*)\"\s*,")
_SACCT_FIELD = re.compile(r"\{\s*-?\d+\s*,\s*\"([A-Za-z][A-Za-z0-9]*)\"\s*,")
_SCONTROL_WORD = re.compile(r"xstrn?casecmp\s*\([^;]*?\"([A-Za-z][A-Za-z_-]*)\"")


def show(git_dir: str, tag: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{tag}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def ls(git_dir: str, tag: str, folder: str) -> list[str]:
    out = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", f"{tag}:{folder}"],
                         check=True, capture_output=True, text=True).stdout
    return [folder + name for name in out.split() if name.endswith(".c")]


def common_options(text: str) -> tuple[list[str], list[str]]:
    listed = set(re.findall(r"&(slurm_opt_\w+)", _COMMON_LIST.search(text).group(1)))
    sbatch, srun = set(), set()
    for var, body in _OPT_BLOCK.findall(text):
        if var not in listed:
            continue
        name = re.search(r"\.name\s*=\s*\"([^\"]+)\"", body)
        if not name:
            continue
        generic = re.search(r"\.set_func\s*=", body) is not None
        if generic or ".set_func_sbatch" in body:
            sbatch.add(name.group(1))
        if generic or ".set_func_srun" in body:
            srun.add(name.group(1))
    return sorted(sbatch), sorted(srun)


def long_options(text: str) -> list[str]:
    return sorted(set(_LONG_NAME.findall(_LONG_OPTIONS.search(text).group(1))))


def sacct_fields(text: str) -> list[str]:
    block = re.search(r"print_field_t fields\[\] = \{(.*?)\n\};", text, re.S).group(1)
    return sorted(set(_SACCT_FIELD.findall(block)))


def scontrol_words(git_dir: str, tag: str) -> list[str]:
    words: set[str] = set()
    for path in ls(git_dir, tag, FILES["scontrol"]):
        words.update(w.lower() for w in _SCONTROL_WORD.findall(show(git_dir, tag, path)))
    return sorted(words)


def extract(git_dir: str, tag: str) -> dict:
    sbatch, srun = common_options(show(git_dir, tag, FILES["common"]))
    return {
        "tag": tag,
        "files": FILES,
        "sbatch": sbatch,
        "srun": srun,
        "squeue": long_options(show(git_dir, tag, FILES["squeue"])),
        "sacct": long_options(show(git_dir, tag, FILES["sacct"])),
        "sacct_fields": sacct_fields(show(git_dir, tag, FILES["sacct_fields"])),
        "scancel": long_options(show(git_dir, tag, FILES["scancel"])),
        "scontrol": scontrol_words(git_dir, tag),
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    git_dir, tags = argv[0], argv[1:]
    wanted = {".".join(t.split("-")[1:3]): t for t in tags} if tags else DEFAULT_TAGS
    result = {series: extract(git_dir, tag) for series, tag in wanted.items()}
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
