"""Slurm time limits: only ASCII digits, as Slurm's time_str2mins reads them (src/common/parse_time.c)."""

from __future__ import annotations

import pytest

from lingjun_slurm.common.timefmt import parse_time


def test_the_six_forms() -> None:
    assert parse_time("1-02:03:04") == 93784 and parse_time("90") == 5400


@pytest.mark.parametrize("text", ["١٢:٠٠", "１２", "1-٠٢"])
def test_non_ascii_digits_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a Slurm time limit"):
        parse_time(text)
