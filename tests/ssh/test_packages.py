"""README.md and .ci/run install the same Debian packages (OpenSSH included: the SSH tests start sshd)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _packages(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if "apt-get install" in ln)
    words = re.sub(r">\S*", " ", line.split("apt-get install", 1)[1]).split()
    return sorted(w for w in words if not w.startswith("-"))


def test_readme_and_ci_install_the_same_packages() -> None:
    readme = _packages((REPO / "README.md").read_text())
    ci = _packages((REPO / ".ci" / "run").read_text())
    assert readme == ci
    assert {"openssh-server", "openssh-client"} <= set(ci)
