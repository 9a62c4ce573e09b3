"""Build the small local images the docker backend's tests, demo and benchmarks use.

No registry is needed: the image is `FROM scratch` plus the host's statically linked
busybox (Debian: `apt-get install busybox-static`), installed as every applet (`sh`,
`cat`, `sleep`, `stty`, `kill`, `grep`, ...), with /tmp, a home, and passwd/group
entries for root, `user` (1000) and `nobody`. The build context is made in memory and
sent through the docker SDK. A label holds a hash of everything that goes in, so an
image that is already there with the same content is reused, not rebuilt.

Two more shapes, for what must work in any image (the runner, the file API): the
minimal image (only `sh`, `cat` and `sleep`, no /tmp: a distroless image with a shell),
and the glibc image (`ensure_glibc_image`: the host's dynamically linked dash, cat,
sleep and env with the C library they load, the userland shape of debian-slim).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import tarfile
from typing import Any

from ..errors import BackendUnavailableError, ProviderError

# The two test images (tags, the programs of the minimal one, the label holding the hash
# of what built them) and where busybox is looked for on the host.
DEFAULT_TAG = "sandbox-test-busybox:latest"
MINIMAL_TAG = "sandbox-test-minimal:latest"
GLIBC_TAG = "sandbox-test-glibc:latest"
# The glibc image's programs: where they go in the image, from where on the host.
GLIBC_PROGRAMS = (("bin/sh", "/bin/dash"), ("bin/cat", "/bin/cat"), ("bin/sleep", "/bin/sleep"),
                  ("usr/bin/env", "/usr/bin/env"))  # fmt: skip
MINIMAL_PROGRAMS = ("sh", "cat", "sleep")
HASH_LABEL = "sandbox.test-image.hash"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
INSTALL_HINT = "install it with: apt-get install -y busybox-static"

# What builds the images: a busybox on scratch, with a root and a plain user.
DOCKERFILE = b"""FROM scratch
COPY busybox /bin/busybox
COPY passwd group /etc/
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox --install -s /bin && mkdir -p /tmp /root /home/user /usr/bin /usr/sbin /sbin && chmod 1777 /tmp && chown 1000:1000 /home/user"]
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /root
CMD ["sh"]
"""  # noqa: E501
PASSWD = (
    b"root:x:0:0:root:/root:/bin/sh\n"
    b"user:x:1000:1000:user:/home/user:/bin/sh\n"
    b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
)
GROUP = b"root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"

# Only three programs (copies of busybox, which picks the applet by its name): no
# `mkdir`, `id`, `stat` or `grep` file, not even /tmp. `RUN` cannot work without a
# shell build step, so the folders come from WORKDIR.
MINIMAL_DOCKERFILE = b"""FROM scratch
COPY sh cat sleep /bin/
ENV PATH=/bin
WORKDIR /work
CMD ["sh"]
"""


def find_busybox() -> str:
    """The path of a statically linked busybox on this machine, or a clear error."""
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path):
            if not is_static_elf(path):
                raise BackendUnavailableError(
                    f"{path} is dynamically linked and cannot run in an empty image; "
                    + INSTALL_HINT
                )
            return path
    raise BackendUnavailableError("no busybox binary found; " + INSTALL_HINT)


def is_static_elf(path: str) -> bool:
    """True when `path` is a 64- or 32-bit ELF executable without a program interpreter."""
    with open(path, "rb") as handle:
        ident = handle.read(64)
        if len(ident) < 52 or ident[:4] != b"\x7fELF":
            return False
        wide = ident[4] == 2
        order = "<" if ident[5] == 1 else ">"
        if wide:
            (phoff,) = struct.unpack_from(order + "Q", ident, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", ident, 54)
        else:
            (phoff,) = struct.unpack_from(order + "I", ident, 28)
            phentsize, phnum = struct.unpack_from(order + "HH", ident, 42)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    pt_interp = 3
    for index in range(phnum):
        (p_type,) = struct.unpack_from(order + "I", table, index * phentsize)
        if p_type == pt_interp:
            return False
    return True


def _context(dockerfile: bytes, files: list[tuple[str, bytes, int]]) -> tuple[bytes, str]:
    digest = hashlib.sha256()
    for part in (dockerfile, *(data for _, data, _ in files)):
        digest.update(hashlib.sha256(part).digest())
    content_hash = digest.hexdigest()[:32]
    dockerfile = dockerfile.replace(b"CMD", f"LABEL {HASH_LABEL}={content_hash}\nCMD".encode(), 1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data, mode in [("Dockerfile", dockerfile, 0o644), *files]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), content_hash


def _read_busybox() -> bytes:
    with open(find_busybox(), "rb") as handle:
        return handle.read()


def ensure_busybox_image(tag: str = DEFAULT_TAG, client: Any = None) -> str:
    """Build the test image unless an image with this content already has `tag`.

    Returns the tag. `client` is a `docker.DockerClient` (default: from the
    environment). Raises `BackendUnavailableError` when busybox is missing, and
    `ProviderError` when the engine cannot be reached or the build fails.
    """
    busybox = _read_busybox()
    # This order keeps the content hash (the label) of images built before.
    files = [("passwd", PASSWD, 0o644), ("group", GROUP, 0o644), ("busybox", busybox, 0o755)]
    return _ensure_image(tag, client, *_context(DOCKERFILE, files))


def ensure_minimal_image(tag: str = MINIMAL_TAG, client: Any = None) -> str:
    """Build (unless already there) an image holding only `sh`, `cat` and `sleep` (see
    `MINIMAL_DOCKERFILE`): what the docker backend's file API must work on. Returns the
    tag; errors as `ensure_busybox_image`."""
    busybox = _read_busybox()
    files = [(name, busybox, 0o755) for name in MINIMAL_PROGRAMS]
    return _ensure_image(tag, client, *_context(MINIMAL_DOCKERFILE, files))


# The glibc image: its files come in one tar (`_glibc_rootfs`) that ADD unpacks at /.
GLIBC_DOCKERFILE = b"""FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/bin:/bin
WORKDIR /root
CMD ["sh"]
"""


def _libraries(program: str) -> list[str]:
    """The shared libraries (and the loader) `program` loads on this host, by `ldd`."""
    import subprocess

    listed = subprocess.run(
        ["ldd", program], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    found = []
    for line in listed.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else (words[0] if words else "")
        if path.startswith("/"):
            found.append(path)
    return found


def _glibc_rootfs() -> bytes:
    """The glibc image's files as a tar: programs, their libraries at their own paths
    (links resolved), /tmp (1777), /root, passwd and group."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(name: str, data: bytes | None, mode: int) -> None:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, mode
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))

        add("tmp", None, 0o1777)
        add("root", None, 0o700)
        add("etc/passwd", PASSWD, 0o644)
        add("etc/group", GROUP, 0o644)
        libraries: set[str] = set()
        for name, host in GLIBC_PROGRAMS:
            with open(host, "rb") as handle:
                add(name, handle.read(), 0o755)
            libraries.update(_libraries(host))
        for library in sorted(libraries):
            with open(os.path.realpath(library), "rb") as handle:
                add(library.lstrip("/"), handle.read(), 0o755)
    return buffer.getvalue()


