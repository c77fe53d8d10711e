"""Find a model by name or path, and make sure its bytes are verified before use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edge_agent.catalog.fetch import fetch, is_fetched, model_path
from edge_agent.catalog.manifest import Manifest, load_manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.reference import reference_dir

_FORMATS = {".onnx": "onnx", ".xml": "ir", ".tflite": "tflite", ".pb": "tf"}


def default_models_dir() -> Path:
    """The reference manifests: shipped in the wheel, or `models/` of a source checkout."""
    return reference_dir("models")


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A manifest and the verified file it describes."""

    manifest: Manifest
    path: Path


class InstalledModels(Protocol):
    """The model store as the catalog sees it (edge_agent.store.ModelStore implements it).

    A protocol rather than an import: the store builds on the catalog, not the reverse.
    """

    def current(self, name: str) -> ResolvedModel | None:
        """The serving version of `name`, verified for loading, or None when there is none."""
        ...

    def current_manifest(self, name: str) -> Manifest | None:
        """The serving version's manifest, without reading its model files."""
        ...


class Catalog:
    """Installed models first (the store), then reference manifests with fetched files."""

    def __init__(
        self,
        models_dir: Path,
        cache: Path,
        store: InstalledModels | None = None,
        *,
        allow_paths: bool = True,
    ) -> None:
        """`allow_paths` False refuses model files named by path (the agent: a command may
        name only what its store verified or a pinned reference model, never bytes that
        happen to be on the box's disk)."""
        self.models_dir = models_dir
        self.cache = cache
        self.store = store
        self.allow_paths = allow_paths

    def check_name(self, name_or_path: str) -> None:
        """Refuse, before anything is compiled, a model named by path where paths are not
        allowed (see `allow_paths`).

        Raises:
            EdgeAgentError: store.path.
        """
        if not self.allow_paths and looks_like_path(name_or_path):
            raise EdgeAgentError(
                f"model {name_or_path!r} is a path; the agent runs only models its store "
                "verified and the reference models",
                "deploy the model with `edge-fleet publish-model` and `deploy_model`, then "
                "name it by its store name",
                code="store.path",
            )

    def manifest_of(self, name: str) -> Manifest:
        """The manifest `name` resolves to (the store's current version first, then the
        reference set), without fetching a file.

        Raises:
            EdgeAgentError: model.not_found, or what the store says of a damaged entry.
        """
        installed = self.store.current_manifest(name) if self.store is not None else None
        return installed if installed is not None else self.manifest(name)

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.models_dir.glob("*.toml"))

    def manifest(self, name: str) -> Manifest:
        path = self.models_dir / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(self.names()) or "none"
            elsewhere = (
                "; or pass a path to a model file"
                if self.allow_paths
                else (", or a model deployed to this box's store (deploy_model)")
            )
            raise EdgeAgentError(
                f"unknown model {name!r}", f"use one of: {known}{elsewhere}", code="model.not_found"
            )
        return load_manifest(path)

    def is_fetched(self, name: str) -> bool:
        return is_fetched(self.manifest(name), self.cache)

    def local_path(self, name: str) -> Path:
        return model_path(self.manifest(name), self.cache)

    def fetch(self, name: str) -> Path:
        return fetch(self.manifest(name), self.cache)

    def resolve(self, name_or_path: str) -> ResolvedModel:
        """A model by name, or a model file with its manifest.

        A name is the store's current version of it first, then a reference model
        (fetched if needed). A file needs a manifest beside it (`model.onnx` +
        `model.toml`): the runtime must know how to feed it and how to read its outputs.
        """
        candidate = Path(name_or_path)
        if not looks_like_path(name_or_path):
            installed = self.store.current(name_or_path) if self.store is not None else None
            if installed is not None:
                return installed
            manifest = self.manifest(name_or_path)
            return ResolvedModel(manifest, fetch(manifest, self.cache))
        self.check_name(name_or_path)
        if candidate.is_dir():
            raise EdgeAgentError(
                f"model path {candidate} is a folder, not a model file",
                "pass the model file in it (.onnx, .xml, .tflite or .pb, with its .toml beside)",
                code="input.invalid",
            )
        if not candidate.is_file():
            raise EdgeAgentError(
                f"model file {candidate} does not exist", "check the path", code="model.not_found"
            )
        sidecar = candidate.with_suffix(".toml")
        if sidecar.is_file():
            return ResolvedModel(load_manifest(sidecar), candidate)
        fmt = _FORMATS.get(candidate.suffix.lower())
        if fmt is None:
            raise EdgeAgentError(
                f"unknown model format {candidate.suffix!r}",
                "use an .onnx, .xml (OpenVINO IR), .tflite or .pb (TF frozen graph) file",
                code="model.incompatible",
            )
        raise EdgeAgentError(
            f"{candidate} has no manifest beside it ({sidecar.name})",
            "write one like models/*.toml, naming its input and head, to run it",
            code="model.incompatible",
        )


def looks_like_path(name_or_path: str) -> bool:
    """Whether a `--model` value names a file (a known suffix, or a folder in it), not a model."""
    return Path(name_or_path).suffix.lower() in _FORMATS or "/" in name_or_path
