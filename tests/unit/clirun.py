"""Run the CLI in this process, as the unit tests do: main(args) with its exit code and output."""

from __future__ import annotations

import pytest

from lingjun_slurm.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `lingjun-slurm ARGS`."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err
