"""Rendered Megatron-LM argv against the committed per-version reference data (tests/fixtures/megatron/).

The data is Megatron-LM's own: its live parsers and its parse_args + validate_args (+ tokenizer build)
verdict on every variant in tools/megatron_variants.py, one file per pinned revision, made by
tools/megatron_reference.py (provenance in tests/fixtures/megatron/SOURCES.md). CI cannot run
Megatron-LM's training code, so these tests hold today's rendering to what that code said.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lingjun_slurm.common.errors import SpecError
from lingjun_slurm.megatron import versions
from lingjun_slurm.spec import parse_spec
from tools import megatron_variants as mv

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "megatron"
PINNED = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}


def _rendered(version: str) -> dict[str, dict]:
    return _RENDER_CACHE.setdefault(version, mv.render_all(version))


_RENDER_CACHE: dict[str, dict[str, dict]] = {}


def flag_problems(argv: list[str], parser: dict[str, dict]) -> list[str]:
    """Flags of argv that parser lacks, and values outside a flag's choices."""
    problems = []
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        spec = parser.get(word)
        if spec is None:
            problems.append(f"{word}: no such flag")
        elif spec["choices"] is not None and (i + 1 >= len(argv) or argv[i + 1] not in spec["choices"]):
            problems.append(f"{word} {argv[i + 1] if i + 1 < len(argv) else ''}: not one of {spec['choices']}")
    return problems


def test_pinned_versions_cover_the_supported_range() -> None:
    assert {"core_v0.16.1", "core_v0.17.0", "core_v0.17.1", "core_v0.18.0", "core_v0.18.2", "core_v0.19.0"} <= set(PINNED)
    mains = [name for name in PINNED if name.startswith("main-")]
    assert len(mains) == 1 and PINNED[mains[0]]["commit"].startswith(mains[0][5:])
    newest = max(versions.parse_version(d["declared_version"]) for d in PINNED.values())
    assert newest[:2] == (versions.CEILING[0], versions.CEILING[1] - 1), "CEILING must follow the newest pinned"
    for name, data in PINNED.items():
        assert data["method"] == "runtime", f"{name}: parsers taken by AST only; verdicts could not run"
        assert len(data["commit"]) == 40 and data["repository"].endswith("NVIDIA/Megatron-LM")


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_generated_flag_exists_at_that_version(name: str) -> None:
    data = PINNED[name]
    bad = {}
    for variant, job in _rendered(data["declared_version"]).items():
        if "argv" in job:
            problems = flag_problems(job["argv"], data["parsers"][job["script"]])
            if problems:
                bad[variant] = problems
    assert not bad, f"{name}: {bad}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_flag_table_matches_the_parsers(name: str) -> None:
    """megatron_flags.yaml's since/removed say exactly which pinned versions have each flag."""
    data = PINNED[name]
    version = versions.parse_version(data["declared_version"])
    wrong = [f"{script} {flag}: table says {versions.has_flag(script, flag, version)}"
             for script in ("pretrain_gpt.py", "preprocess_data.py", "merge_datasets.py")
             for flag in versions.known_flags(script)
             if versions.has_flag(script, flag, version) != (flag in data["parsers"][script])]
    assert not wrong, f"{name}: {wrong}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_verified_argv_is_todays_rendering(name: str) -> None:
    """The verdicts below were taken on exactly the argv the tool renders now (else: rerun the script)."""
    data = PINNED[name]
    now = _rendered(data["declared_version"])
    assert set(now) == set(data["variants"])
    for variant, job in now.items():
        assert job.get("argv") == data["variants"][variant]["argv"], f"{name} {variant}: rendering changed"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_megatron_lm_accepted_every_rendered_variant(name: str) -> None:
    data = PINNED[name]
    failed = {v: rec.get("error") or rec["tokenizer"].get("error") for v, rec in data["variants"].items()
              if rec["argv"] is not None
              and (rec["verdict"] != "pass" or rec.get("tokenizer", {}).get("verdict") != "pass")}
    assert not failed, f"{name}: {failed}"
    rendered = [v for v, rec in data["variants"].items() if rec["argv"] is not None]
    assert len(rendered) == (18 if versions.parse_version(data["declared_version"]) < (0, 17) else 16), rendered


