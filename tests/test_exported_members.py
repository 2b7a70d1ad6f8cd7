"""``memory.__all__`` is the public surface: it names every public error and record, and exists.

The expected names are computed from the packages (every subclass of the error
roots, every public pydantic record of the tiers), so a new error or record
that is not exported fails here instead of drifting out of the surface.
"""

from __future__ import annotations

from types import ModuleType

from pydantic import BaseModel

import memory
import memory.apikeys
import memory.errors
import summarizer.errors
import tiers.errors
import tiers.models
import tiers.session
import tiers.task
import tiers.user

ERROR_ROOTS: tuple[type[Exception], ...] = (
    tiers.errors.TierError,
    summarizer.errors.SummarizerError,
    memory.errors.MemoryLayerError,
)
RECORD_FACES: tuple[ModuleType, ...] = (tiers.task, tiers.session, tiers.user)


def subclasses(root: type[Exception]) -> set[type[Exception]]:
    """``root`` and every class derived from it, at any depth."""
    found = {root}
    for child in root.__subclasses__():
        found |= subclasses(child)
    return found


def public_errors() -> set[str]:
    return {
        cls.__name__
        for root in ERROR_ROOTS
        for cls in subclasses(root)
        if not cls.__name__.startswith("_")
    }


def is_record(obj: object) -> bool:
    # Record is the base every stored record derives from, not a record an app receives.
    return isinstance(obj, type) and issubclass(obj, BaseModel) and obj is not tiers.models.Record


def public_records() -> set[str]:
    in_models = {
        name
        for name, obj in vars(tiers.models).items()
        if not name.startswith("_") and is_record(obj) and obj.__module__ == tiers.models.__name__
    }
    in_faces = {
        name for face in RECORD_FACES for name in face.__all__ if is_record(getattr(face, name))
    }
    return in_models | in_faces


ERROR_MODULES: tuple[tuple[ModuleType, type[Exception]], ...] = (
    (tiers.errors, tiers.errors.TierError),
    (summarizer.errors, summarizer.errors.SummarizerError),
    (memory.errors, memory.errors.MemoryLayerError),
    (memory.apikeys, memory.errors.MemoryLayerError),
)


def test_one_error_root_per_package() -> None:
    for module, root in ERROR_MODULES:
        defined = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Exception)
            and obj.__module__ == module.__name__
        ]
        assert defined, root
        assert all(issubclass(cls, root) for cls in defined), (root, defined)


def test_every_public_error_is_exported() -> None:
    missing = public_errors() - set(memory.__all__)
    assert missing == set()


def test_every_public_record_is_exported() -> None:
    missing = public_records() - set(memory.__all__)
    assert missing == set()


def test_the_introspection_sees_what_it_should() -> None:
    # Guards the two helpers against silently finding nothing.
    assert {"TierError", "EffectNotFoundError", "SummarizerTimeoutError", "ScopeError"} <= (
        public_errors()
    )
    assert {"ApiKeyError", "InvalidSummarizerConfigError"} <= public_errors()
    assert {"EffectRecord", "Event", "SessionSummary", "Checkpoint"} <= public_records()


def test_everything_exported_exists() -> None:
    assert len(memory.__all__) == len(set(memory.__all__))
    for name in memory.__all__:
        assert hasattr(memory, name), name


def test_exported_errors_are_the_packages_own_classes() -> None:
    for name in public_errors() & set(memory.__all__):
        exported = getattr(memory, name)
        assert isinstance(exported, type), name
        assert issubclass(exported, ERROR_ROOTS), name
