"""A ``docker save`` stream as an OCI image layout (shipyard/containers/oci_layout.py).

The archives here are made in the test in the two shapes engines write, from their documented formats: the legacy
one (moby's image spec v1.2, "Combined Image JSON + Filesystem Changeset Format": ``ID/layer.tar``, ``ID/json``,
``ID/VERSION``, the config as ``HEX.json``, ``manifest.json``, ``repositories``; a layer saved twice is a symlink to
the first) and Docker 25's (an OCI layout, ``blobs/sha256/HEX``, ``index.json``, ``oci-layout``, with the same
``manifest.json`` beside it naming blobs). The real Docker 20.10 engine's stream is read by the docker backend's
build tests (tests/containers/test_build_docker.py), and the real Apptainer builds a SIF from the layout there.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from shipyard.containers import oci_layout
from shipyard.errors import ShipyardError


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


LAYERS = [_layer({"etc/os-release": b"ID=debian\n"}), _layer({"opt/venv/bin/python": b"\x7fELF" + b"x" * 3000})]


def _config(layers=LAYERS) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux",
                       "config": {"Env": ["PATH=/opt/venv/bin:/usr/bin"], "Labels": {"org.shipyard.os": "debian12"}},
                       "rootfs": {"type": "layers", "diff_ids": [_sha(x) for x in layers]}}).encode()


def _tar(members: list[tuple[str, bytes | str]]) -> bytes:
    """A tar of (name, bytes) files and (name, "->target") symlinks, in the order given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data.removeprefix("->")
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def legacy_archive(layers=LAYERS, config: bytes | None = None, link_second=False) -> bytes:
    config = config if config is not None else _config(layers)
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    ids = [hashlib.sha256(f"layer{i}".encode()).hexdigest() for i in range(len(layers))]
    members: list[tuple[str, bytes | str]] = []
    for i, (lid, data) in enumerate(zip(ids, layers)):
        members += [(f"{lid}/VERSION", b"1.0"), (f"{lid}/json", b"{}")]
        members.append((f"{lid}/layer.tar", f"->../{ids[0]}/layer.tar" if link_second and i else data))
    members.insert(2, (cfg_name, config))  # the engine writes in name order: the config falls between layers
    members += [("manifest.json", json.dumps([{"Config": cfg_name, "RepoTags": ["shipyard/real:abc"],
                                               "Layers": [f"{lid}/layer.tar" for lid in ids]}]).encode()),
                ("repositories", b'{"shipyard/real":{"abc":"x"}}')]
    return _tar(members)


