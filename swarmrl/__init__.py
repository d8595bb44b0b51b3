"""swarmrl: decentralized asynchronous RL for language models."""

import os

# Library progress bars (transformers' GGUF conversion uses a bare tqdm) are off by
# default: tqdm reads this when it is first imported, so it is set before anything
# of ours imports a library. A process's log keeps its own lines, and our own bars
# pass disable=False. TQDM_DISABLE=0 brings the libraries' bars back.
os.environ.setdefault("TQDM_DISABLE", "1")

__version__ = "0.1.0"
