"""swarmrl: decentralized asynchronous RL for language models."""

__version__ = "0.1.0"