def oci_archive(layers=LAYERS) -> bytes:
    config = _config(layers)
    blobs = {_sha(x): x for x in [*layers, config]}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": oci_layout.MANIFEST_TYPE,
                           "config": {"mediaType": oci_layout.CONFIG_TYPE, "digest": _sha(config),
                                      "size": len(config)},
                           "layers": [{"mediaType": oci_layout.LAYER_TYPE, "digest": _sha(x), "size": len(x)}
                                      for x in layers]}).encode()
    blobs[_sha(manifest)] = manifest
    members: list[tuple[str, bytes | str]] = [(f"blobs/sha256/{d[7:]}", b) for d, b in blobs.items()]
    members += [("index.json", json.dumps({"schemaVersion": 2, "manifests": [
                    {"mediaType": oci_layout.MANIFEST_TYPE, "digest": _sha(manifest), "size": len(manifest)}]}).encode()),
                ("manifest.json", json.dumps([{"Config": f"blobs/sha256/{_sha(config)[7:]}",
                                               "RepoTags": ["shipyard/real:abc"],
                                               "Layers": [f"blobs/sha256/{_sha(x)[7:]}" for x in layers]}]).encode()),
                ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')]
    return _tar(members)


def _chunks(data: bytes, size: int = 777):
    """The stream in uneven pieces, as the Docker SDK yields it."""
    return (data[i:i + size] for i in range(0, len(data), size))


def _read_layout(dest):
    index = json.loads((dest / "index.json").read_text())
    assert json.loads((dest / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    [entry] = index["manifests"]
    blob = lambda d: (dest / "blobs" / "sha256" / d[7:]).read_bytes()  # noqa: E731
    manifest = json.loads(blob(entry["digest"]))
    assert _sha(blob(entry["digest"])) == entry["digest"] and entry["size"] == len(blob(entry["digest"]))
    return entry, manifest, blob


@pytest.mark.parametrize("archive", [legacy_archive, oci_archive], ids=["legacy", "docker25-oci"])
def test_saved_image_becomes_a_layout_with_uncompressed_layers_under_their_diff_ids(archive, tmp_path):
    got = oci_layout.write_layout(_chunks(archive()), tmp_path / "l", "abc")
    entry, manifest, blob = _read_layout(tmp_path / "l")
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": "abc"}
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert [x["mediaType"] for x in manifest["layers"]] == ["application/vnd.oci.image.layer.v1.tar"] * 2
    assert [blob(x["digest"]) for x in manifest["layers"]] == LAYERS  # the bytes as saved, not recompressed
    assert [x["size"] for x in manifest["layers"]] == [len(x) for x in LAYERS]
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["config"]["Labels"] == {"org.shipyard.os": "debian12"}  # the image's config, as built
    assert got == {"layers": 2, "bytes": sum(map(len, LAYERS))}
    # no temporary part left among the blobs
    assert not [p for p in (tmp_path / "l" / "blobs" / "sha256").iterdir() if p.name.startswith(".")]


def test_a_layer_saved_once_and_linked_from_a_later_layer(tmp_path):
    same = [LAYERS[0], LAYERS[0]]
    oci_layout.write_layout(_chunks(legacy_archive(same, link_second=True)), tmp_path / "l", "abc")
    _, manifest, blob = _read_layout(tmp_path / "l")
    assert [blob(x["digest"]) for x in manifest["layers"]] == same


def test_a_layer_that_is_not_what_the_config_recorded_is_refused(tmp_path):
    """A damaged stream (a changed byte in a layer) must not become a SIF of other bytes than were built."""
    config = _config()
    bad = [LAYERS[0], LAYERS[1].replace(b"xxxx", b"xxxy", 1)]
    with pytest.raises(ShipyardError, match=r"docker save: layer 2 is [0-9a-f]{12}, the config says [0-9a-f]{12}: "
                                            r"the saved stream is damaged"):
        oci_layout.write_layout(_chunks(legacy_archive(bad, config=config)), tmp_path / "l", "abc")


@pytest.mark.parametrize("where", [b"ID=debian", b"\x7fELF", b'[{"Config"'])
def test_a_stream_that_stops_early_is_one_line(where, tmp_path):
    """Cut inside a member: the first layer, the second, manifest.json."""
    data = legacy_archive()
    with pytest.raises(ShipyardError, match=r"^docker save: the stream ended or broke"):
        oci_layout.write_layout(_chunks(data[:data.index(where) + 5]), tmp_path / "l", "abc")


@pytest.mark.parametrize("manifest, why", [
    (b"[]", "manifest.json names no single image"),
    (b'[{"Config": "x.json", "Layers": []}, {"Config": "y.json", "Layers": []}]', "manifest.json names no single"),
    (b'[{"Config": "missing.json", "Layers": []}]', "the config manifest.json names is missing"),
    (b"not json", "no readable manifest.json"),
])
def test_a_manifest_that_names_no_one_image_is_refused(manifest, why, tmp_path):
    with pytest.raises(ShipyardError, match=why):
        oci_layout.write_layout(_chunks(_tar([("manifest.json", manifest)])), tmp_path / "l", "abc")


def test_member_names_never_become_paths(tmp_path):
    """Blobs are written under the digest of their bytes: a member named to escape lands nowhere but blobs/."""
    data = legacy_archive()
    evil = b""
    for name in ("../../escaped", "/abs/escaped"):  # members alone, without tar's end-of-archive blocks
        info = tarfile.TarInfo(name)
        info.size = 1
        evil += info.tobuf(tarfile.GNU_FORMAT) + b"x".ljust(512, b"\0")
    oci_layout.write_layout(_chunks(evil + data), tmp_path / "deep" / "l", "abc")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep" / "escaped").exists()
    assert {p.name for p in (tmp_path / "deep").iterdir()} == {"l"}
    assert {p.name for p in (tmp_path / "deep" / "l").iterdir()} == {"blobs", "index.json", "oci-layout"}


def test_not_a_tar_stream_is_one_line(tmp_path):
    with pytest.raises(ShipyardError, match=r"^docker save: "):
        oci_layout.write_layout(_chunks(b"{\"message\": \"No such image\"}" + b"\0" * 600), tmp_path / "l", "abc")


def test_the_reading_thread_hands_on_the_streams_error(tmp_path):
    """A save that breaks in the engine (the SDK raises while iterating) is raised where the layout is written."""
    def broken():
        yield legacy_archive()[:4096]
        raise ConnectionResetError("engine went away")

    with pytest.raises(ConnectionResetError, match="engine went away"):
        oci_layout.write_layout(broken(), tmp_path / "l", "abc")


def test_an_early_stop_ends_the_reading_thread_and_closes_the_stream(tmp_path):
    """A refused stream (here: not one image) must not leave a thread reading the engine's socket."""
    closed = []

    def endless():
        try:
            yield _tar([("manifest.json", b"[]")])[:1024]
            while True:
                yield b"\0" * 512
        finally:
            closed.append(True)

    import threading
    before = threading.active_count()
    with pytest.raises(ShipyardError, match="manifest.json names no single image"):
        oci_layout.write_layout(endless(), tmp_path / "l", "abc")
    assert closed == [True]
    assert threading.active_count() == before
