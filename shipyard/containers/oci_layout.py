"""A docker image as an OCI image layout, from the engine's ``docker save`` stream, for ``apptainer build X.sif oci:DIR``.

Why not ``apptainer build X.sif docker-daemon://TAG``: Apptainer saves the image to a tar file first, and the archive
a Docker engine before 25 writes (Debian 12's and Ubuntu 22.04's docker.io among them) is the legacy one, whose
layers carry no digest of their own. Apptainer's image library then gzip-compresses every layer, on one core, to
name it and to store it in Apptainer's cache, and gunzips it again to unpack: for a torch image (a 4.5 GB venv
layer) that was a third of the SIF's build. Here the saved stream is read once, each layer is written uncompressed
under the digest of its bytes, and that digest is checked against the image config's own ``rootfs.diff_ids`` (what
the engine recorded when it built the layer), so the layout holds exactly the image that was built and tested.
Docker 25 and later save an OCI layout with the same manifest.json beside it, read here the same way.

Member names of the stream are never used as paths: blobs are written under the digest of what was read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import queue
import tarfile
import threading
from pathlib import Path
from typing import Iterable, Iterator

from shipyard.errors import ShipyardError

LAYOUT_VERSION = {"imageLayoutVersion": "1.0.0"}
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"  # uncompressed, as the engine saves it
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20
# Members up to this size are also kept in memory (the config and manifest.json are among them), up to KEEP_TOTAL.
KEEP = 1 << 20
KEEP_TOTAL = 64 << 20


class ChunkReader(io.RawIOBase):
    """A readable file over an iterable of byte chunks (the Docker SDK's ``get_image`` stream), for tarfile's
    streaming mode."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self._left:
            try:
                self._left = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buf), len(self._left))
        buf[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class _Blobs:
    """``DIR/blobs/sha256``: each blob written under a temporary name, then renamed to the digest of its bytes."""

    def __init__(self, root: Path):
        self.dir = root / "blobs" / "sha256"
        self.dir.mkdir(parents=True)
        self._n = 0

    def put_stream(self, fh) -> tuple[str, int, bytes | None]:
        """(digest, size, the bytes when at most KEEP of them)."""
        self._n += 1
        tmp = self.dir / f".part-{self._n}"
        h, size, head = hashlib.sha256(), 0, []
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
                if size <= KEEP:
                    head.append(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        except OSError as exc:  # a full disk: say which file (os.write names none)
            if exc.filename is None and exc.errno is not None:
                raise OSError(exc.errno, exc.strerror, str(tmp)) from None
            raise
        finally:
            os.close(fd)
        digest = "sha256:" + h.hexdigest()
        os.replace(tmp, self.dir / digest.split(":", 1)[1])
        return digest, size, (b"".join(head) if size <= KEEP else None)

    def put(self, data: bytes) -> tuple[str, int]:
        return self.put_stream(io.BytesIO(data))[:2]


class Prefetch:
    """The chunks of ``chunks`` read ahead in a thread, at most ``depth`` of them waiting: the engine writes its save
    stream only as fast as it is read, and reading stops while this process hashes and writes (the socket holds a
    few hundred KB). Read in a thread of its own (the GIL is released while it waits, hashes and writes), a 1.5 GiB
    save here took 12.0-12.3 s against 13.8-14.7 s read in turn; `docker save -o` took 10.8-11.2 s.

    Iterate it inside ``with``: leaving the block early (an error) stops the thread and closes ``chunks``."""

    _END = object()

    def __init__(self, chunks: Iterable[bytes], depth: int = 256):
        self._chunks = chunks
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="save-stream", daemon=True)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        it = iter(self._chunks)
        try:
            for chunk in it:
                if not self._put(chunk):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc)
        finally:
            close = getattr(it, "close", None)
            if close:
                close()

    def __enter__(self) -> "Prefetch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def write_layout(chunks: Iterable[bytes], dest: Path, ref: str) -> dict:
    """The image of a ``docker save`` stream (one image) as an OCI image layout in the empty directory ``dest``,
    its one manifest named ``ref`` in index.json. Returns ``{"layers": N, "bytes": total layer bytes}``.

    Every regular member becomes a blob under its digest; the archive's manifest.json (written by every engine
    version) then names the config and the layers in order. Raises ShipyardError, in one line, for a stream that is
    not one saved image or whose layers are not the ones its config names."""
    blobs = _Blobs(dest)
    members: dict[str, tuple[str, int]] = {}  # member name -> (digest, size)
    kept: dict[str, bytes] = {}
    kept_total = 0
    links: dict[str, str] = {}  # a symlink member (a legacy layer.tar saved once) -> the member it points at
    with Prefetch(chunks) as ahead:
        try:
            tar = tarfile.open(fileobj=io.BufferedReader(ChunkReader(ahead), CHUNK), mode="r|", bufsize=CHUNK)
        except tarfile.TarError as exc:
            raise ShipyardError(f"docker save: not a tar stream ({exc})") from None
        with tar:
            try:
                for member in tar:
                    name = posixpath.normpath(member.name.lstrip("/"))
                    if member.isfile():
                        digest, size, data = blobs.put_stream(tar.extractfile(member))
                        members[name] = (digest, size)
                        if data is not None and kept_total + len(data) <= KEEP_TOTAL:
                            kept[name] = data
                            kept_total += len(data)
                    elif member.issym():
                        links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            except tarfile.TarError as exc:
                raise ShipyardError(f"docker save: the stream ended or broke ({exc})") from None

    def resolve(name: str) -> str:
        name = posixpath.normpath(str(name))
        for _ in range(len(links)):
            if name not in links:
                break
            name = links[name]
        return name

    try:
        manifest = json.loads(kept["manifest.json"])
    except (KeyError, ValueError):
        raise ShipyardError("docker save: the stream holds no readable manifest.json") from None
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        raise ShipyardError("docker save: manifest.json names no single image")
    entry = manifest[0]
    config_name = resolve(entry.get("Config", ""))
    config_bytes = kept.get(config_name)
    try:
        config = json.loads(config_bytes)
        diff_ids = config["rootfs"]["diff_ids"]
    except (TypeError, ValueError, KeyError):
        raise ShipyardError("docker save: the config manifest.json names is missing or has no rootfs.diff_ids") \
            from None
    names = entry.get("Layers")
    if not isinstance(names, list) or not isinstance(diff_ids, list) or len(names) != len(diff_ids):
        raise ShipyardError(f"docker save: manifest.json lists {len(names) if isinstance(names, list) else 0} "
                            f"layers, the config {len(diff_ids) if isinstance(diff_ids, list) else 0}")
    layers = []
    for i, (name, want) in enumerate(zip(names, diff_ids), 1):
        name = resolve(name)
        if name not in members:
            raise ShipyardError(f"docker save: layer {i} ({name}) is not in the stream")
        digest, size = members[name]
        if digest != want:
            raise ShipyardError(f"docker save: layer {i} is {digest[7:19]}, the config says {str(want)[7:19]}: "
                                "the saved stream is damaged")
        layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size})
    config_digest, config_size = members[config_name]  # a member like any other: already a blob
    body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                       "config": {"mediaType": CONFIG_TYPE, "digest": config_digest, "size": config_size},
                       "layers": layers}).encode()
    digest, size = blobs.put(body)
    index = {"schemaVersion": 2, "manifests": [{"mediaType": MANIFEST_TYPE, "digest": digest, "size": size,
                                                "annotations": {REF_NAME: ref}}]}
    (dest / "index.json").write_text(json.dumps(index))
    (dest / "oci-layout").write_text(json.dumps(LAYOUT_VERSION))
    return {"layers": len(layers), "bytes": sum(layer["size"] for layer in layers)}
