"""The read-only system context of a run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import NoReturn, Self

from memory.errors import InvalidScopeInputError, ReadOnlyScopeError
from memory.scope._base import SECTION_SEPARATOR
from memory.scope._violations import ScopeViolations, report


def _render_system(sections: Mapping[str, str]) -> str:
    # The untitled section "" (a plain-string system context) renders without a title.
    return SECTION_SEPARATOR.join(
        body if not name else f"[{name}]\n{body}" for name, body in sections.items()
    )


class SystemContext(Mapping[str, str]):
    """Read-only system context of a run: named sections of text, fixed at construction.

    A plain string becomes one untitled section under the key ``""``; a
    mapping keeps its sections in order, each rendered as ``[name]`` followed
    by its text. Every mutation attempt — item assignment, ``del``, attribute
    assignment, ``update``/``pop``/``popitem``/``clear``/``setdefault``,
    ``|=`` — raises :class:`~memory.errors.ReadOnlyScopeError` and changes
    nothing. Copying returns the same object.

    Args:
        source: The system text, a mapping of section name to text, or
            another :class:`SystemContext`.

    Raises:
        InvalidScopeInputError: ``source`` is not text or a mapping of str to
            str, or a section name holds a newline or control character.
    """

    __slots__ = ("_sections", "_text", "_violations")

    _sections: Mapping[str, str]
    _text: str
    # Set only on a ScopeManager's own copy (reporting_to): where its refusals are counted.
    _violations: ScopeViolations | None

    def __init__(self, source: Mapping[str, str] | str) -> None:
        if isinstance(source, SystemContext):
            sections = dict(source._sections)
        elif isinstance(source, str):
            sections = {"": source}
        elif isinstance(source, Mapping):
            sections = {}
            for name, body in source.items():
                if not isinstance(name, str) or not isinstance(body, str):
                    raise InvalidScopeInputError(
                        "system context sections must map str names to str text, got "
                        f"{type(name).__name__} -> {type(body).__name__}",
                        field="system",
                    )
                if name and not name.isprintable():
                    raise InvalidScopeInputError(
                        f"system section name {name[:80]!r} holds a newline or control "
                        "character; use a one-line name",
                        field="system",
                    )
                sections[name] = body
        else:
            raise InvalidScopeInputError(
                "system context must be text or a mapping of section name to text, got "
                f"{type(source).__name__}",
                field="system",
            )
        # object.__setattr__ because our own __setattr__ refuses every assignment.
        object.__setattr__(self, "_sections", MappingProxyType(sections))
        object.__setattr__(self, "_text", _render_system(sections))

    @property
    def sections(self) -> Mapping[str, str]:
        """An immutable view of the sections, in order (a ``MappingProxyType``)."""
        return self._sections

    @property
    def text(self) -> str:
        """The rendered system context, as it appears in the prompt."""
        return self._text

    def __getitem__(self, name: str) -> str:
        return self._sections[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sections)

    def __len__(self) -> int:
        return len(self._sections)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SystemContext):
            # Order matters: it changes the rendered text.
            return tuple(self._sections.items()) == tuple(other._sections.items())
        return super().__eq__(other)

    def __hash__(self) -> int:
        return hash(tuple(self._sections.items()))

    def __repr__(self) -> str:
        return f"SystemContext({dict(self._sections)!r})"

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Self:
        return self

    def __reduce__(self) -> tuple[type[SystemContext], tuple[dict[str, str]]]:
        return (SystemContext, (dict(self._sections),))

    def _refuse(self, what: str) -> NoReturn:
        error = ReadOnlyScopeError(
            f"the system context is read-only ({what} refused); start a new ScopeManager "
            "with the system context you need, or keep changing state in working memory"
        )
        report(getattr(self, "_violations", None), error)
        raise error

    def __setitem__(self, name: str, value: str) -> NoReturn:
        self._refuse(f"setting section {name!r}")

    def __delitem__(self, name: str) -> NoReturn:
        self._refuse(f"deleting section {name!r}")

    def __setattr__(self, name: str, value: object) -> NoReturn:
        self._refuse(f"setting attribute {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        self._refuse(f"deleting attribute {name!r}")

    def __ior__(self, other: object) -> NoReturn:
        self._refuse("|=")

    def update(self, *args: object, **kwargs: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("update()")

    def pop(self, *args: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("pop()")

    def popitem(self) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("popitem()")

    def clear(self) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("clear()")

    def setdefault(self, *args: object) -> NoReturn:
        """Refused: the system context is read-only.

        Raises:
            ReadOnlyScopeError: Always.
        """
        self._refuse("setdefault()")


def reporting_to(context: SystemContext, violations: ScopeViolations) -> SystemContext:
    """A copy of ``context`` whose refused mutations are reported to ``violations``."""
    copy = SystemContext(context)
    # object.__setattr__ because SystemContext's own __setattr__ refuses every assignment.
    object.__setattr__(copy, "_violations", violations)
    return copy