@pytest.mark.parametrize("name", sorted(PINNED))
def test_tokenizers_mean_the_same_at_every_version(name: str) -> None:
    """null: vocab_size + 1 ids with eod = vocab_size (the builtin's convention); huggingface: BOS in the
    preprocessed ids unless add_special_tokens: false."""
    variants = PINNED[name]["variants"]
    size = mv.TOKENIZERS["null"]["vocab_size"]
    for variant in ("tokenizer-null", "preprocess-null", "tp1-pp1-dp8-fp32-null"):
        tok = variants[variant]["tokenizer"]
        assert (tok["vocab_size"], tok["eod"]) == (size + 1, size), f"{name} {variant}: {tok}"
    with_bos = variants["preprocess-huggingface"]["tokenizer"]["ids_of"]["hello world"]
    without = variants["preprocess-huggingface-no-special"]["tokenizer"]["ids_of"]["hello world"]
    assert with_bos[0] == 1 and with_bos[1:] == without, name


@pytest.mark.parametrize("name", sorted(PINNED))
def test_gpt2_bpe_is_refused_where_megatron_lm_needs_the_hub(name: str) -> None:
    data = PINNED[name]
    version = versions.parse_version(data["declared_version"])
    for variant in ("tokenizer-gpt2-bpe", "preprocess-gpt2-bpe"):
        rec = data["variants"][variant]
        if version < versions.NO_LEGACY_TOKENIZER:
            assert rec["verdict"] == "pass" and "--legacy-tokenizer" in rec["argv"]
            continue
        assert rec["verdict"] == "not rendered" and "data.tokenizer.type" in rec["error"]
        probe = rec["probe"]  # what Megatron-LM did with the argv the tool would otherwise render
        failure = probe.get("tokenizer", probe)
        assert failure["verdict"] == "fail" and "huggingface.co" in failure["error"], probe


def _spec_text(version: str, **tok: object) -> str:
    raw = mv.base_spec(version)
    if tok:
        raw["data"]["tokenizer"] = dict(tok)
    return yaml.safe_dump(raw, sort_keys=False)


@pytest.mark.parametrize("version", ["0.21.0", "1.0.0", "core_v0.21.0rc1"])
def test_version_past_the_newest_checked_is_refused_with_its_line(version: str) -> None:
    text = _spec_text(version)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith("version:") and
                version in ln)
    with pytest.raises(SpecError) as info:
        parse_spec(text, "spec.yaml")
    assert f"spec.yaml:{line}: megatron_lm.version: Megatron-LM {version} is newer than" in str(info.value)


def test_gpt2_bpe_refusal_names_file_line_and_field() -> None:
    text = _spec_text("0.20.0", **mv.TOKENIZERS["gpt2-bpe"])
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip() == "type: gpt2-bpe")
    with pytest.raises(SpecError) as info:
        parse_spec(text, "spec.yaml")
    assert f"spec.yaml:{line}: data.tokenizer.type: Megatron-LM 0.20.0 has no --legacy-tokenizer" in str(info.value)
    parse_spec(_spec_text("0.16.1", **mv.TOKENIZERS["gpt2-bpe"]), "spec.yaml")  # fine where it is offline


def test_the_checks_catch_yesterdays_rendering(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendering before versions mattered (every flag from 0.16 on, null vocab as given) fails them."""
    main = next(d for n, d in PINNED.items() if n.startswith("main-"))
    table = {s: {f: (since, None) for f, (since, _) in flags.items()} for s, flags in versions._table().items()}
    for script in ("pretrain_gpt.py", "preprocess_data.py"):  # the flag it did not know about
        table[script]["--tokenizer-hf-no-include-special-tokens"] = ((99, 0, 0), None)
    monkeypatch.setattr(versions, "_table", lambda: table)
    monkeypatch.setattr(versions, "NULL_VOCAB_HOLDS_EOD", (9, 0, 0))
    monkeypatch.setattr(versions, "tokenizer_problem", lambda *a: None)
    import lingjun_slurm.megatron.args as margs

    monkeypatch.setattr(margs, "tokenizer_problem", lambda *a: None)
    monkeypatch.setattr(margs, "null_vocab_arg", lambda size, version: size)
    old = mv.render_all(main["declared_version"])
    refused = {v for v, job in old.items() if flag_problems(job["argv"], main["parsers"][job["script"]])}
    assert len(refused) == 10, refused
    changed = {v for v, job in old.items() if job["argv"] != main["variants"][v]["argv"]}
    assert {"tokenizer-null", "preprocess-null"} <= changed
