"""Where a word sits in a value's JSON text: in a string value, or in a key.

``Redactor.redact_json`` gates its rules on the value's JSON text (orjson's
compact output), but the rules only ever look at string VALUES and a key only
matters when it names a credential. A rule word such as ``key`` in a key name
(``idempotency_key``) must neither keep a rule nor start the by-key walk. In
compact JSON a string is a key exactly when its closing quote is followed by
``:`` (a value string is followed by ``,``, ``]``, ``}`` or the end), and a
word made of letters only occurs inside strings (outside them are numbers,
``true``, ``false``, ``null`` and punctuation), so the closing quote after an
occurrence tells which kind of string holds it.
"""

from __future__ import annotations

# Outside its strings a JSON text has no letters but these words' (and an exponent's "e"):
# a gate word that is none of their substrings occurs in the text only inside strings.
_LITERALS = "true false null"


def placeable(word: str) -> bool:
    """Whether an occurrence of ``word`` in a JSON text is surely inside a string."""
    return word.isascii() and word.isalpha() and word not in _LITERALS and word != "e"


def _closing_quote(text: str, pos: int) -> int:
    """The first unescaped ``"`` at or after ``pos`` (a string's closing quote, from inside it)."""
    quote = text.find('"', pos)
    while quote > 0:
        backslashes = 0
        while text[quote - 1 - backslashes] == "\\":
            backslashes += 1
        if not backslashes % 2:
            return quote
        quote = text.find('"', quote + 1)
    return quote


def _opening_quote(text: str, pos: int) -> int:
    """The last unescaped ``"`` before ``pos`` (a string's opening quote, from inside it)."""
    quote = text.rfind('"', 0, pos)
    while quote > 0:
        backslashes = 0
        while text[quote - 1 - backslashes] == "\\":
            backslashes += 1
        if not backslashes % 2:
            return quote
        quote = text.rfind('"', 0, quote)
    return quote


def word_places(text: str, word: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The string values and the keys of JSON ``text`` that hold ``word``.

    ``word`` must be :func:`placeable`. Each is the span of a string's text
    between its quotes, ``text[start:end]``. The search skips to the end of each
    string it finds ``word`` in: a text is scanned about once. A key's span
    starts after the last quote before ``word``: an escaped one when the key
    holds a quote, but a key naming a credential holds none (nor any other
    character JSON escapes), so its span is exactly its text.
    """
    values: list[tuple[int, int]] = []
    keys: list[tuple[int, int]] = []
    at = text.find(word)
    while at >= 0:
        quote = _closing_quote(text, at + len(word))
        if quote < 0:  # not JSON text as orjson writes it: a value of it all, the safe side
            return [(0, len(text))], keys
        if text[quote + 1 : quote + 2] == ":":
            keys.append((text.rfind('"', 0, at) + 1, quote))
        else:
            values.append((_opening_quote(text, at) + 1, quote))
        at = text.find(word, quote + 1)
    return values, keys
