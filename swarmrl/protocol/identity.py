"""Identities: ed25519 keys (PyNaCl) for the trainer, validators and every node.

A key file holds the 32-byte seed as hex, created with mode 0600. The public
key, also hex, is what others are told to trust: the trainer's public key is
the only thing a relay, worker or validator needs to check every manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from swarmrl.errors import UserError


class IdentityError(UserError, ValueError):
    """A key file or public key that cannot be used."""


def load_or_create_key(path: Path) -> SigningKey:
    path = Path(path)
    if path.exists():
        return load_key(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.encode().hex() + "\n")
    os.replace(tmp, path)
    path.with_suffix(".pub").write_text(public_key_hex(key) + "\n")
    return key


def _hex32(text: str, what: str) -> bytes:
    """32 bytes written as hex, or IdentityError naming `what`."""
    text = text.strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise IdentityError(f"{what} is not hex") from None
    if len(raw) != 32:
        raise IdentityError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def load_key(path: Path) -> SigningKey:
    return SigningKey(_hex32(Path(path).read_text(), f"{path}: the ed25519 seed"))


def public_key_hex(key: SigningKey) -> str:
    return key.verify_key.encode().hex()


def parse_public_key(text: str) -> VerifyKey:
    return VerifyKey(_hex32(text, f"ed25519 public key {text.strip()[:80]!r}"))


def sign(key: SigningKey, message: bytes) -> str:
    return key.sign(message).signature.hex()


def verify(public_key: str, message: bytes, signature: str) -> bool:
    """True when `signature` (hex) is `public_key`'s signature of `message`."""
    try:
        sig = bytes.fromhex(signature)
    except ValueError:
        return False
    if len(sig) != 64:
        return False
    try:
        parse_public_key(public_key).verify(message, sig)
    except (BadSignatureError, IdentityError):
        return False
    return True