def ensure_glibc_image(tag: str = GLIBC_TAG, client: Any = None) -> str:
    """Build (unless already there) the glibc image (see `GLIBC_DOCKERFILE`): a
    dynamically linked userland with dash as `sh`, as debian-slim has. Returns the
    tag; errors as `ensure_busybox_image` (and `BackendUnavailableError` without
    `ldd` or one of the host's programs)."""
    try:
        rootfs = _glibc_rootfs()
    except (OSError, ValueError) as exc:
        raise BackendUnavailableError(f"cannot gather the glibc image's files: {exc}") from exc
    except Exception as exc:  # ldd failed
        raise BackendUnavailableError(f"cannot list the host's libraries: {exc}") from exc
    return _ensure_image(tag, client, *_context(GLIBC_DOCKERFILE, [("rootfs.tar", rootfs, 0o644)]))


def _ensure_image(tag: str, client: Any, context: bytes, content_hash: str) -> str:
    import docker
    import docker.errors

    own_client = client is None
    try:
        if client is None:
            client = docker.from_env()
        try:
            image = client.images.get(tag)
            if (image.labels or {}).get(HASH_LABEL) == content_hash:
                return tag
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.build(
                fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True, forcerm=True
            )
        except docker.errors.BuildError as exc:
            raise ProviderError(f"building {tag} failed: {exc.msg}", retryable=False) from exc
        return tag
    except docker.errors.DockerException as exc:
        if isinstance(exc, docker.errors.APIError):
            raise ProviderError(f"building {tag} failed: {exc.explanation}") from exc
        raise ProviderError(
            f"cannot reach the Docker engine to build {tag}: {type(exc).__name__}",
            retryable=True,
        ) from exc
    finally:
        if own_client and client is not None:
            client.close()


__all__ = [
    "BUSYBOX_CANDIDATES",
    "DEFAULT_TAG",
    "DOCKERFILE",
    "GLIBC_DOCKERFILE",
    "GLIBC_PROGRAMS",
    "GLIBC_TAG",
    "GROUP",
    "HASH_LABEL",
    "INSTALL_HINT",
    "MINIMAL_DOCKERFILE",
    "MINIMAL_PROGRAMS",
    "MINIMAL_TAG",
    "PASSWD",
    "ensure_busybox_image",
    "ensure_glibc_image",
    "ensure_minimal_image",
    "find_busybox",
    "is_static_elf",
]
