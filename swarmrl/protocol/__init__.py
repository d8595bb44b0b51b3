"""The protocol shared by every process: identities and request signing, the
orchestrator client, and the naming of assignments and rollout files."""
