"""[env]: the environment of multi-turn trajectories (tools the model may call).

Imports nothing heavy, as swarmrl/config/run.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config.base import Section


class EnvConfig(Section):
    """[env]: what answers the model between its spans (swarmrl/envs/environment.py).
    Workers generate with it and validators replay it with the same settings, so a
    tool's limits here are the limits on both."""

    kind: Literal["none", "tools", "verifiers"] = Field(
        "none",
        description="'none': one model span per completion; 'tools': the model may call "
        "the tools below, and each call's result is inserted before its next span; "
        "'verifiers': the tools of the verifiers taskset (task.name = 'verifiers'), called "
        'as <tool_call>{"name": ..., "arguments": {...}}</tool_call> and answered '
        "<tool_response>...</tool_response> (envs/verifiers_tools.py), or the taskset's own "
        "multi-turn environment (a vf.Env: its turns go in as user turns after the model's "
        "end of turn, envs/verifiers_episodes.py).",
    )
    tools: list[Literal["calc", "python"]] = Field(
        default_factory=lambda: ["calc"],
        max_length=8,
        description="The tools offered: 'calc' (arithmetic) and 'python' (a program run in "
        "the code sandbox; the tag or json form).",
    )
    syntax: Literal["tag", "equals", "json"] = Field(
        "tag",
        description="How a call is written: 'tag' is <calc>EXPR</calc>, answered "
        "<result>VALUE</result> (and <python>CODE</python> the same way); 'equals' is an "
        "arithmetic expression ending in '=', answered by its value; 'json' is the Hermes "
        'form of Qwen-style templates, <tool_call>{"name": "calc", "arguments": '
        '{"expression": EXPR}}</tool_call> (python: {"code": CODE}), answered '
        "<tool_response>VALUE</tool_response> (envs/tools.py).",
    )
    tool_turns: Literal["inline", "template"] = Field(
        "inline",
        description="Where a json-form call's answer goes: 'inline', inside the model's "
        "turn right after the call (<tool_response>...</tool_response>); 'template', in a "
        "tool turn of the model's chat template: the model ends its turn after the call "
        "(its end-of-sequence token) and the answer is rendered as the template renders a "
        "tool message (Qwen-style templates: a <tool_response> in a turn of its own). For "
        "syntax 'json' and kind 'verifiers' tools.",
    )
    max_turns: int = Field(
        4, ge=1, le=64, description="Model spans per trajectory (the last one gets no answer)."
    )
    tool_timeout_s: float = Field(
        10.0, gt=0, le=600,
        description="kind 'verifiers': seconds the taskset's tools may take to answer a "
        "call (with the calls before it), or its environment its next turn (the episode "
        "played from the start); past it the answer is 'error: time limit'.",
    )  # fmt: skip
    max_expr_chars: int = Field(
        400, ge=1, le=100_000, description="Calculator: the longest expression it reads."
    )
    max_digits: int = Field(
        200, ge=1, le=100_000, description="Calculator: the most digits of an integer."
    )
    max_exponent: int = Field(
        256, ge=1, le=100_000, description="Calculator: the largest exponent of a power."
    )
    python_cpu_s: int = Field(
        2, ge=1, le=60, description="Python tool: CPU seconds a program may use."
    )
    python_memory_mb: int = Field(
        256, ge=64, le=16_384, description="Python tool: a program's address space, in MiB."
    )
    python_version: str = Field(
        "",
        pattern=r"^(3\.\d{1,3})?$",
        description="Python tool: the interpreter version (major.minor) every node runs "
        "programs with (their error messages differ between versions, so a validator on "
        "another would take an honest answer for a forgery); empty: the orchestrator's "
        "own, written into the run config it serves. A node on another version refuses "
        "to start.",
    )
    python_isolation: Literal["auto", "namespace", "process"] = Field(
        "namespace",
        description="Python tool: the code sandbox's isolation (tasks/graders/sandbox.py), "
        "'namespace' or 'process', the same on every node (a program sees its PID, user "
        "and paths); 'auto' is refused when the tool is offered.",
    )

    @property
    def turn_limit(self) -> int:
        """Model spans a rollout row may hold: 1 without an environment."""
        return self.max_turns if self.kind != "none" else 1
