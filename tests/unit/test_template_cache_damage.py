"""A damaged compiled-template cache file is compiled afresh, never an error (issue 15 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("garbage", [b"\x80\x04not a pickle", b"", b"\x80", b"\x00" * 64])
def test_a_damaged_cache_file_is_compiled_again(tmp_path: Path, garbage: bytes) -> None:
    """jinja2's Bucket.load_bytecode unpickles the source checksum after the magic header and
    catches nothing around it: a file cut short or overwritten (a full disk, a crash, another
    program) raised UnpicklingError/EOFError out of render."""
    import jinja2
    from jinja2.bccache import bc_magic

    from lingjun_slurm.render import TemplateCodeCache

    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "page.j2").write_text("one {{ x }}\n")
    cache = TemplateCodeCache.open(tmp_path / "cache")
    assert cache is not None

    def render() -> str:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), bytecode_cache=cache)
        return env.get_template("page.j2").render(x=1)

    assert render() == "one 1"
    [cached] = (tmp_path / "cache").glob("*.cache")
    cached.write_bytes(bc_magic + garbage)
    assert render() == "one 1"
    assert cached.read_bytes().startswith(bc_magic) and len(cached.read_bytes()) > len(bc_magic) + len(garbage)
