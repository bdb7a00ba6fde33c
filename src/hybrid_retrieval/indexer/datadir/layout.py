"""A data directory of named collections and the aliases that point at them.

    DIR/collections/<name>/   one index folder per collection (indexer.store's layout, its write-ahead log inside)
    DIR/aliases.json          {"alias": "collection", ...}, replaced atomically
    DIR/tasks/<id>.json       bulk loads' progress (engine.tasks)

A collection is created by publishing a complete (possibly empty) index folder under its name, and dropped by
renaming it out of the way before removing it, so a crash leaves it whole or gone, never half. Names and aliases
share one namespace and one rule (`NAME_RULE`). One process serves a data directory at a time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from hybrid_retrieval.common.errors import ConfigError, Conflict, HybridError, NotFound, SpecError
from hybrid_retrieval.common.names import NAME_RULE, check_name
from hybrid_retrieval.common.publish import Replacement, in_use, publish_dir, replacing_dir, sweep_temporary, write_atomic
from hybrid_retrieval.indexer.build import build_into
from hybrid_retrieval.indexer.chunking import SPECIAL_TOKENS
from hybrid_retrieval.indexer.datadir.settings import CollectionSettings
from hybrid_retrieval.indexer.manifest import MANIFEST, Manifest, write_manifest
from hybrid_retrieval.indexer.store import MODEL_DIR
from hybrid_retrieval.models.embedder import no_model_spec
from hybrid_retrieval.models.onnx_export import CONFIG_FILE
from hybrid_retrieval.models.profiles import export_profile
from hybrid_retrieval.models.registry import resolve_model

logger = logging.getLogger(__name__)

COLLECTIONS = "collections"
ALIASES = "aliases.json"
FOREIGN_MODELS = "foreign-models.json"  # collections whose model came in a snapshot: never lent to another collection
TASKS = "tasks"
DROPPED = ".dropped-"  # prefix of a collection folder being removed


_RETIRED = re.compile(r"\.(?P<name>.+)\.retired-[^.]+")  # where common.publish's swap puts the folder it replaces


class DataDir:
    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.collections = self.root / COLLECTIONS
        self.tasks = self.root / TASKS
        for folder in (self.collections, self.tasks):
            folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one create, drop or alias change at a time
        self._aliases = self._read_aliases()
        self._foreign = self._read_foreign()
        for folder in (self.root, self.tasks):  # an aliases or task file's atomic write a crash interrupted
            sweep_temporary(folder)
        for leftover in self.collections.glob(".*"):  # drops, creations and builds a crash interrupted
            if leftover.is_dir() and not in_use(leftover) and not self._only_copy(leftover):
                shutil.rmtree(leftover, ignore_errors=True)

    def _only_copy(self, leftover: Path) -> bool:
        """Whether `leftover` is the previous folder of a collection whose folder is missing: a crash between the two
        renames of a swap without renameat2 (common.publish) leaves it there, holding every acknowledged write. It
        is put back in place."""
        found = _RETIRED.fullmatch(leftover.name)
        if found is None or self.path(found["name"]).exists() or not (leftover / MANIFEST).is_file():
            return False
        os.rename(leftover, self.path(found["name"]))
        logger.warning("collection %s was missing after a crash: its previous folder %s serves again", found["name"], leftover)
        return True

    def path(self, name: str) -> Path:
        return self.collections / name

    def names(self) -> list[str]:
        """The collections on disk (complete index folders), sorted."""
        return sorted(p.name for p in self.collections.iterdir() if NAME_RULE.fullmatch(p.name) and (p / MANIFEST).is_file())

    def exists(self, name: str) -> bool:
        # no other name can be one (and a name the filesystem refuses, e.g. too long, must not reach it)
        return bool(NAME_RULE.fullmatch(name)) and (self.path(name) / MANIFEST).is_file()

    # --- collections --------------------------------------------------------------------------------------------

    def create(self, name: str, settings: CollectionSettings, models: Iterable[Path] = ()) -> Manifest:
        """An empty collection `name` built with `settings`, published atomically; Conflict when the name is taken.
        `models`: more ONNX export folders the model may be taken from (those of indexes served from elsewhere)."""
        check_name(name)
        with self._lock:
            self._check_free(name)
            if settings.dimension is not None:  # no model: documents and searches bring their vectors
                onnx_folder, spec = None, no_model_spec(settings.dimension)
            else:
                onnx_folder = self._model_folder(settings.model, settings.profile, models)
                spec = json.loads((onnx_folder / CONFIG_FILE).read_text())
            try:
                settings.vectors.check_dimension(spec["dimension"])
            except ConfigError as exc:
                raise SpecError("settings.vectors.pq_m", str(exc)) from None
            window = int(spec["max_seq_length"]) - SPECIAL_TOKENS
            if settings.chunking.enabled and settings.chunking.size > window:
                raise SpecError("settings.chunking.size", f"{settings.chunking.size} exceeds what the model reads ({window} word pieces)")
            with tempfile.TemporaryDirectory(prefix=".create-", dir=self.collections) as scratch:  # a crash's: swept at start
                corpus = Path(scratch) / "corpus.jsonl"
                corpus.touch()
                with publish_dir(self.path(name), replace=False) as tmp:
                    manifest = build_into(tmp, corpus, settings.build_options(), onnx_folder, spec, collection=True)
                    manifest.defaults = settings.defaults
                    write_manifest(tmp, manifest)
        logger.info("created collection %s (%s)", name, settings.model)
        return manifest

    @contextlib.contextmanager
    def replacing(self, name: str, replace: bool) -> Iterator[Replacement]:
        """A new folder for collection `name` (common.publish.Replacement): fill it, check it, publish it (in place of
        the collection of that name only with `replace`: else Conflict). If the block raises, the data directory is
        as it was; the replaced folder is kept until the block ends, so a new one that fails to serve can go back."""
        check_name(name)
        with self._lock:
            if name in self._aliases:
                raise Conflict(f"{name!r} is an alias (of {self._aliases[name]!r}): collections and aliases share names")
            if self.exists(name) and not replace:
                raise Conflict(f"a collection named {name!r} exists: replace it explicitly, or use a new name")
            with replacing_dir(self.path(name)) as replacement:
                yield replacement

    def _check_free(self, name: str) -> None:
        if self.exists(name):
            raise Conflict(f"a collection named {name!r} exists")
        if name in self._aliases:
            raise Conflict(f"{name!r} is an alias (of {self._aliases[name]!r}): collections and aliases share names")

    def _model_folder(self, model: str, profile: str, models: Iterable[Path]) -> Path:
        """The ONNX export of `model` in `profile`: the copy of a collection (or of one of `models`) built with it (no
        export, no torch), an export folder given by path, or the export cache (exported, or distilled for the fast
        profile, on first use, which needs torch)."""
        lenders = [name for name in self.names() if name not in self._foreign]  # a snapshot's model may be anything
        for folder in [*(self.path(name) / MODEL_DIR for name in lenders), *models]:
            try:
                config = json.loads((folder / CONFIG_FILE).read_text())
            except (OSError, ValueError):
                continue
            aligned = "alignment" in (config.get("recipe") or {})  # a fast table fitted on that collection's corpus
            if (config.get("model"), config.get("profile", "full")) == (model, profile) and not aligned:
                return folder
        given = Path(model).expanduser()
        if (given / CONFIG_FILE).is_file():
            made_as = json.loads((given / CONFIG_FILE).read_text()).get("profile", "full")
            if made_as != profile:
                raise SpecError("settings.embedder.profile", f"the export folder {model} is of the {made_as} profile, not {profile}")
            return given
        try:
            resolved = resolve_model(model)
        except Exception as exc:  # not found offline, not a model: the user's to fix
            raise SpecError("settings.embedder.model", str(exc)) from None
        field = "settings.embedder.model" if profile == "full" else "settings.embedder.profile"  # what failed to make
        try:
            return export_profile(resolved, profile)
        except ImportError as exc:
            raise SpecError(field, f"making the {profile} model of {model!r} needs torch, which is not installed ({exc})") from None
        except Exception as exc:  # not a model ONNX or model2vec can read, or the profiles extra missing
            raise SpecError(field, str(exc)) from None

    def drop(self, name: str) -> None:
        """Remove collection `name`; Conflict when an alias points to it (drop or repoint the alias first)."""
        with self._lock:
            self.check_droppable(name)
            doomed = self.collections / f"{DROPPED}{name}-{uuid.uuid4().hex[:12]}"
            self.path(name).rename(doomed)  # gone from the name at once; a crash while removing leaves only this
            shutil.rmtree(doomed, ignore_errors=True)
            self._set_foreign(name, False)
        logger.info("dropped collection %s", name)

    def has_foreign_model(self, name: str) -> bool:
        return name in self._foreign

    def set_model_origin(self, name: str, foreign: bool) -> None:
        """Record whether collection `name`'s model files came in a snapshot (`foreign`: their content is whatever its
        maker put there, so no other collection is ever made with them) or from this side."""
        with self._lock:
            self._set_foreign(name, foreign)

    def _set_foreign(self, name: str, foreign: bool) -> None:
        if (name in self._foreign) != foreign:
            self._foreign = self._foreign | {name} if foreign else self._foreign - {name}
            write_atomic(self.root / FOREIGN_MODELS, json.dumps(sorted(self._foreign)))

    def _read_foreign(self) -> frozenset[str]:
        path = self.root / FOREIGN_MODELS
        try:
            names = json.loads(path.read_text()) if path.is_file() else []
        except ValueError as exc:
            raise HybridError(f"{path} is not valid JSON ({exc}): fix or remove it") from None
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise HybridError(f"{path} must list collection names")
        return frozenset(names)

    def check_droppable(self, name: str) -> None:
        """NotFound when there is no such collection, Conflict while an alias points to it."""
        if not self.exists(name):
            raise NotFound(f"no collection named {name!r}")
        pointing = sorted(alias for alias, target in self._aliases.items() if target == name)
        if pointing:
            raise Conflict(f"aliases {', '.join(pointing)} point to {name!r}: repoint or delete them first")

    # --- aliases ------------------------------------------------------------------------------------------------

    @property
    def aliases(self) -> dict[str, str]:
        """alias -> collection, read on every request: replaced whole on a change, never changed in place (so do not
        change it either)."""
        return self._aliases

    def set_alias(self, alias: str, collection: str) -> None:
        """Point `alias` at `collection` (created, or repointed in one atomic file replace)."""
        check_name(alias, "alias")
        with self._lock:
            if self.exists(alias):
                raise Conflict(f"{alias!r} is a collection: collections and aliases share names")
            if not self.exists(collection):
                raise NotFound(f"no collection named {collection!r}")
            self._write_aliases({**self._aliases, alias: collection})

    def drop_alias(self, alias: str) -> None:
        with self._lock:
            if alias not in self._aliases:
                raise NotFound(f"no alias named {alias!r}")
            self._write_aliases({a: c for a, c in self._aliases.items() if a != alias})

    def _read_aliases(self) -> dict[str, str]:
        path = self.root / ALIASES
        if not path.is_file():
            return {}
        try:
            aliases = json.loads(path.read_text())
        except ValueError as exc:
            raise HybridError(f"{path} is not valid JSON ({exc}): fix or remove it") from None
        if not isinstance(aliases, dict) or not all(isinstance(a, str) and isinstance(c, str) for a, c in aliases.items()):
            raise HybridError(f"{path} must map alias names to collection names")
        return aliases

    def _write_aliases(self, aliases: dict[str, str]) -> None:
        write_atomic(self.root / ALIASES, json.dumps(dict(sorted(aliases.items())), indent=2))
        self._aliases = aliases
