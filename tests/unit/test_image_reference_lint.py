"""Docker-style REGISTRY/IMAGE references (issue 25, finding 2).

Real pyxis 0.24 + enroot 4.1.2 imported `127.0.0.1:5817/ns/img:tag` from that registry, where the
lint refused it ("pyxis would look it up on Docker Hub"). pyxis hands the reference to enroot as
written (NVIDIA/pyxis v0.24.0 pyxis_slurmstepd.c:728-736), and enroot decides:
- v4.1.2 (`bd51f53b`) src/docker.sh:198-250 `docker::_parse_uri`: a first component with '.' or
  ':' is a registry; `localhost/x` (neither) is the Docker Hub namespace `localhost`;
- v3.5.0 (`c7dc4a6b`) src/docker.sh:259-272: only `[USER@][REGISTRY#]IMAGE[:TAG]`; with no '#' the
  registry is empty and defaults to Docker Hub (docker.sh:126), and `host:5000/x` matches nothing.
Both were run as bash on the references below (the functions taken from the tags) while writing
this; the expectations are what they printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lingjun_slurm.cli.main import main
from lingjun_slurm.container import lint_image
from lingjun_slurm.images import enroot
from lingjun_slurm.images.reference import DOCKER_HUB, parse_image_ref
from tests.conftest import REPO

DOCKER_STYLE = [
    # reference, registry, repository, tag: enroot 4.1.2's docker::_parse_uri output
    ("127.0.0.1:5817/ns/img:tag", "127.0.0.1:5817", "ns/img", "tag"),
    ("nvcr.io/nvidia/pytorch:25.04-py3", "nvcr.io", "nvidia/pytorch", "25.04-py3"),
    ("localhost:5000/img", "localhost:5000", "img", "latest"),
    ("alice@reg.example/team/img:1", "reg.example", "team/img", "1"),
    ("docker://nvcr.io/nvidia/pytorch:25.04-py3", "nvcr.io", "nvidia/pytorch", "25.04-py3"),
]
ENROOT_FORM = ["nvcr.io#nvidia/pytorch:25.04-py3", "127.0.0.1:5817#ns/img:tag", "alice@reg.example#team/img:1"]
DOCKER_HUB_FORM = ["ubuntu:22.04", "nvidia/cuda:12.4.1-base"]


@pytest.mark.parametrize("version", [None, (4, 0, 0), (4, 1, 2)])
@pytest.mark.parametrize("image,registry,repository,tag", DOCKER_STYLE)
def test_docker_style_references_are_accepted_and_name_their_registry(
        image: str, registry: str, repository: str, tag: str, version: tuple[int, ...] | None) -> None:
    assert lint_image(image, enroot_version=version) is None
    ref = parse_image_ref(image)
    assert (ref.registry, ref.repository, ref.tag) == (registry, repository, tag)
    # what the image stage imports: enroot's own form, which every enroot version reads
    assert ref.uri().startswith(f"docker://{ref.user + '@' if ref.user else ''}{registry}#{repository}:")


@pytest.mark.parametrize("version", [None, (3, 5, 0), (4, 1, 2)])
def test_the_hash_form_and_docker_hub_names_are_accepted_everywhere(version: tuple[int, ...] | None) -> None:
    for image in ENROOT_FORM + DOCKER_HUB_FORM:
        assert lint_image(image, enroot_version=version) is None, image
    assert parse_image_ref("nvidia/cuda:12.4.1-base").registry == DOCKER_HUB


@pytest.mark.parametrize("image,fixed", [
    ("127.0.0.1:5817/ns/img:tag", "127.0.0.1:5817#ns/img:tag"),
    ("nvcr.io/nvidia/pytorch:25.04-py3", "nvcr.io#nvidia/pytorch:25.04-py3"),
    ("localhost:5000/img", "localhost:5000#img"),
    ("alice@reg.example/team/img:1", "alice@reg.example#team/img:1"),
])
def test_enroot_3_refuses_the_docker_style_with_the_hash_form(image: str, fixed: str) -> None:
    msg = lint_image(image, enroot_version=(3, 5, 0))
    assert msg is not None
    assert "enroot 3.5.0" in msg and "REGISTRY#IMAGE" in msg and repr(fixed) in msg
    assert lint_image(fixed, enroot_version=(3, 5, 0)) is None


def test_localhost_without_a_port_is_a_docker_hub_namespace_for_enroot() -> None:
    """Docker reads localhost/x as a registry; enroot 4.1.2 does not (no '.' or ':')."""
    assert parse_image_ref("localhost/img:1").registry == DOCKER_HUB
    msg = lint_image("localhost/img:1")
    assert msg and "Docker Hub" in msg and "'localhost:PORT/img:1'" in msg and "'localhost#img:1'" in msg


def test_the_version_thresholds_are_data_with_a_source() -> None:
    table = json.loads((REPO / "lingjun_slurm" / "images" / "enroot_versions.json").read_text())
    for key in ("digest_command", "docker_style_reference"):
        assert table[key]["source"] and enroot.parse_version(table[key]["min"])
    assert enroot.DOCKER_STYLE_MIN == enroot.parse_version(table["docker_style_reference"]["min"]) == (4, 0, 0)
    assert enroot.reads_docker_style((4, 0, 0)) and not enroot.reads_docker_style((3, 5, 0))
    with pytest.raises(ValueError):
        enroot.parse_version("four")


def validate(tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    src = (REPO / "examples" / "command-chain.yaml").read_text()
    src = src.replace("/tmp/lingjun-slurm/command-chain", str(tmp_path / "wd"))
    src = src.replace("  runtime: none\n", f'  runtime: pyxis\n  image: "{image}"\n')
    spec = tmp_path / "spec.yaml"
    spec.write_text(src)
    try:
        main(["validate", str(spec)])
        rc = 0
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_a_spec_with_a_docker_style_image_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = validate(tmp_path, "127.0.0.1:5817/ns/img:tag", capsys)
    assert rc == 0, out
    rc, out = validate(tmp_path, "localhost/img:1", capsys)
    assert rc != 0 and "container.image" in out and "spec.yaml:" in out and "Traceback" not in out


def test_enroot_3_has_no_digests() -> None:
    """v3.5.0 src/docker.sh:259-272 has no @sha256 alternative; v4.0.0's _parse_uri has them."""
    msg = lint_image("nvcr.io#nvidia/pytorch@sha256:" + "ab" * 32, enroot_version=(3, 5, 0))
    assert msg and "@sha256" in msg
    assert lint_image("nvcr.io#nvidia/pytorch@sha256:" + "ab" * 32, enroot_version=(4, 0, 0)) is None
