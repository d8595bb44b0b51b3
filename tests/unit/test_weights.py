import json

import pytest

from swarmrl.protocol.manifest import ManifestError, hash_file, verify_version
from swarmrl.shardcast.local import LocalWeights


def _publish(w: LocalWeights, v: int, payload: bytes = b"weights") -> None:
    d = w.staging_dir(v)
    (d / "model.safetensors").write_bytes(payload + bytes([v]))
    (d / "config.json").write_text("{}")
    w.publish(v)


def test_versions_complete_only_with_manifest_and_retention(tmp_path):
    w = LocalWeights(tmp_path, keep=3)
    assert w.newest() is None
    for v in range(5):
        _publish(w, v)
    assert w.versions() == [2, 3, 4]  # keep = async_level + 1
    half = w.staging_dir(5)  # files written, manifest not yet: invisible
    (half / "model.safetensors").write_bytes(b"partial")
    assert w.newest() == 4
    manifest = json.loads((w.path(4) / "manifest.json").read_text())
    assert manifest["version"] == 4 and {f["name"] for f in manifest["files"]} == {
        "config.json",
        "model.safetensors",
    }
    with pytest.raises(FileExistsError):
        w.staging_dir(4)


def test_verify_detects_tampering(tmp_path):
    w = LocalWeights(tmp_path)
    _publish(w, 0)
    verify_version(w.path(0))
    (w.path(0) / "model.safetensors").write_bytes(b"weightX\x00")  # same size, other bytes
    with pytest.raises(ManifestError, match="sha256 mismatch"):
        verify_version(w.path(0))
    (w.path(0) / "manifest.json").write_text('{"version": -1}')
    with pytest.raises(ManifestError, match="malformed manifest"):
        verify_version(w.path(0))


def test_shard_hashes(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(bytes(range(256)) * 10)  # 2560 bytes
    entry = hash_file(f, shard_bytes=1000)
    assert [s.size for s in entry.shards] == [1000, 1000, 560]
    assert [s.offset for s in entry.shards] == [0, 1000, 2000]
    assert entry.size == 2560
