"""Image references, parsed the way enroot 4.x does it (``docker::_parse_uri``).

STANDARD LIBRARY ONLY (re, dataclasses): this module runs on cluster hosts without the project's
dependencies, and the spec's lint imports it at validation, so it pulls in no HTTP machinery
(registry.py has the client and re-exports these names).

Every rule is cited to NVIDIA/enroot tag v4.1.2 (``bd51f53b``), ``src/docker.sh``, with that tag's
line numbers; ``docker::_parse_uri`` (docker.sh:198-304) is the same from v4.0.0 to v4.1.2. enroot
3.x (v3.5.0 ``c7dc4a6b`` docker.sh:259-272) reads only ``[USER@][REGISTRY#]IMAGE[:TAG]``: see
``lingjun_slurm.container.lint_image`` and enroot_versions.json.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["DOCKER_HUB", "ImageRef", "parse_image_ref"]

DOCKER_HUB = "registry-1.docker.io"  # docker.sh:220, 234, 248, 254, 261, 267


# --------------------------------------------------------------------------
# Image references: docker::_parse_uri (docker.sh:198-304)
# --------------------------------------------------------------------------

# docker.sh:200  reg_user="[[:alnum:]_.!~*\'()%\;:\&=+$,-@]+"
# The string is in double quotes, so the backslashes stay in it, and a
# backslash inside an ERE bracket expression is a literal character.  ",-@" is
# a *range* (0x2C-0x40), so the class also holds ", - . / 0-9 : ; < = > ? @".
# We assume the C/ASCII meaning of [[:alnum:]] and of ranges.
_USER_CHARS = ("A-Za-z0-9" + re.escape("_.!~*\\'()%;:&=+$")
               + "".join(re.escape(chr(c)) for c in range(0x2C, 0x41)))
_R_USER = f"[{_USER_CHARS}]+"
_R_IMAGE = r"[a-z0-9/._-]+"           # docker.sh:201 [[:lower:][:digit:]/._-]+
_R_TAG = r"[A-Za-z0-9._:-]+"          # docker.sh:202 [[:alnum:]._:-]+
_R_DIGEST = r"sha256:[A-Za-z0-9]+"    # docker.sh:203 sha256:[[:alnum:]]+
_R_PFX = rf"docker://(?:(?P<user>{_R_USER})@)?"

# The nine alternatives of docker::_parse_uri, tried in enroot's order.  Each
# is (regex, kind): "docker" = REGISTRY/IMAGE (registry only when it contains
# "." or ":", docker.sh:214/228/242), "hub" = a bare IMAGE on Docker Hub with
# library/ (docker.sh:251-269), "enroot" = REGISTRY#IMAGE (docker.sh:271-289).
_URI_FORMS = (
    # docker.sh:208  [USER@]REGISTRY/IMAGE:TAG@DIGEST (tag ignored, digest used)
    (re.compile(rf"{_R_PFX}(?P<reg>[^/#]+)/(?P<image>{_R_IMAGE}):(?P<tag>{_R_TAG})@(?P<digest>{_R_DIGEST})"), "docker"),
    # docker.sh:223  [USER@]REGISTRY/IMAGE@DIGEST
    (re.compile(rf"{_R_PFX}(?P<reg>[^/#]+)/(?P<image>{_R_IMAGE})@(?P<digest>{_R_DIGEST})"), "docker"),
    # docker.sh:237  [USER@]REGISTRY/IMAGE[:TAG]
    (re.compile(rf"{_R_PFX}(?P<reg>[^/#]+)/(?P<image>{_R_IMAGE})(?::(?P<tag>{_R_TAG}))?"), "docker"),
    # docker.sh:251  [USER@]IMAGE:TAG@DIGEST
    (re.compile(rf"{_R_PFX}(?P<image>[^/@#:]+):(?P<tag>{_R_TAG})@(?P<digest>{_R_DIGEST})"), "hub"),
    # docker.sh:258  [USER@]IMAGE@DIGEST
    (re.compile(rf"{_R_PFX}(?P<image>[^/@#:]+)@(?P<digest>{_R_DIGEST})"), "hub"),
    # docker.sh:264  [USER@]IMAGE[:TAG]
    (re.compile(rf"{_R_PFX}(?P<image>[^/@#:]+)(?::(?P<tag>{_R_TAG}))?"), "hub"),
    # docker.sh:271  [USER@]REGISTRY#IMAGE:TAG@DIGEST
    (re.compile(rf"{_R_PFX}(?P<reg>[^#/@]+)#(?P<image>{_R_IMAGE}):(?P<tag>{_R_TAG})@(?P<digest>{_R_DIGEST})"), "enroot"),
    # docker.sh:278  [USER@]REGISTRY#IMAGE@DIGEST
    (re.compile(rf"{_R_PFX}(?P<reg>[^#/@]+)#(?P<image>{_R_IMAGE})@(?P<digest>{_R_DIGEST})"), "enroot"),
    # docker.sh:284  [USER@]REGISTRY#IMAGE[:TAG]
    (re.compile(rf"{_R_PFX}(?P<reg>[^#/@]+)#(?P<image>{_R_IMAGE})(?::(?P<tag>{_R_TAG}))?"), "enroot"),
)

# A registry must be a host name or [IPv6] literal with an optional port.
_R_REGISTRY = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """An image reference as enroot understands it.

    ``tag`` is ``"latest"`` when the reference gave neither a tag nor a digest
    (docker.sh:294-296).  It is ``None`` for ``IMAGE@sha256:...``.  With
    ``IMAGE:TAG@sha256:...``, enroot ignores the tag and uses the digest
    (docker.sh:212-213).
    """

    user: str | None
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """The ``<reference>`` in ``/v2/<name>/manifests/<reference>``: the digest if there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def uri(self, digest: str | None = None) -> str:
        """The enroot URI ``docker://[USER@]REGISTRY#REPO[:TAG][@DIGEST]``.

        If ``digest`` is given, the URI is pinned to it.  The tag stays in for
        readability, and enroot ignores it (docker.sh:271-277).  enroot 3.x
        cannot parse digests at all; it needs 4.0 or later.

        enroot quirk: a bare ``IMAGE`` may hold capitals (docker.sh:264,
        ``[^/@#:]+``), but ``REGISTRY#IMAGE`` may not (docker.sh:201).  So the
        URI of ``parse_image_ref("Ubuntu")`` is one that enroot refuses.  The
        registry refuses that name in any case.
        """
        pin = digest if digest is not None else self.digest
        if pin is not None and not re.fullmatch(_R_DIGEST, pin):
            raise ValueError(f"not a sha256 digest enroot accepts: {pin!r}")
        out = "docker://"
        if self.user:
            out += f"{self.user}@"
        out += f"{self.registry}#{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if pin:
            out += f"@{pin}"
        return out


