"""The `[shardcast]` section: how weights travel from the trainer."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config.base import Section


class ShardcastConfig(Section):
    """How policy weights travel from the trainer to workers and validators."""

    enabled: bool = Field(
        True,
        description="Send weights through SHARDCAST (origin in the trainer, relays, HTTP); "
        "false: nodes read the trainer's weights directory (one machine only).",
    )
    shard_mb: float = Field(50.0, gt=0.0, le=4096.0, description="Shard size in MB (1e6 bytes).")
    host: str = Field("127.0.0.1", description="Address the origin and relays listen on.")
    origin_port: int = Field(
        0, ge=0, le=65535, description="Origin port; 0 lets `swarmrl rl` pick a free one."
    )
    relays: int = Field(
        1, ge=0, le=16, description="Relays `swarmrl rl` starts (0: workers use the origin)."
    )
    servers: list[str] = Field(
        default_factory=list,
        description="URLs nodes download weights from (`swarmrl rl` sets its relays).",
    )
    public_key: str = Field(
        "",
        pattern=r"^([0-9a-fA-F]{64})?$",
        description="Trainer's ed25519 public key (hex) that manifests must be signed with; "
        "empty: runs/<name>/keys/trainer.pub.",
    )
    key_file: str = Field(
        "", description="Trainer's signing key; empty: runs/<name>/keys/trainer.key (created)."
    )
    parallel: int = Field(
        2, ge=1, le=64, description="Shards a node downloads at once (from different servers)."
    )
    keep_local: int = Field(2, ge=1, le=64, description="Versions a node keeps on disk.")
    direct_io: bool = Field(
        True,
        description="Nodes write downloads with O_DIRECT, around the page cache "
        "(far less CPU on VMs; falls back where the filesystem refuses it).",
    )
    poll_wait_s: float = Field(
        30.0, gt=0.0, le=60.0, description="Long-poll duration when asking for new versions."
    )
    servers_refresh_s: float = Field(
        30.0, gt=0.0, le=3600.0,
        description="How often a node asks the orchestrator for the servers it advertises.",
    )  # fmt: skip
    max_upload_mbps: float = Field(
        0.0, ge=0.0, description="Upload cap of the origin and relays in MB/s (0: none)."
    )
    patch_max_fraction: float = Field(
        0.5, ge=0.0, le=1.0,
        description="The trainer publishes version n also as a patch from version n-1 "
        "(per file the smaller of XOR + zstd and the changed 16-bit words) when it is at most this fraction of the full "
        "version's bytes (0: no patches). Pays in bfloat16 (model.publish_dtype).",
    )  # fmt: skip
    anchor_every: int = Field(
        16, ge=0, le=1_000_000,
        description="Every this many versions one goes without a patch (an anchor), so a "
        "node that fell behind walks a bounded chain of patches (0: no anchors).",
    )  # fmt: skip
    use_patches: bool = Field(
        True,
        description="Nodes that hold the base of a version's patch fetch the patch instead "
        "of the files when it is fewer bytes (the result is checked against the manifest).",
    )
