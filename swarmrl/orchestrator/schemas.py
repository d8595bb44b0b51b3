"""Request bodies of the orchestrator API: every field typed and bounded, so a
malformed, oversized or wrongly typed body is a 422 that names the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

SHA256 = r"^[0-9a-f]{64}$"
KEY = r"^[0-9a-f]{64}$"


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hardware(_In):
    cpus: int = Field(ge=1, le=100_000, description="CPU cores the node may use.")
    memory_gb: float = Field(ge=0.0, le=1e7, description="Memory in GB.")
    gpus: list[str] = Field(default_factory=list, max_length=64, description="GPU names.")
    tokens_per_s: float = Field(
        ge=0.0, le=1e9, description="Measured generation speed with this run's model."
    )
    platform: str = Field("", max_length=200, description="OS and Python, for operators.")
    device: str = Field(
        "",
        max_length=200,
        description="Where it generates, e.g. 'cuda:0 (NVIDIA H100)' or 'cpu (2 threads)'.",
    )


class RegisterIn(_In):
    role: Literal["worker", "relay"] = Field(description="What the node does in the run.")
    hardware: Hardware | None = Field(None, description="Required for workers.")
    url: str = Field(
        "",
        max_length=500,
        pattern=r"^(https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/-]*)?)?$",
        description="A relay's public URL.",
    )
    work: str = Field(
        "",
        max_length=20,
        pattern=r"^[0-9]*$",
        description="A new key's proof of work (protocol/work_proof.py), unless invited.",
    )
    invite: str = Field(
        "",
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="An invitation from the operator: admits a new key without proof of "
        "work or the faucet, with the stake it carries.",
    )


class HeartbeatIn(_In):
    policy_version: int | None = Field(
        None, ge=0, le=1 << 40, description="Policy version the node holds."
    )
    want_work: bool = Field(False, description="Ask for an assignment in the answer.")


class UploadIn(_In):
    counter: int = Field(ge=1, le=1 << 62, description="The assignment's counter.")
    size: int = Field(ge=1, le=1 << 40, description="Bytes of the file.")
    sha256: str = Field(pattern=SHA256, description="sha256 of the file, hex.")


class SubmitIn(_In):
    key: str = Field(max_length=500, description="Object key the upload URL was granted for.")
    sha256: str = Field(pattern=SHA256)


class VerdictBody(_In):
    key: str = Field(max_length=500)
    sha256: str = Field(pattern=SHA256)
    node: str = Field(max_length=64)
    step: int = Field(ge=-1, le=1 << 40)
    policy_step: int = Field(ge=-1, le=1 << 40)
    accepted: bool
    check: str = Field("", max_length=64)
    reason: str = Field("", max_length=4000)
    samples: list[int] = Field(default_factory=list, max_length=100_000)
    n_samples: int = Field(0, ge=0, le=1 << 40)
    n_tokens: int = Field(0, ge=0, le=1 << 50)
    stats: dict[str, float | int | str | None] = Field(default_factory=dict, max_length=64)
    seconds: float = Field(0.0, ge=0.0, le=1e9)
    time: float = Field(0.0, ge=0.0, le=1e11)
    validator: str = Field(pattern=KEY)
    signature: str = Field(max_length=128)


class VerdictIn(_In):
    verdict: VerdictBody


class SamplerBody(_In):
    level: int = Field(0, ge=0, le=1000)
    weights: dict[str, float] = Field(default_factory=dict, max_length=1_000_000)


class StepIn(_In):
    step: int = Field(ge=0, le=1 << 40, description="Step the trainer collects for.")
    sampler: SamplerBody = Field(default_factory=SamplerBody)
    done: bool = Field(False, description="The run is over.")
    device: str = Field(
        "",
        max_length=200,
        description="Where the trainer computes, e.g. 'cuda:0 (NVIDIA H100)' or 'cpu (2 threads)'.",
    )


class VersionIn(_In):
    version: int = Field(ge=0, le=1 << 40)


class ConsumeIn(_In):
    step: int = Field(ge=0, le=1 << 40)
    keys: list[str] = Field(max_length=100_000)


class NodeMismatchIn(_In):
    node: str = Field(pattern=KEY, description="The node's key, hex.")
    checked: bool = Field(description="Whether these files were validated.")
    staleness: int = Field(
        0,
        ge=0,
        le=1 << 40,
        description="The step trained minus the policy version that sampled the files.",
    )
    tokens: int = Field(ge=0, le=1 << 50, description="Tokens the figures are over.")
    kl: float = Field(
        ge=-1e-3,
        le=1e6,
        allow_inf_nan=False,
        description="Mean per-token k3 estimate of KL(behaviour policy || trainer's): "
        "non-negative but for rounding (stored clamped at 0).",
    )
    truncated: float = Field(
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Fraction of the tokens whose weight was truncated or masked.",
    )
    files: int = Field(ge=0, le=1 << 40, description="Files the figures are over.")


class MismatchIn(_In):
    step: int = Field(ge=0, le=1 << 40, description="The step the trainer trained.")
    nodes: list[NodeMismatchIn] = Field(
        max_length=10_000,
        description="One entry per (node, checked, staleness) cell trained on.",
    )

    @model_validator(mode="after")
    def one_entry_per_cell(self) -> MismatchIn:
        cells = {(n.node, n.checked, n.staleness) for n in self.nodes}
        if len(cells) != len(self.nodes):
            raise ValueError("more than one entry for a (node, checked, staleness) cell")
        return self


class TrainerRejectIn(_In):
    key: str = Field(max_length=500)
    reason: str = Field(max_length=4000)


class RelayReportIn(_In):
    url: str = Field(max_length=500)
    what: str = Field("", max_length=500)


class InvitesIn(_In):
    count: int = Field(1, ge=1, le=1000, description="How many invitations to issue.")
    stake: float | None = Field(
        None, ge=0.0, le=1e12, description="Stake each one deposits (default: orchestrator.stake)."
    )


class RunControlIn(_In):
    paused: bool | None = Field(None, description="Stop handing out new work (or resume).")
    stopped: bool | None = Field(None, description="End the run: every process exits.")


class ClaimIn(_In):
    max_policy: int = Field(
        -1, ge=-1, le=1 << 40, description="Newest policy version this validator holds."
    )
    device: str = Field(
        "",
        max_length=200,
        description="Where this validator computes, e.g. 'cuda:0 (NVIDIA H100)' or 'cpu (2 threads)'.",
    )


class MetricsIn(_In):
    step: int = Field(ge=0, le=1 << 40, description="The step the row describes.")
    row: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,64}$")],
              float | int | bool | None] = Field(
        max_length=512, description="The step's metrics.jsonl row (flat: names to numbers)."
    )  # fmt: skip


class EvaluationIn(_In):
    name: str = Field(
        pattern=r"^[a-z0-9_]{1,64}$", description="Which evaluation, e.g. 'start_model'."
    )
    step: int = Field(ge=0, le=1 << 40, description="The policy version it scored.")
    result: dict[Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,64}$")],
                 float | int | bool | Annotated[str, StringConstraints(max_length=200)] | None] = Field(
        max_length=64, description="Its figures (eval.json): accuracy, mean reward, ..."
    )  # fmt: skip
