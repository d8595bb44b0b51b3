"""Weight patches (protocol/patch.py, shardcast/local.py): bit-exact rebuilds, and a
patch that cannot rebuild the signed version refused before anything is installed."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
import zstandard
from nacl.signing import SigningKey

from swarmrl.protocol import patch as patch_module
from swarmrl.protocol.manifest import read_manifest, verify_version
from swarmrl.protocol.patch import MAGIC, PatchError, apply_patch, read_header
from swarmrl.shardcast.local import LocalWeights


def _write_version(d, weights: np.ndarray, extra: bytes = b"{}") -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(weights.tobytes())
    (d / "config.json").write_bytes(extra)


def _bf16_steps(rng, n: int, versions: int, changed: float) -> list[np.ndarray]:
    """bfloat16 bit patterns of `versions` versions; each step moves `changed` of the
    elements by one or two units in the last place (what an RL step does in bf16)."""
    w = rng.integers(0x3C00, 0x3F80, size=n, dtype=np.uint16)  # |x| in [2^-7, 1)
    out = [w.copy()]
    for _ in range(versions - 1):
        idx = rng.choice(n, size=int(changed * n), replace=False)
        w[idx] = w[idx] + rng.integers(-2, 3, size=idx.size).astype(np.uint16)
        out.append(w.copy())
    return out


def _publish_all(tmp_path, arrays, **kw) -> LocalWeights:
    weights = LocalWeights(tmp_path / "origin", keep=8, key=SigningKey.generate(), **kw)
    for v, a in enumerate(arrays):
        _write_version(weights.staging_dir(v), a, extra=b'{"v": %d}' % (v // 2))
        weights.publish(v)
    return weights


def _expect(m):
    return [(f.name, f.size, f.sha256) for f in m.files]


def _rebuild(weights: LocalWeights, base: int, version: int, out, patch=None) -> None:
    bm, m = read_manifest(weights.path(base)), read_manifest(weights.path(version))
    p = m.patch_from(base)
    assert p is not None and p.base_matches(bm)
    apply_patch(
        patch or weights.path(version) / p.file.name, weights.path(base), base,
        p.base_files, version, _expect(m), out,
    )  # fmt: skip


def test_random_versions_rebuild_bit_exactly_and_patches_are_small(tmp_path):
    rng = np.random.default_rng(0)
    arrays = _bf16_steps(rng, 500_000, 4, changed=0.01)
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.5)
    full = arrays[0].nbytes
    for v in range(1, 4):
        m = read_manifest(weights.path(v))
        (p,) = m.patches
        assert p.base_version == v - 1 and p.file.size < full / 10, p.file.size
        out = tmp_path / f"rebuilt-{v}"
        out.mkdir()
        _rebuild(weights, v - 1, v, out)
        for f in m.files:
            assert (out / f.name).read_bytes() == (weights.path(v) / f.name).read_bytes()
    # the patch file travels beside the version and is verified with it
    verify_version(weights.path(3), weights.key.verify_key.encode().hex(), patches=True)


def _ops(weights: LocalWeights, version: int) -> dict[str, str]:
    (p,) = read_manifest(weights.path(version)).patches
    path = weights.path(version) / p.file.name
    with open(path, "rb") as f:
        header, _ = read_header(f, path.stat().st_size)
    return {e.name: e.op for e in header["files"]}


@pytest.mark.parametrize("changed", [0.005, 0.3])
def test_each_file_takes_the_smaller_encoding_across_windows(tmp_path, monkeypatch, changed):
    """Each file is patched by the smaller of its XOR and its changed words (few changed
    elements: the changed words); either rebuilds bit-exactly, also when the file
    spans many windows."""
    monkeypatch.setattr(patch_module, "WINDOW", 64 * 1024)  # 300 kB: five windows
    rng = np.random.default_rng(3)
    arrays = _bf16_steps(rng, 150_001, 2, changed=changed)  # an odd word count
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.9)
    stats = weights.last_patch
    smaller = "sparse" if stats["sparse_bytes"] < stats["xor_bytes"] else "xor"
    assert _ops(weights, 1)["model.safetensors"] == smaller
    assert smaller == "sparse" or changed > 0.01
    out = tmp_path / "rebuilt"
    out.mkdir()
    _rebuild(weights, 0, 1, out)
    assert (out / "model.safetensors").read_bytes() == arrays[1].tobytes()
    assert stats["changed_words"] == np.count_nonzero(arrays[1] != arrays[0]) > 0


def test_a_file_of_an_odd_size_is_patched_by_xor(tmp_path):
    """Changed words need an even size; a file of another is XORed, bit-exactly."""
    rng = np.random.default_rng(5)
    arrays = [a.view(np.uint8)[:-1] for a in _bf16_steps(rng, 100_000, 2, changed=0.005)]
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.9)
    assert _ops(weights, 1)["model.safetensors"] == "xor"
    out = tmp_path / "rebuilt"
    out.mkdir()
    _rebuild(weights, 0, 1, out)
    assert (out / "model.safetensors").read_bytes() == arrays[1].tobytes()


def test_a_sparse_patch_with_positions_out_of_range_is_refused(tmp_path):
    """A forged sparse frame whose position runs past its window is refused, and nothing
    is left installed."""
    rng = np.random.default_rng(4)
    arrays = _bf16_steps(rng, 150_000, 2, changed=0.005)
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.9)
    assert _ops(weights, 1) == {"model.safetensors": "sparse", "config.json": "same"}
    # one changed word, at position 10^6 of a 150,000-word window
    frame = zstandard.ZstdCompressor().compress(
        struct.pack("<I", 1) + np.array([1_000_001], "<u4").view(np.uint8).tobytes() + b"\x01\x00"
    )
    (p,) = read_manifest(weights.path(1)).patches
    path = weights.path(1) / p.file.name
    with open(path, "rb") as f:
        header, _ = read_header(f, path.stat().st_size)
    files = [e.__dict__ | ({"length": len(frame)} if e.op == "sparse" else {})
             for e in header["files"]]  # fmt: skip
    head = json.dumps({"base_version": 0, "version": 1, "files": files}).encode()
    forged = tmp_path / "forged.patch"
    forged.write_bytes(MAGIC + struct.pack("<I", len(head)) + head + frame)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PatchError, match="out of order or range"):
        _rebuild(weights, 0, 1, out, forged)
    assert not list(out.iterdir())


def test_anchors_and_patches_too_large_to_pay_go_without(tmp_path):
    rng = np.random.default_rng(1)
    arrays = _bf16_steps(rng, 100_000, 5, changed=0.01)
    arrays[2] = rng.integers(0, 1 << 16, size=100_000, dtype=np.uint16)  # everything changed
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.5, anchor_every=4)
    patched = {
        v: [p.base_version for p in read_manifest(weights.path(v)).patches] for v in range(5)
    }
    assert patched == {0: [], 1: [0], 2: [], 3: [], 4: []}, patched
    assert not list(weights.path(2).glob("*.patch"))
    # version 3 has no patch: it differs from 2 as much as 2 from 1
    assert weights.last_patch["anchor"] is True


@pytest.fixture
def two_versions(tmp_path):
    rng = np.random.default_rng(2)
    arrays = _bf16_steps(rng, 200_000, 2, changed=0.01)
    weights = _publish_all(tmp_path, arrays, patch_max_fraction=0.5)
    (p,) = read_manifest(weights.path(1)).patches
    out = tmp_path / "out"
    out.mkdir()
    return weights, weights.path(1) / p.file.name, out


def test_a_flipped_bit_in_the_patch_is_refused(two_versions, tmp_path):
    weights, patch, out = two_versions
    forged = tmp_path / "forged.patch"
    data = bytearray(patch.read_bytes())
    data[len(data) // 2] ^= 0x10
    forged.write_bytes(bytes(data))
    with pytest.raises(PatchError):
        _rebuild(weights, 0, 1, out, forged)
    assert not list(out.iterdir())  # nothing half-written is left to be loaded


def test_a_truncated_patch_is_refused(two_versions, tmp_path):
    weights, patch, out = two_versions
    for cut in (5, len(MAGIC) + 10, patch.stat().st_size - 7):
        short = tmp_path / f"short-{cut}.patch"
        short.write_bytes(patch.read_bytes()[:cut])
        with pytest.raises(PatchError):
            _rebuild(weights, 0, 1, out, short)
    assert not list(out.iterdir())


def test_a_patch_against_another_base_is_refused(two_versions, tmp_path):
    weights, patch, out = two_versions
    m = read_manifest(weights.path(1))
    p = m.patches[0]
    other = tmp_path / "other-base"
    shutil.copytree(weights.path(0), other)
    blob = bytearray((other / "model.safetensors").read_bytes())
    blob[100] ^= 1
    (other / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(PatchError, match="base file is not the one"):
        apply_patch(patch, other, 0, p.base_files, 1, _expect(m), out)
    with pytest.raises(PatchError, match="expected 5 to 1"):
        apply_patch(patch, weights.path(0), 5, p.base_files, 1, _expect(m), out)
