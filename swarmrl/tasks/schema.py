"""The task record every dataset row must satisfy.

A task is one problem with a verifiable answer. `verification_info` holds what
the verifier of `task_type` needs (for example the expected answer); it is a
dict in memory and a JSON string on disk.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from swarmrl.errors import UserError


class TaskError(UserError, ValueError):
    """A malformed task record; the message names the record and the field."""


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    problem_id: str = Field(min_length=1, max_length=256)
    prompt: str = Field(min_length=1, max_length=100_000)
    task_type: str = Field(min_length=1, max_length=64)
    verification_info: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("verification_info", "metadata", mode="before")
    @classmethod
    def _decode_json(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return json.loads(v)
            except json.JSONDecodeError as e:
                raise ValueError(f"not valid JSON: {e}") from e
        return v


def parse_task(record: dict[str, Any], where: str = "task") -> Task:
    """Validate one record; raise TaskError naming `where` and the bad field."""
    try:
        return Task.model_validate(record)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field = ".".join(str(p) for p in err["loc"]) or "<record>"
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"field '{field}': {msg}")
        raise TaskError(f"{where}: " + "; ".join(problems)) from None
