"""swarmrl: decentralized asynchronous RL for language models.

The Python API (api.py; docs/reference/python-api.md): `RunConfig` and
`load_config` to build a run's configuration, `run_swarm` to run a swarm on this
machine, `evaluate` to score a model on held-out problems, `join` to join a run
as a worker. They are imported on first use, so `import swarmrl` stays cheap (no
torch, no pydantic until a name is asked for).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

# Library progress bars (transformers' GGUF conversion uses a bare tqdm) are off by
# default: tqdm reads this when it is first imported, so it is set before anything
# of ours imports a library. A process's log keeps its own lines, and our own bars
# pass disable=False. TQDM_DISABLE=0 brings the libraries' bars back.
os.environ.setdefault("TQDM_DISABLE", "1")

__version__ = "0.1.0"

__all__ = ["RunConfig", "SwarmResult", "evaluate", "join", "load_config", "run_swarm"]

if TYPE_CHECKING:
    from swarmrl.api import RunConfig, SwarmResult, evaluate, join, load_config, run_swarm


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("swarmrl.api"), name)
    raise AttributeError(f"module 'swarmrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
