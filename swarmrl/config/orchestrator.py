"""[orchestrator]: the settings of the protocol service (admission, work, storage,
ledger), kept apart from the training sections of swarmrl/config/run.py, which
loads and documents every section.

Imports nothing heavy, as swarmrl/config/run.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from swarmrl.config.base import Section


class OrchestratorConfig(Section):
    """[orchestrator]: the service every process talks to (admission, work, ledger)."""

    url: str = Field(
        "",
        description="Where processes reach the orchestrator, e.g. http://10.0.0.5:8700 "
        "(`swarmrl rl` starts one and fills this).",
    )
    host: str = Field("127.0.0.1", description="Address `swarmrl orchestrator` listens on.")
    port: int = Field(8700, ge=0, le=65535, description="Port it listens on (0: any free).")
    database: str = Field(
        "",
        description="State database: '' for SQLite at runs/<name>/orchestrator/state.sqlite, a "
        "path to a SQLite file, or a postgresql:// URL (several replicas may share one).",
    )
    store: Literal["local", "s3"] = Field(
        "local",
        description="Object store for rollout files: 'local' (a directory served by the "
        "orchestrator over HTTP with HMAC-signed URLs) or 's3' (presigned URLs).",
    )
    store_dir: str = Field(
        "", description="Directory of the local object store ('': runs/<name>/store)."
    )
    s3_bucket: str = Field("swarmrl", description="S3 bucket of rollout files.")
    s3_endpoint: str = Field(
        "", description="S3 endpoint URL ('' for AWS); credentials come from the environment."
    )
    s3_region: str = Field("us-east-1", description="S3 region.")
    trainer_keys: list[str] = Field(
        default_factory=list,
        description="Public keys (hex) allowed to call trainer endpoints "
        "(`swarmrl rl` fills it; otherwise runs/<name>/keys/trainer.pub).",
    )
    validator_keys: list[str] = Field(
        default_factory=list,
        description="Public keys (hex) allowed to call validator endpoints and sign verdicts "
        "(default: validator.public_keys, then runs/<name>/keys/validator-*.pub).",
    )
    operator_token_file: str = Field(
        "",
        description="File holding the operator's bearer token ('': runs/<name>/keys/operator.token, "
        "created with mode 0600 if missing).",
    )
    clock_window_s: float = Field(
        60.0, gt=0.0, le=3600.0, description="Largest accepted age or lead of a signed request."
    )
    max_request_bytes: int = Field(
        1 << 20, ge=1024, le=1 << 30, description="Largest API request body."
    )
    max_file_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 34, description="Largest rollout file a node may upload."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Time a client has to send a request's line and headers, from opening the "
        "connection or from the request's first byte; then 408 and the connection is closed.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="Time a client has to send a request body, plus its length at "
        "min_body_bytes_per_s; then 408 and the connection is closed.",
    )
    min_body_bytes_per_s: float = Field(
        65536.0,
        gt=0.0,
        le=1e12,
        description="Slowest upload rate allowed for (64 KiB/s: a 64 MiB file gets 17 minutes "
        "more than body_timeout_s).",
    )
    send_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="Time a client may leave its answer unread before it is cut off.",
    )
    idle_timeout_s: float = Field(
        5.0, gt=0.0, le=3600.0, description="An idle kept-alive connection is closed after this."
    )
    max_header_bytes: int = Field(
        32768, ge=1024, le=1 << 24, description="Largest request line and headers (431 above)."
    )
    max_connections: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Open connections in all (lowered to what the process's file limit "
        "allows); one more is answered 503 and closed.",
    )
    max_connections_per_client: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="Open connections from one client (an IPv4 address or an IPv6 /64); one "
        "more is answered 429 and closed. Behind a reverse proxy all clients are the proxy: "
        "raise this and let the proxy limit each client.",
    )
    upload_url_ttl_s: float = Field(
        300.0, gt=0.0, le=86400.0, description="Lifetime of a signed upload URL."
    )
    uploads_per_minute: int = Field(
        60, ge=1, le=100_000, description="Upload URLs one node may request per minute."
    )
    heartbeat_s: float = Field(
        2.0, gt=0.0, le=3600.0, description="How often nodes heartbeat (told to every node)."
    )
    unhealthy_after_s: float = Field(
        10.0, gt=0.0, le=86400.0, description="Silence after which a node is unhealthy."
    )
    dead_after_s: float = Field(
        30.0,
        gt=0.0,
        le=864000.0,
        description="Silence after which a node is dead and its unfinished work re-issued.",
    )
    stake: float = Field(
        100.0,
        ge=0.0,
        le=1e12,
        description="Stake locked for a new worker (ledger units), paid by the operator: "
        "from the faucet, or deposited with an invitation.",
    )
    register_work_s: float = Field(
        2.0,
        ge=0.0,
        le=3600.0,
        description="Proof of work a new key pays to register without an invitation, in "
        "seconds of one CPU core: at its first start the orchestrator measures how fast one "
        "core here hashes and sets register_work_bits to the nearest power of two (kept in "
        "its database, so restarts and replicas agree). 0: none.",
    )
    register_work_bits: int | None = Field(
        None,
        ge=0,
        le=40,
        description="The proof of work in bits (2^bits SHA-256 hashes on average, "
        "protocol/work_proof.py); None: from register_work_s. 0: none.",
    )
    faucet_per_hour: float = Field(
        120.0,
        ge=0.0,
        le=1e9,
        description="New workers per hour given a stake without an invitation (the faucet "
        "refills at this rate); a new worker finding it empty is told to retry (429).",
    )
    faucet_burst: int = Field(
        32,
        ge=0,
        le=1_000_000,
        description="Most stakes the faucet holds at once. 0 (with faucet_per_hour 0): "
        "workers join by invitation only (POST /v1/admin/invites).",
    )
    range_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Most of the faucet (its burst and its rate), of the probation pool and of "
        "the live relays that one address range may hold: an IPv4 /24 or an IPv6 /48 (each "
        "loopback address counts alone). Keys from one range leave the rest to newcomers "
        "from others. 1: no per-range share.",
    )
    blameless_factor: float = Field(
        4.0,
        ge=1.0,
        le=1e6,
        description="A worker whose files are refused without blame (unverifiable, the "
        "validator's own error, or refused by the trainer) this many times more often "
        "than the swarm's files (the swarm's rate held between 1% and 5%, so that many "
        "keys cannot raise it together; at least blameless_min of them; recent counts: "
        "they halve at 100 files a node, 10,000 the swarm) goes back to probation and "
        "waits, as after an expired assignment.",
    )
    blameless_min: int = Field(
        3,
        ge=1,
        le=1_000_000,
        description="Blameless refusals a worker must have before blameless_factor applies.",
    )
    slash_fraction: float = Field(
        1.0, ge=0.0, le=1.0, description="Fraction of its stake a caught cheater loses."
    )
    validity_window_s: float = Field(
        86400.0,
        gt=0.0,
        le=1e8,
        description="A contribution becomes final (can no longer be voided) this long after "
        "it was submitted.",
    )
    margin_groups: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Groups assigned beyond what the trainer still needs "
        "(worker.max_pending_groups, or trainer.batch_groups).",
    )
    assign: Literal["pipelined", "slack"] = Field(
        "pipelined",
        description="Which nodes get new work. `pipelined`: a node whose file, queued "
        "behind the groups already out at the groups a step has lately taken, would be "
        "taken for a step its policy is still fresh for (orchestrator/work.py, "
        "`queued_for`): a node a version behind fills the step being collected while the "
        "trainer updates, and waits (`late-for-its-step`) once that step's work is out. "
        "`slack`: only a node whose policy leaves `work_slack_steps` before staleness "
        "(the rule before pipelining; the planner models both).",
    )
    work_slack_steps: int = Field(
        1,
        ge=0,
        le=1000,
        description='With assign = "slack": new work goes only to a node whose policy '
        "leaves its file this many steps before it would be stale (at least one step "
        "within async_level is always allowed). Not for a node on probation (its file is "
        "for its verdict). 0: any usable policy.",
    )
    assignment_s: float = Field(
        600.0,
        gt=0.0,
        le=86400.0,
        description="Time a node has to upload an assignment before it is re-issued.",
    )
    min_assignment_s: float = Field(
        60.0,
        gt=0.0,
        le=86400.0,
        description="Shortest deadline of an assignment, and the first wait after one expires "
        "(doubling with each further expiry, up to assignment_s).",
    )
    assignment_slack: float = Field(
        4.0,
        ge=1.0,
        le=1000.0,
        description="An assignment's deadline: this many times what the node needs for it "
        "(its measured pace once it has submitted files, its reported speed before), within "
        "[min_assignment_s, assignment_s].",
    )
    prefer_faster: float = Field(
        2.0,
        ge=1.0,
        le=1e6,
        description="When work is short, a node whose measured pace is this many times "
        "faster and that is waiting for work goes first: a slower node gets an assignment "
        "only if room is left for every such node.",
    )
    late_grace_s: float = Field(
        30.0,
        ge=0.0,
        le=86400.0,
        description="Time past its deadline a node may still submit before the file counts "
        "as late (as an expiry).",
    )
    probation_files: int = Field(
        2,
        ge=0,
        le=1000,
        description="Files of a new worker a validator must accept before it leaves probation "
        "(on probation: every file validated, work from a pool shared by all new workers). "
        "0: no probation.",
    )
    probation_groups: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Groups all workers on probation may hold at once, on top of proven "
        "workers' share (0: trainer.batch_groups, at least worker.groups_per_file).",
    )
    trusted_workers: list[str] = Field(
        default_factory=list,
        max_length=10_000,
        description="Worker and relay keys (hex) the operator vouches for: no probation, "
        "no proof of work, a stake without the faucet (`swarmrl rl` lists its own workers "
        "and relays).",
    )
    file_seconds: float = Field(
        600.0,
        gt=0.0,
        le=86400.0,
        description="Target generation time of one file: a node whose measured speed cannot "
        "fill sampling.max_new_tokens per sample in this time gets a shorter length budget.",
    )
    min_new_tokens: int = Field(
        8, ge=1, le=32768, description="Shortest length budget given to a slow node."
    )
    min_cpus: int = Field(1, ge=1, le=4096, description="Requirement: CPU cores of a worker.")
    min_memory_gb: float = Field(
        0.5, ge=0.0, le=1e5, description="Requirement: memory of a worker."
    )
    min_tokens_per_s: float = Field(
        0.0, ge=0.0, le=1e9, description="Requirement: measured generation speed of a worker."
    )
    validation_lease_s: float = Field(
        120.0,
        gt=0.0,
        le=86400.0,
        description="Time a validator holds a file; then it goes to another validator.",
    )
    relay_networks: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Networks (CIDR) a registered relay's address may lie in besides public "
        "addresses, e.g. 10.0.0.0/8 inside a cluster or 127.0.0.0/8 on one machine. "
        "Otherwise loopback, link-local, private, multicast and reserved addresses are "
        "refused, so that no key can aim workers at them.",
    )
    relay_reports: int = Field(
        2,
        ge=1,
        le=1000,
        description="Distinct reporters (validators, or workers with an accepted file) of a "
        "relay's key within relay_report_s after which the relay is delisted, with every "
        "key registered at one of its endpoints: their keys and hosts are held off the list "
        "for relay_hold_s.",
    )
    relay_report_s: float = Field(
        3600.0,
        gt=0.0,
        le=1e7,
        description="How long a report of a relay counts. A reporter's reports count for its "
        "16 most recent relays.",
    )
    relay_hold_s: float = Field(
        3600.0,
        gt=0.0,
        le=1e8,
        description="How long a delisted relay's key and host (any port; IPv6 its /64) may not register again "
        "(doubling with each further delisting of the key); then the key registers as a "
        "new one would, and is advertised only once its check passes.",
    )
    max_relays: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Most live registered relays at once (range_share of them from one "
        "address range), counting those advertised and those within their first "
        "relay_check_s x (relay_check_failures + 1); one more is refused (429) until one "
        "dies, is delisted or fails its first checks.",
    )
    relay_check_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="How often the orchestrator checks each registered relay: it fetches the "
        "manifest of a version the run published from the relay and verifies it. A relay is "
        "advertised only once a check has passed (the first check comes at the next sweep).",
    )
    relay_check_failures: int = Field(
        3,
        ge=1,
        le=1000,
        description="Consecutive failed checks (no answer, an error, garbage, no version "
        "within async_level of the newest) after which an advertised relay is dropped; a "
        "manifest signed by another key or of another version drops it at the first.",
    )
    relay_check_timeout_s: float = Field(
        5.0,
        gt=0.0,
        le=60.0,
        description="Time one check of a relay may take in all, name lookup and both "
        "requests included (connecting: at most 2 s of it); past it the check failed.",
    )
    dashboard: bool = Field(
        True,
        description="Serve the live dashboard at /dashboard (and its read-only API under "
        "/v1/dashboard/): the run, the swarm, the verdicts, and a rollout viewer.",
    )
    public_rollouts: bool = Field(
        False,
        description="Let anyone who can reach the dashboard read rollout texts (prompts and "
        "completions); off, the rollout viewer asks for the operator token.",
    )
    keep_trained_steps: int = Field(
        8,
        ge=0,
        le=100_000,
        description="Rollout files stay in the object store this many versions after the "
        "trainer used them (the rollout viewer reads them), then are deleted; rejected "
        "files as many versions after the policy they were generated with.",
    )

    @field_validator("trusted_workers")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        import re

        for k in v:
            if not re.fullmatch(r"[0-9a-f]{64}", k):
                raise ValueError(f"{k[:80]!r} is not a public key (64 lowercase hex digits)")
        return v

    @field_validator("relay_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        for net in v:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"{net!r} is not a network in CIDR notation") from None
        return v
