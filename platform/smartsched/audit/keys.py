"""Ed25519 keys for signing audit heads (the ``cryptography`` package).

The private key is a PEM file created 0600 and never overwritten; the verifier needs
only the public key (a PEM file, or the 64 hex digits of the raw key). A key id (the
first 8 bytes of SHA-256 of the raw public key) goes with every head, so a log
signed across a key rotation names which key each head needs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file

MAX_PEM_BYTES = 64 * 1024  # a PEM key is a few hundred bytes


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_key(private_path: str | Path, public_path: str | Path | None = None) -> str:
    """Write a new key pair (private 0600, never over an existing file); return its id."""
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path else private_path.with_suffix(".pub")
    if public_path.absolute() == private_path.absolute():  # keygen --out k.pub: the public
        raise ValidationError("key", f"{private_path} would hold both keys: give the "  # key
                              "private key a name not ending in .pub")  # over the private
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    # Neither file is written over: a verifier that pinned an earlier public key kept
    # only that file.
    for path in (private_path, public_path):
        if path.exists() or path.is_symlink():
            raise ValidationError("key", f"{path} exists; not overwriting a key")
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ValidationError("key", f"{private_path} exists; not overwriting a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    try:
        fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # made meanwhile: the new private key has no use then
        private_path.unlink()
        raise ValidationError("key", f"{public_path} exists; not overwriting a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(public_pem)
    return key_id(key.public_key())


def _load_pem(path: str | Path, field: str, kind: type, what: str) -> Any:
    loader = (serialization.load_pem_private_key if kind is Ed25519PrivateKey
              else serialization.load_pem_public_key)
    try:
        raw = read_regular_file(path, MAX_PEM_BYTES)
    except OSError as e:
        raise ValidationError(field, f"{path}: not a readable PEM {what} "
                              f"({e.strerror or e})") from None
    try:
        key = loader(raw, password=None) if kind is Ed25519PrivateKey else loader(raw)
    except (ValueError, TypeError) as e:
        raise ValidationError(field, f"{path}: not a readable PEM {what} "
                              f"({type(e).__name__})") from None
    if not isinstance(key, kind):
        raise ValidationError(field, f"{path}: not an Ed25519 key")
    return key


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    return _load_pem(path, "audit.key_file", Ed25519PrivateKey, "private key")


def load_public_key(spec: str | Path) -> Ed25519PublicKey:
    """A PEM public key file, or 64 hex digits of the raw key."""
    text = str(spec)
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        try:
            return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
        except ValueError:
            raise ValidationError("public_key", f"{text}: not an Ed25519 public key") from None
    return _load_pem(text, "public_key", Ed25519PublicKey,
                     "public key file, nor 64 hex digits of one")


def signature_ok(public: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        public.verify(signature, message)
    except InvalidSignature:
        return False
    return True
