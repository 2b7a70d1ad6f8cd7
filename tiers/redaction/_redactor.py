"""The redactor: finds what the rules match in text and JSON and replaces it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, cast

from tiers.errors import InvalidInputError
from tiers.redaction._base import (
    _KIND,
    DEFAULT_PLACEHOLDER,
    MODES,
    Finding,
    J,
    RedactMode,
    _group,
    _Rule,
)
from tiers.redaction._rules import _DIGIT_RUN, _PII_RULES, _SECRET_RULES
from tiers.redaction._values import (
    _AUTH_SCHEME,
    _CLASS_KIND,
    _accept,
    _key_class,
    _machine_made,
    _plain_value,
)


def check_patterns(patterns: Mapping[str, str | re.Pattern[str]]) -> dict[str, re.Pattern[str]]:
    """Compile custom patterns (kind -> regex).

    Raises:
        InvalidInputError: A kind is not ``[a-z][a-z0-9_]{0,31}``, or a pattern
            does not compile or matches the empty string (``field`` is
            ``redact_patterns.<kind>``).
    """
    if not isinstance(patterns, Mapping):
        raise InvalidInputError(
            f"redaction patterns must be a mapping of kind to regex, got {type(patterns).__name__}",
            field="redact_patterns",
        )
    compiled: dict[str, re.Pattern[str]] = {}
    for kind, pattern in patterns.items():
        field = f"redact_patterns.{kind}"
        if not isinstance(kind, str) or _KIND.fullmatch(kind) is None:
            raise InvalidInputError(
                f"redaction kind {kind!r} is invalid: use a lowercase letter then up to 31 of "
                "a-z 0-9 _ (it names the placeholder, e.g. [REDACTED:employee_id])",
                field=field,
            )
        if isinstance(pattern, re.Pattern):
            regex = pattern
        elif isinstance(pattern, str):
            try:
                regex = re.compile(pattern)
            except re.error as exc:
                raise InvalidInputError(
                    f"redaction pattern of {kind!r} does not compile: {exc}", field=field
                ) from exc
        else:
            raise InvalidInputError(
                f"redaction pattern of {kind!r} must be a regex string, got {type(pattern).__name__}",
                field=field,
            )
        if regex.fullmatch("") is not None:
            raise InvalidInputError(
                f"redaction pattern of {kind!r} matches the empty string", field=field
            )
        compiled[kind] = regex
    return compiled


def _anchored(rule: _Rule, text: str, lowered: str) -> Iterator[re.Match[str] | None]:
    """Matches of ``rule.pattern`` where its finder finds its word (one per word, no overlaps)."""
    assert rule.finder is not None
    assert rule.finder_i is not None
    # Lowercasing keeps positions unless the text has one of the few characters whose
    # lowercase is longer (e.g. "İ"); then search the text itself, case-insensitively.
    hits = (
        rule.finder.finditer(lowered) if len(lowered) == len(text) else rule.finder_i.finditer(text)
    )
    end = 0
    for hit in hits:
        if hit.start() < end:
            continue
        m = rule.pattern.match(text, hit.start())
        if m is not None:
            end = m.end()
        yield m


class Redactor:
    """Finds secrets (and optionally PII) in text and JSON and replaces them with placeholders.

    Immutable and thread-safe; build one per configuration and share it.

    Args:
        mode: ``"secrets"`` (default), ``"secrets+pii"`` or ``"off"``.
        patterns: Custom kinds, kind -> regex (string or compiled); applied in
            every mode but ``"off"``. A group named ``secret`` is what is replaced
            (else the whole match).
        placeholder: What a finding becomes; ``{kind}`` is replaced by its kind.

    Raises:
        InvalidInputError: A bad mode (``field="redact"``), pattern or placeholder.
    """

    def __init__(
        self,
        mode: RedactMode = "secrets",
        *,
        patterns: Mapping[str, str | re.Pattern[str]] | None = None,
        placeholder: str = DEFAULT_PLACEHOLDER,
    ) -> None:
        if mode not in MODES:
            raise InvalidInputError(
                f"redact must be one of {', '.join(MODES)}, got {mode!r}", field="redact"
            )
        if not isinstance(placeholder, str) or not placeholder:
            raise InvalidInputError(
                "redaction placeholder must be a non-empty string such as '[REDACTED:{kind}]'",
                field="redact_placeholder",
            )
        self.mode: RedactMode = mode
        self.placeholder = placeholder
        self._custom = check_patterns(patterns or {})
        rules: list[_Rule] = []
        if mode != "off":
            rules.extend(_SECRET_RULES)
            if mode == "secrets+pii":
                rules.extend(_PII_RULES)
            for kind, regex in self._custom.items():
                group: int | str = "secret" if "secret" in regex.groupindex else 0
                rules.append(_Rule(f"custom:{kind}", regex, _group(kind, group)))
        self._rules: tuple[_Rule, ...] = tuple(rules)
        self._order = {rule.name: n for n, rule in enumerate(self._rules)}
        # Every gate at once: text that passes none (most text) costs a few substring tests.
        self._any_rule_ungated = any(not (r.triggers or r.words or r.digits) for r in self._rules)
        self._triggers = tuple(sorted({t for r in self._rules for t in r.triggers}))
        self._words = tuple(sorted({w for r in self._rules for w in r.words}))
        self._any_digits = any(r.digits for r in self._rules)

        # Redacting twice changes nothing: a value already replaced is never a finding.
        self._prefix = placeholder.split("{kind}", 1)[0]

    @property
    def enabled(self) -> bool:
        """Whether this redactor changes anything (``mode`` is not ``"off"``)."""
        return bool(self._rules)

    @property
    def patterns(self) -> dict[str, re.Pattern[str]]:
        """The custom patterns, kind -> compiled regex."""
        return dict(self._custom)

    def with_patterns(self, patterns: Mapping[str, str | re.Pattern[str]]) -> Redactor:
        """A redactor like this one with more custom kinds (same kind: the new pattern wins)."""
        return Redactor(
            self.mode, patterns={**self._custom, **patterns}, placeholder=self.placeholder
        )

    def render(self, kind: str) -> str:
        """The placeholder of ``kind``."""
        return self.placeholder.replace("{kind}", kind)

    def findings(self, text: str) -> list[Finding]:
        """What :meth:`redact` replaces in ``text``, in order, without overlaps."""
        if not self._rules or len(text) < 6:
            return []
        found: list[tuple[int, int, int, str, str]] = []
        lowered: str | None = None
        digits: bool | None = None
        if not self._any_rule_ungated:
            lowered = text.lower()
            if not (
                any(map(text.__contains__, self._triggers))
                or any(map(lowered.__contains__, self._words))
                or (self._any_digits and (digits := _DIGIT_RUN.search(text) is not None))
            ):
                return []
        for rule in self._rules:
            # Cheap gates first (substring tests run in C); most text passes no rule's.
            if rule.triggers and not any(map(text.__contains__, rule.triggers)):
                continue
            if rule.words:
                if lowered is None:
                    lowered = text.lower()
                if not any(map(lowered.__contains__, rule.words)):
                    continue
            if rule.digits:
                if digits is None:
                    digits = _DIGIT_RUN.search(text) is not None
                if not digits:
                    continue
            if rule.finder is None:
                matches: Iterable[re.Match[str] | None] = rule.pattern.finditer(text)
            else:
                if lowered is None:
                    lowered = text.lower()
                matches = _anchored(rule, text, lowered)
            for m in matches:
                if m is None:
                    continue
                hit = rule.classify(m)
                if hit is None:
                    continue
                kind, start, end = hit
                if self._prefix and text.startswith(self._prefix, start):
                    continue
                found.append((start, self._order[rule.name], -end, kind, rule.name))
        if not found:
            return []
        found.sort()
        result: list[Finding] = []
        pos = 0
        for start, _, neg_end, kind, name in found:
            end = -neg_end
            if end <= pos:
                continue  # inside one already taken
            if start < pos:
                # Overlaps the previous finding and reaches past it: hide the rest too.
                prev = result[-1]
                result[-1] = Finding(prev.kind, prev.rule, prev.start, end)
            else:
                result.append(Finding(kind, name, start, end))
            pos = end
        return result

    def redact(self, text: str) -> str:
        """``text`` with every finding replaced by its placeholder."""
        found = self.findings(text)
        if not found:
            return text
        parts: list[str] = []
        pos = 0
        for f in found:
            parts.append(text[pos : f.start])
            parts.append(self.render(f.kind))
            pos = f.end
        parts.append(text[pos:])
        return "".join(parts)

    def redact_json(self, value: J, *, key: str | None = None) -> J:
        """A JSON value with every string redacted; the same object when nothing changed.

        A string under a key naming a credential (``password``, ``api_key``,
        ``clientSecret``, ``Authorization``...) is replaced whole when it looks
        like one; ``key`` is the label of ``value`` itself (a fact's key).
        """
        if not self._rules:
            return value
        return cast(J, self._walk(value, key))

    def _walk(self, value: object, key: str | None) -> object:
        if isinstance(value, str):
            if key is not None:
                whole = self._by_key(key, value)
                if whole is not None:
                    return whole
            return self.redact(value)
        if isinstance(value, dict):
            changed: dict[object, object] | None = None
            for k, v in value.items():
                new = self._walk(v, k)
                if new is not v:
                    if changed is None:
                        changed = dict(value)
                    changed[k] = new
            return value if changed is None else changed
        if isinstance(value, list):
            out: list[object] | None = None
            for n, v in enumerate(value):
                new = self._walk(v, key)
                if new is not v:
                    if out is None:
                        out = list(value)
                    out[n] = new
            return value if out is None else out
        return value

    def _by_key(self, key: str, value: str) -> str | None:
        label = _key_class(key)
        if label is None or not value or (self._prefix and value.startswith(self._prefix)):
            return None
        if label == "auth":
            scheme = _AUTH_SCHEME.match(value)
            rest = value[scheme.end() :] if scheme else value
            if _plain_value(rest) and _machine_made(rest, 8):
                return f"{value[: len(value) - len(rest)]}{self.render('token')}"
            return None
        if not _accept(
            label.removeprefix("q_"),
            label.startswith("q_") or label == "password",
            value,
            prose=False,
            quoted=True,
            last=True,
        ):
            return None
        return self.render(_CLASS_KIND[label])

    def __repr__(self) -> str:
        custom = f", patterns={sorted(self._custom)}" if self._custom else ""
        return f"Redactor({self.mode!r}{custom})"


OFF: Final = Redactor("off")
"""A redactor that changes nothing (what the tiers use when given none)."""
