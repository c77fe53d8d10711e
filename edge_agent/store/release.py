"""Signed model releases: what a fleet publishes and what a box agrees to install.

A release wraps a model's `Manifest` (how to feed and decode it) with what a
box needs to trust the bytes: every file's sha256, size and per-chunk hashes,
the model's name and a version that only goes up, when it was made and when it
stops being valid, and the id of the key that signed it.

Signatures are Ed25519 over the release's canonical JSON (sorted keys, no
whitespace, UTF-8), the way TUF signs its `signed` object. A box checks them over
the release as it was received, canonicalised, never over its own re-serialisation:
a fleet is never on one version, and a release parsed by a newer edge-agent gains
the defaults of fields added since it was signed, so its re-serialisation is not
what was signed. The store and the fleet's repository keep the bytes received, for
the same reason. `verify` guards the
two attacks TUF names for a box that can be fed old data:
- *freeze*: an attacker keeps replaying a release long after the fleet moved on
  -> every release expires (`release.expired`);
- *rollback*: an attacker offers an older, perhaps vulnerable, version
  -> a version at or below the installed one is refused (`release.rollback`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import quote

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from edge_agent import __version__
from edge_agent.catalog.manifest import Manifest, load_manifest
from edge_agent.clock import CLOCK_FLOOR_UTC
from edge_agent.config_files import RECORDED, first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.paths import MODEL_NAME, is_safe_name

log = logging.getLogger(__name__)

MIN_CHUNK = 64 * 1024
MAX_CHUNK = 128 * 1024
"""AWS IoT's MQTT file delivery caps a block at 128 KB; below 64 KiB the per-message
overhead on the broker dominates (issue 9's measurements)."""
DEFAULT_CHUNK = MAX_CHUNK
DEFAULT_LIFETIME = timedelta(days=30)
_SHA256 = r"^[0-9a-f]{64}$"
_URL = r"^(https?|file)://"

Precision = Literal["f32", "f16", "bf16", "int8", "int4", "mixed"]


RELEASE_FILE = "release.json"
"""Where the store keeps a version's signed release, beside its files: no file of a
release may take that path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReleaseFile(_Strict):
    """One file of a release, with everything needed to check it chunk by chunk."""

    path: str = Field(
        description="Path relative to the version's folder, '/'-separated; no '..', no root."
    )
    sha256: str = Field(pattern=_SHA256, description="sha256 of the whole file.")
    size: int = Field(ge=0, description="Size of the file in bytes.")
    chunks: list[str] = Field(
        description=(
            "sha256 of each chunk of `chunk_size` bytes (the last may be shorter), "
            "so a transfer can check and resume chunk by chunk."
        )
    )
    url: str | None = Field(
        default=None,
        pattern=_URL,
        description=(
            "Optional http(s):// or file:// URL of a mirror's copy, for large files; the box "
            "downloads from it first, and MQTT carries what it fails to give."
        ),
    )


class Release(_Strict):
    """What the fleet signs: a model version, its files and its manifest."""

    schema_version: Literal[1] = Field(default=1, description="Version of this release format.")
    name: str = Field(description="Model name in the store; one safe path component.")
    version: int = Field(ge=1, description="Only goes up, per name.")
    model: str = Field(description="Path (among `files`) of the file the runtime loads.")
    files: list[ReleaseFile] = Field(min_length=1, description="Every file of this version.")
    format: Literal["onnx", "ir", "tflite", "tf"] = Field(description="File format of `model`.")
    precision: Precision = Field(description="Precision of the model's weights.")
    chunk_size: int = Field(
        ge=MIN_CHUNK, le=MAX_CHUNK, description="Bytes per chunk for `files[].chunks`."
    )
    created_at: AwareDatetime = Field(description="When the release was made (UTC).")
    expires_at: AwareDatetime = Field(description="After this the release is refused (UTC).")
    key_id: str = Field(description="Id of the signing key: `key_id()` of its public key.")
    latency_budget_ms: float | None = Field(
        default=None,
        gt=0,
        description="Optional health-gate budget: median smoke inference must be at most this.",
    )
    manifest: Manifest = Field(description="How to feed the model and decode its outputs.")
    _received: bytes | None = PrivateAttr(default=None)
    """The canonical bytes of this release as it was received (`parse_signed_release`);
    None for one built here, whose own serialisation is what it is signed over."""

    def __eq__(self, other: object) -> bool:
        # The same fields are the same release, whichever way they came.
        if not isinstance(other, Release):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def file(self, path: str) -> ReleaseFile:
        """The file entry at `path`.

        Raises:
            EdgeAgentError: no such file in the release (release.invalid).
        """
        for entry in self.files:
            if entry.path == path:
                return entry
        raise EdgeAgentError(
            f"release {self.name} v{self.version} has no file {path!r}", code="release.invalid"
        )

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


class SignedRelease(_Strict):
    """A release and its signature, as it travels and as the store keeps it."""

    release: Release = Field(description="The signed content.")
    signature: str | None = Field(
        default=None,
        description="Base64 Ed25519 signature over `canonical_bytes(release)`; None if unsigned.",
    )

    _received: bytes | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SignedRelease):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def to_json(self) -> bytes:
        """JSON for files and messages (the signature covers the release, not this): the bytes
        received, for a release that was; indented JSON for one made here."""
        if self._received is not None:
            return self._received
        return self.model_dump_json(indent=2).encode("utf-8")


# --- canonical form and hashing -----------------------------------------------------------
def canonical_bytes(release: Release) -> bytes:
    """The exact bytes that are signed: sorted keys, no whitespace, UTF-8; for a release that
    was received, of what was received (see the module's docstring)."""
    if release._received is not None:
        return release._received
    return _canonical(release.model_dump(mode="json"))


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def describe_file(path: Path, relative: str, chunk_size: int = DEFAULT_CHUNK) -> ReleaseFile:
    """Hash a file on disk into a release entry, streaming (bounded memory)."""
    whole = hashlib.sha256()
    chunks: list[str] = []
    size = 0
    with path.open("rb") as fh:
        while block := fh.read(chunk_size):
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
            size += len(block)
    return ReleaseFile(path=relative, sha256=whole.hexdigest(), size=size, chunks=chunks)


def chunk_count(size: int, chunk_size: int) -> int:
    """Chunks of `chunk_size` needed for `size` bytes (0 for an empty file)."""
    return -(-size // chunk_size)


def weights_precision(manifest: Manifest) -> Precision:
    """The precision of a model's weights, from what calibration wrote in its manifest.

    A calibration whose compressed rungs all failed the gate still writes a quantization
    table (the FP32 model, pinned to a float precision): its weights are f32, not int8.
    """
    if manifest.quantization is None:
        return "f32"
    mode = manifest.quantization.mode
    if mode == "weights-int4":
        return "int4"
    return "int8" if mode.startswith(("int8", "weights-int8")) else "f32"


def build_release(
    *,
    name: str,
    version: int,
    folder: Path,
    files: Sequence[str],
    model: str,
    manifest: Manifest,
    precision: Precision = "f32",
    chunk_size: int = DEFAULT_CHUNK,
    lifetime: timedelta = DEFAULT_LIFETIME,
    latency_budget_ms: float | None = None,
    now: datetime | None = None,
) -> Release:
    """An unsigned release for `files` (relative to `folder`); `sign` fills in `key_id`.

    The manifest is renamed to `name` and loses its wheel source: in the store the
    bytes come from the release, not from PyPI.
    """
    if not re.fullmatch(MODEL_NAME, name):
        # model_copy below does not validate: a release named otherwise was written, and
        # then never read back (the store listed it damaged for good).
        raise EdgeAgentError(
            f"model name {name!r} is not lowercase letters, digits and '-'",
            "name the model like models/*.toml do, for instance person-ssdlite-int8",
            code="input.invalid",
        )
    created = now or datetime.now(UTC)
    return Release(
        name=name,
        version=version,
        model=model,
        files=[describe_file(folder / rel, rel, chunk_size) for rel in files],
        format=manifest.format,
        precision=precision,
        chunk_size=chunk_size,
        created_at=created,
        expires_at=created + lifetime,
        key_id="",
        latency_budget_ms=latency_budget_ms,
        manifest=manifest.model_copy(update={"name": name, "source": None}),
    )


# --- keys ------------------------------------------------------------------------------------
def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable id for a public key: the first 16 hex digits of sha256(raw key)."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def save_private_key(key: Ed25519PrivateKey, path: Path) -> None:
    """Write an unencrypted PKCS#8 PEM readable by its owner only (mode 0600 from creation)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 rather than chmod-ed afterwards: no window where others can read it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # O_CREAT's mode does not apply to a file that already existed: tighten it before writing.
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)


def save_public_key(key: Ed25519PublicKey, path: Path) -> None:
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pem)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Raises: EdgeAgentError (input.not_found / input.invalid)."""
    try:
        key = serialization.load_pem_private_key(_read_key(path), password=None)
    except (ValueError, TypeError):  # TypeError: the key is encrypted
        raise EdgeAgentError(
            f"{path} is not an unencrypted PEM private key", _KEY_FIX, "input.invalid"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EdgeAgentError(f"{path} is not an Ed25519 private key", _KEY_FIX, "input.invalid")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Raises: EdgeAgentError (input.not_found / input.invalid)."""
    try:
        key = serialization.load_pem_public_key(_read_key(path))
    except ValueError:
        raise EdgeAgentError(f"{path} is not a PEM public key", _KEY_FIX, "input.invalid") from None
    if not isinstance(key, Ed25519PublicKey):
        raise EdgeAgentError(f"{path} is not an Ed25519 public key", _KEY_FIX, "input.invalid")
    return key


_KEY_FIX = "make a key pair with `edge-fleet keygen`"


def _read_key(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise EdgeAgentError(
            f"key file {path} does not exist", _KEY_FIX, "input.not_found"
        ) from None
    except OSError as exc:
        raise EdgeAgentError(
            f"key file {path} is unreadable: {exc}", code="input.invalid"
        ) from None


# --- sign and verify -----------------------------------------------------------------------
def sign(release: Release, key: Ed25519PrivateKey) -> SignedRelease:
    """Sign `release` with `key`, setting its `key_id` to that key's id first."""
    stamped = Release.model_validate({**release.model_dump(), "key_id": key_id(key.public_key())})
    signature = key.sign(canonical_bytes(stamped))
    return SignedRelease(release=stamped, signature=base64.b64encode(signature).decode("ascii"))


def check_paths(release: Release) -> None:
    """Every name and path in `release` stays inside its version folder.

    Call this before writing any byte a release names (a transfer does; `verify` does).

    Raises:
        EdgeAgentError: store.path for `..`, an absolute path, a backslash, an unsafe name,
            a path not in its plain form (`./m.onnx`, `a//b`) or the reserved `release.json`.
    """
    if not is_safe_name(release.name):
        raise EdgeAgentError(
            f"release name {release.name!r} is not a safe store name",
            "use letters, digits, '-', '_' and '.', no '..' and no '/'",
            "store.path",
        )
    seen: set[str] = set()
    for entry in [*release.files]:
        parts = PurePosixPath(entry.path).parts
        if (
            not parts
            or "\\" in entry.path
            or entry.path.startswith("/")
            or not all(is_safe_name(p) for p in parts)
        ):
            raise EdgeAgentError(
                f"release {release.name} names file {entry.path!r}, which would escape the store",
                "use relative paths of safe names, without '..'",
                "store.path",
            )
        if "/".join(parts) != entry.path:
            # `./m.onnx` or `sub//m.onnx` installed, then never activated ("not part of
            # the release"), its version number spent; beside `m.onnx`, a bare OSError.
            raise EdgeAgentError(
                f"release {release.name} names file {entry.path!r}, not in its plain form "
                f"({'/'.join(parts)!r})",
                "name each file by its plain relative path: no '.', no empty or trailing '/'",
                "store.path",
            )
        if entry.path == RELEASE_FILE:
            # The store writes its record of the release there, through the hard link
            # into a blob another version may share.
            raise EdgeAgentError(
                f"release {release.name} names a file {RELEASE_FILE!r}, the store's own "
                "record of the release",
                f"rename that file: {RELEASE_FILE} at the top of a version is reserved",
                "store.path",
            )
        if entry.path in seen:
            raise EdgeAgentError(
                f"release {release.name} lists {entry.path!r} twice", code="release.invalid"
            )
        seen.add(entry.path)


def _check_shape(release: Release) -> None:
    release.file(release.model)  # raises if the model file is not among the files
    if release.manifest.name != release.name or release.manifest.format != release.format:
        raise EdgeAgentError(
            f"release {release.name} carries a manifest for {release.manifest.name!r} "
            f"({release.manifest.format}), not for itself ({release.format})",
            code="release.invalid",
        )
    for entry in release.files:
        if len(entry.chunks) != chunk_count(entry.size, release.chunk_size):
            raise EdgeAgentError(
                f"release {release.name} file {entry.path}: {len(entry.chunks)} chunk hashes "
                f"for {entry.size} bytes in chunks of {release.chunk_size}",
                code="release.invalid",
            )


def same_content(a: Release, b: Release) -> bool:
    """Whether two releases install the same model: the same files, loaded the same way.

    Not the release id: the fleet re-signs a version with a fresh expiry for the boxes that
    missed it, and a box holding it already must take that for the same one. Nor how
    the files travel: each file's chunk hashes and URL changed with `--chunk-kib` and a
    mirror, and the same bytes published again that way were refused (`release.conflict`).
    """

    def installs(release: Release) -> tuple[object, ...]:
        files = sorted((f.path, f.sha256, f.size) for f in release.files)
        return (release.name, release.version, release.model, release.format, files)

    return installs(a) == installs(b) and a.manifest == b.manifest


def trusted_key_ids(keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    return {key_id(k): k for k in keys}


def verify(
    signed: SignedRelease,
    trusted_keys: Sequence[Ed25519PublicKey],
    now: datetime,
    installed_version: int | None,
) -> Release:
    """Accept a release or say why not.

    Args:
        signed: the release as received.
        trusted_keys: the fleet's public keys. Empty means "run unverified": the
            signature is not checked and a warning is logged (expiry, rollback
            and paths still are).
        now: the current time (passed in so tests need no clock tricks).
        installed_version: the newest version of this name the box has installed, if any.

    Returns:
        The release, safe to act on.

    Raises:
        EdgeAgentError: release.signature, release.expired, release.rollback,
            release.invalid or store.path.
    """
    release = signed.release
    if trusted_keys:
        _check_signature(signed, trusted_key_ids(trusted_keys))
    else:
        log_event(
            log,
            logging.WARNING,
            "release_unverified",
            model=release.name,
            version=release.version,
            reason="no trusted keys configured; the signature is not checked",
        )
    check_paths(release)
    _check_shape(release)
    # A box whose clock is not set yet (1970, an old build date) would take any release
    # for unexpired: judged no earlier than edge-agent's own floor, one that expired
    # before it is refused all the same, and none that is valid now can be.
    if max(now, CLOCK_FLOOR_UTC) >= release.expires_at:
        raise EdgeAgentError(
            f"release {release.name} v{release.version} expired at "
            f"{release.expires_at.isoformat()}",
            "ask the fleet to publish a fresh release (or check this box's clock)",
            "release.expired",
        )
    if installed_version is not None and release.version <= installed_version:
        raise EdgeAgentError(
            f"release {release.name} v{release.version} is not newer than installed "
            f"v{installed_version}",
            "publish a higher version; to go back, use `models rollback` or `models activate`",
            "release.rollback",
        )
    return release


def _check_signature(signed: SignedRelease, trusted: dict[str, Ed25519PublicKey]) -> None:
    release = signed.release
    what = f"release {release.name} v{release.version}"
    if not signed.signature:
        raise EdgeAgentError(
            f"{what} is unsigned", "sign it with `edge-fleet`", "release.signature"
        )
    key = trusted.get(release.key_id)
    if key is None:
        raise EdgeAgentError(
            f"{what} is signed by key {release.key_id!r}, which this box does not trust",
            "add the fleet's public key to trusted_keys",
            "release.signature",
        )
    try:
        key.verify(base64.b64decode(signed.signature, validate=True), canonical_bytes(release))
    except (InvalidSignature, binascii.Error, ValueError):
        raise EdgeAgentError(
            f"{what} has a wrong signature for key {release.key_id}",
            "re-publish it from the fleet; do not edit a signed release",
            "release.signature",
        ) from None


# --- reading -------------------------------------------------------------------------------
def parse_signed_release(data: bytes | str, stored: bool = False) -> SignedRelease:
    """Parse a signed release from JSON, keeping what was received for its signature;
    `stored`: one this store installed, read with the `RECORDED` context (what an earlier
    build accepted and served is not refused now).

    The model is validated from the canonical form of the parsed JSON, the bytes the
    signature is checked over: a key given twice cannot mean one thing to the check and
    another to the box.

    Raises:
        EdgeAgentError: release.invalid, naming the first bad field; release.unsupported
            when the release uses fields or a format version this edge-agent does not know.
    """
    received = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    try:
        loaded = json.loads(received)
        inner = _canonical(loaded["release"]) if isinstance(loaded, dict) else None
        whole = _canonical(loaded)
    except (ValueError, RecursionError, KeyError):
        inner = whole = None  # not JSON, or no release in it: pydantic says which
    try:
        signed = SignedRelease.model_validate_json(
            whole if whole is not None else received, context={RECORDED: True} if stored else None
        )
    except ValidationError as exc:  # pydantic's parser has its own depth limit
        raise _invalid(exc) from None
    assert inner is not None  # pydantic took it, so json did: a dict with a release
    signed.release._received = inner
    signed._received = received
    return signed


_PARSE_FIX = (
    "use the signed release JSON that `edge-fleet publish-model` wrote (from its repo, or "
    "the broker's retained copy), unedited"
)


def _invalid(exc: ValidationError) -> EdgeAgentError:
    """release.unsupported when every problem is a field or a format version this edge-agent
    lacks: a newer edge-fleet published it, and no edit of the release will do."""
    errors = exc.errors()
    newer = [
        e
        for e in errors
        if e["type"] == "extra_forbidden"
        or (e["type"] == "literal_error" and e["loc"][-1:] == ("schema_version",))
    ]
    if errors and len(newer) == len(errors):
        places = ", ".join(".".join(str(p) for p in e["loc"]) for e in newer[:5])
        return EdgeAgentError(
            f"the release uses what this edge-agent ({__version__}) does not know: {places}; "
            "a newer edge-fleet published it",
            "upgrade edge-agent on this box, or publish the model with the edge-fleet of "
            "the fleet's oldest agent",
            "release.unsupported",
        )
    where, message = first_error(exc)
    return EdgeAgentError(
        f"release is invalid at {where}: {message}", _PARSE_FIX, "release.invalid"
    )


def load_signed_release(path: Path) -> SignedRelease:
    """Raises: EdgeAgentError (input.not_found, release.invalid)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise EdgeAgentError(
            f"release {path} does not exist", "check the path", "input.not_found"
        ) from None
    return parse_signed_release(data)


def release_for_file(
    path: Path,
    *,
    name: str | None,
    version: int,
    key: Ed25519PrivateKey | None,
    manifest_path: Path | None = None,
    precision: Precision | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    lifetime: timedelta = DEFAULT_LIFETIME,
    url_base: str | None = None,
) -> SignedRelease:
    """A release of a model file and its manifest (beside it as `<stem>.toml`), signed with
    `key` (unsigned when None, for a box's own installs).

    An IR's `.xml` brings its `.bin`. The one builder for `edge-fleet publish-model` and
    `edge-agent models install FILE`. With `url_base`, each file names the URL of its copy
    on a mirror: `url_base`/<its path>.

    Raises:
        EdgeAgentError: input.not_found, config.invalid, release.invalid.
    """
    if not path.is_file():
        raise EdgeAgentError(
            f"model file {path} " + ("is a folder" if path.is_dir() else "does not exist"),
            "pass the model file itself (.onnx, .xml, .tflite, .pb), its manifest beside it",
            code="input.not_found",
        )
    sidecar = manifest_path or path.with_suffix(".toml")
    if not sidecar.is_file():
        raise EdgeAgentError(
            f"{path} has no manifest beside it ({sidecar.name})",
            "write one like models/*.toml, or pass --manifest",
            code="input.not_found",
        )
    manifest = load_manifest(sidecar)  # the catalog's reader: one way to read a manifest
    files = [path.name]
    if path.suffix.lower() == ".xml":
        files.append(path.with_suffix(".bin").name)
    release = build_release(
        name=name or manifest.name,
        version=version,
        folder=path.parent,
        files=files,
        model=path.name,
        manifest=manifest,
        precision=precision or weights_precision(manifest),
        chunk_size=chunk_size,
        lifetime=lifetime,
    )
    if url_base is not None:
        base = url_base.rstrip("/")
        release = Release.model_validate(
            {
                **release.model_dump(),
                "files": [
                    {**f.model_dump(), "url": f"{base}/{quote(f.path)}"} for f in release.files
                ],
            }
        )
    return sign(release, key) if key is not None else SignedRelease(release=release)