def parse_image_ref(ref: str) -> ImageRef:
    """Parse ``[docker://][USER@][REGISTRY#]IMAGE[:TAG][@sha256:...]`` exactly as enroot 4.x does.

    This follows ``docker::_parse_uri`` (docker.sh:198-304), and the order of
    the alternatives matters:

    * Docker-style ``A/IMAGE`` is tried first (docker.sh:208-250).  ``A`` is a
      registry only if it contains ``.`` or ``:`` (docker.sh:214/228/242).
      Otherwise ``A`` is a Docker Hub namespace: ``nvidia/cuda`` becomes
      ``registry-1.docker.io``, ``nvidia/cuda``.  ``localhost/x`` is **not** a
      registry in enroot 4.1.2, although Docker treats it as one.  Write
      ``localhost:5000/x`` or ``localhost#x``.
    * A bare ``IMAGE`` gets Docker Hub with ``library/`` (docker.sh:251-269).
    * ``REGISTRY#IMAGE`` is enroot's own form (docker.sh:271-289).
    * With no tag and no digest, the tag is ``latest`` (docker.sh:294-296).

    enroot 4.1.2 does not rename ``docker.io`` or ``index.docker.io``; only the
    unreleased HEAD does.  ``docker.io/x`` therefore stays registry
    ``docker.io``, the same as in the enroot that clusters run.

    The ``docker://`` prefix is optional here.  Any other scheme
    (``dockerd://``, ``podman://``, ...) names a local daemon, not a registry,
    and is refused.

    Raises ValueError for references enroot refuses ("Invalid image reference",
    docker.sh:290-291).  DIFFERS: it also refuses a registry that is not
    ``host[:port]``, where enroot would hand it to curl.  Such a registry can
    only come from characters enroot's user regex does not allow, for example
    ``a^b@host/x``.
    """
    if not isinstance(ref, str) or not ref:
        raise ValueError("empty image reference")
    raw = ref
    if "://" in ref:
        scheme = ref.split("://", 1)[0]
        if scheme != "docker":
            raise ValueError(f"image reference {raw!r}: only docker:// references name a registry "
                             f"(scheme {scheme}:// is a local daemon or unknown)")
    else:
        ref = "docker://" + ref
    for regex, kind in _URI_FORMS:
        m = regex.fullmatch(ref)
        if m is None:
            continue
        groups = m.groupdict()
        user = groups.get("user")
        image = groups["image"]
        tag = groups.get("tag")
        digest = groups.get("digest")
        if kind == "docker":
            reg = groups["reg"]
            if "." in reg or ":" in reg:
                registry, repository = reg, image
            else:
                registry, repository = DOCKER_HUB, f"{reg}/{image}"
        elif kind == "hub":
            registry, repository = DOCKER_HUB, f"library/{image}"
        else:
            registry, repository = groups["reg"], image
        if not _R_REGISTRY.fullmatch(registry):
            raise ValueError(f"invalid image reference {raw!r}: registry {registry!r} is not host[:port]")
        if digest is None and not tag:
            tag = "latest"
        return ImageRef(user=user or None, registry=registry, repository=repository, tag=tag, digest=digest)
    raise ValueError(
        f"invalid image reference {raw!r} (enroot: \"Invalid image reference\"): expected "
        "[USER@][REGISTRY#]IMAGE[:TAG][@sha256:HEX], IMAGE in lower case [a-z0-9/._-]")
