"""Value shapes: what tells a secret, a card number or a phone number from ordinary text."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Final

from tiers.cache_ages import SWEEPER, ClearedMemo

_DIGIT = re.compile(r"\d")
_ALPHA = re.compile(r"[A-Za-z]")
_WORDISHS = re.compile(r"[A-Za-z0-9+/=_.~-]+")
_STRONG_SYMBOL = re.compile(r"[!@#$%^&*+=?~|\\]")
_INNER_UPPER = re.compile(r"[a-z][A-Z]")
_MASK = re.compile(r"[*x•#._\-<>]+", re.IGNORECASE)
# What a value is not: a type, a null, a placeholder or a word describing the value.
_NOT_A_VALUE: Final = frozenset(
    {
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "str",
        "string",
        "int",
        "bool",
        "bytes",
        "any",
        "optional",
        "required",
        "hidden",
        "redacted",
        "masked",
        "empty",
        "blank",
        "unset",
        "unknown",
        "n/a",
        "na",
        "tbd",
        "todo",
        "example",
        "sample",
        "placeholder",
        "password",
        "passwd",
        "passphrase",
        "pass",
        "secret",
        "secrets",
        "token",
        "tokens",
        "key",
        "apikey",
        "api_key",
        "value",
        "values",
        "your_password",
        "your_api_key",
        "your_token",
        "your_secret",
        "yourpassword",
        "mypassword",
        "here",
        "same",
        "changed",
        "reset",
        "expired",
        "invalid",
        "incorrect",
        "wrong",
        "correct",
        "missing",
        "set",
    }
)


def _has_letter_and_digit(value: str) -> bool:
    return _DIGIT.search(value) is not None and _ALPHA.search(value) is not None


def _reference(value: str) -> bool:
    """A variable, template, call or path standing for the value, not the value itself."""
    return (
        value[0] in "$%<{/~"
        or value.startswith(("./", "os.", "process.", "env.", "ENV[", "settings.", "config."))
        or "{{" in value
        or "${" in value
        or "(" in value
        or "[REDACTED" in value
    )


def _plain_value(value: str) -> bool:
    """Common to every label: a real value, not a reference, a mask or a word for one."""
    stripped = value.strip()
    return (
        bool(stripped)
        and not _reference(stripped)
        and _MASK.fullmatch(stripped) is None
        and stripped.lower().strip(".") not in _NOT_A_VALUE
    )


def _machine_made(value: str, min_len: int) -> bool:
    """Looks generated: no spaces, ``min_len``+ token characters, letters and digits (or long mixed case)."""
    if len(value) < min_len or _WORDISHS.fullmatch(value) is None:
        return False
    if _has_letter_and_digit(value):
        return True
    return len(value) >= max(20, min_len) and value.lower() != value and value.upper() != value


def _password_like(value: str, *, prose: bool, quoted: bool, last_word: bool) -> bool:
    """A value after a password label.

    In prose ("my password is ...") it must look unlike a word: a digit, a strong
    symbol or inner capitals. After ``:``/``=`` a quoted value is taken as is; an
    unquoted word of letters only must end its clause ("password: sunshine", not
    "Password: enter a new one").
    """
    if " " in value.strip() and not quoted:
        return False
    if prose:
        return len(value) >= 4 and (
            _DIGIT.search(value) is not None
            or _STRONG_SYMBOL.search(value) is not None
            or _INNER_UPPER.search(value) is not None
        )
    if quoted:
        return True
    if value.isalpha():
        return last_word and len(value) >= 4
    return len(value) >= 3


def _accept(
    label: str, qualified: bool, value: str, *, prose: bool, quoted: bool, last: bool
) -> bool:
    """Whether ``value`` after a label of class ``label`` looks like a credential of that class."""
    if not _plain_value(value):
        return False
    if label == "password":
        return _password_like(value, prose=prose, quoted=quoted, last_word=last)
    if label == "pin":
        return value.isdigit() and 4 <= len(value) <= 8  # "LED_PIN = 13" is a pin number
    if label == "card_cvv":
        return value.isdigit() and 3 <= len(value) <= 4
    # api_key / secret / token: machine-made, and as long as real ones are (16+: an id such
    # as "api-key:0123456789ab" is not one). A bare "secret" or "token" is an everyday word
    # ("the secret is out"), so its value must look longer-lived still: 20+ characters.
    return _machine_made(value, 16 if qualified else 20)


# -- labelled values --------------------------------------------------------------------------------

_SEP = r"[ _.\-]?"
# Label words, found in the lowercased text first (cheap), then matched where they start.
_LABEL_FIND = re.compile(
    r"(?:pass(?:word|wd|phrase|code)|pwd|key|secret|token|pin|cv[vc]2?|csc|security)(?![a-z])"
)
_LABEL_FIND_I = re.compile(_LABEL_FIND.pattern, re.IGNORECASE)
_LABEL_AT = re.compile(
    rf"(?i:(?P<core>pass(?:word|wd|phrase|code)|pwd|apikey|key(?:{_SEP}id)?"
    rf"|secret(?:{_SEP}(?:access{_SEP})?key)?|token|pin(?:{_SEP}(?:code|number))?"
    rf"|cvv2?|cvc2?|csc|security{_SEP}code))(?![A-Za-z0-9])"
    r"(?:\\?[\"'])?"  # the closing quote of a JSON/dict key
    # "my password for the wifi is ...": a few words between label and verb
    r"(?:\s+(?i:for|of|on|at)(?:\s+[\w.@'\-]+){1,4}?)?"
    r"(?:\s*(?P<assign>:=|=>|->|:|=|\#)"
    r"|\s+(?P<prose>(?i:is|was|equals|will\s+be|should\s+be|set\s+to|to))(?:\s*:)?"
    r"|(?P<space>\s)(?=\d))"
    r"\s*(?:"
    r"\\?\"(?P<dq>[^\"\\\n]{1,256})\\?\""
    r"|'(?P<sq>[^'\n]{1,256})'"
    r"|`(?P<bq>[^`\n]{1,256})`"
    r"|(?P<v>[^\s\"'`<>,;]{0,255}[^\s\"'`<>,;.!?:)\]}])"
    r")"
)
# Words that make "key", "secret" and "token" name a credential when they come right before.
_QUALIFIED: Final = {
    "key": re.compile(
        rf"(?i:api|access|secret|private|signing|encryption|master|account|app|consumer|client"
        rf"|subscription|license){_SEP}$"
    ),
    "secret": re.compile(
        rf"(?i:client|app|api|consumer|shared|webhook|signing|jwt|session|aws|oauth|hmac){_SEP}$"
    ),
    "token": re.compile(
        rf"(?i:access|auth|refresh|id|session|bearer|api|personal{_SEP}access|bot|oauth|csrf"
        rf"|xsrf|github|gitlab|slack|npm|gh|hf|security|sas|_auth){_SEP}$"
    ),
}
_NORMALISE = str.maketrans("", "", " _.-")
# After an unquoted value, code goes on ("= Get-Secret $name", "= os.getenv 'X'"); prose does not.
_CODE_GOES_ON = re.compile(r"[ \t]+[$\"'({\[+|*/\\-]")
# A query string goes on after the value: "client_secret=...&grant_type=...".
_QUERY_REST = re.compile(r"&[A-Za-z_][\w.\-]*=")
_CLASS_KIND: Final = {
    "password": "password",
    "q_api_key": "api_key",
    "q_secret": "secret",
    "secret": "secret",
    "q_token": "token",
    "token": "token",
    "pin": "pin",
    "card_cvv": "card_cvv",
}


def _label_class(core: str, before: str) -> str | None:
    """The class of a label word, given the text right before it (its qualifier, if any)."""
    norm = core.lower().translate(_NORMALISE)
    if norm in ("password", "passwd", "passphrase", "passcode", "pwd"):
        return "password"
    bare = not before or not before[-1].isalnum() or (before[-1].islower() and core[0].isupper())
    if norm in ("apikey", "secretkey", "secretaccesskey"):
        return "q_api_key" if norm == "apikey" else "q_secret"
    base = "key" if norm.startswith("key") else norm
    qualifier = _QUALIFIED.get(base)
    if qualifier is not None and qualifier.search(before) is not None:
        return f"q_{'api_key' if base == 'key' else base}"
    if not bare:
        return None  # glued to a word: "mytoken", "spin", "monkey"
    if base in ("secret", "token"):
        return base
    if norm.startswith("pin"):
        return "pin"
    if norm in ("cvv", "cvv2", "cvc", "cvc2", "csc", "securitycode"):
        return "card_cvv"
    return None  # a bare "key"


def _labelled(m: re.Match[str]) -> tuple[str, int, int] | None:
    text = m.string
    core_start = m.start("core")
    label = _label_class(m.group("core"), text[max(0, core_start - 32) : core_start])
    if label is None:
        return None
    for group in ("dq", "sq", "bq", "v"):
        if m.group(group) is not None:
            break
    start, end = m.span(group)
    if group == "v":
        rest = _QUERY_REST.search(text, start, end)
        if rest is not None:
            end = rest.start()
    value = text[start:end]
    if label in ("pin", "card_cvv"):
        if m.group("prose") == "to":
            return None
    elif m.group("space") is not None or m.group("assign") == "#":
        return None  # "CVV 123", "PIN #4821": only a PIN or CVV follows a bare label
    after = text[end : end + 2]
    last = not (len(after) == 2 and after[0] == " " and after[1].isalnum())
    if group == "v" and m.group("assign") is not None and _CODE_GOES_ON.match(text, end):
        return None  # `$password = ConvertTo-SecureString $plain ...`: an expression, not a value
    if not _accept(
        label.removeprefix("q_"),
        label.startswith("q_") or label == "password",
        value,
        prose=m.group("prose") is not None,
        quoted=group != "v",
        last=last,
    ):
        return None
    return _CLASS_KIND[label], start, end


_KEY_LABEL = re.compile(
    rf"(?:[A-Za-z0-9]+[_.\-]|[a-z0-9]+(?=[A-Z]))*"
    rf"(?i:(?P<auth>(?:proxy[_\-]?)?authorization)|(?P<qualifier>[a-z]+{_SEP})??"
    rf"(?P<core>pass(?:word|wd|phrase|code)|pwd|apikey|key(?:{_SEP}id)?"
    rf"|secret(?:{_SEP}(?:access{_SEP})?key)?|token|pin(?:{_SEP}(?:code|number))?"
    rf"|cvv2?|cvc2?|csc|security{_SEP}code))",
    re.ASCII,
)
_AUTH_SCHEME = re.compile(r"(?i)(?:bearer|basic|token|digest|apikey)\s+")


# Every key _KEY_LABEL classifies holds one of these, lowercased: a JSON value whose text
# holds none has no key naming a credential (see Redactor._narrow).
_KEY_WORDS: Final = (
    "authorization", "cvc", "cvv", "csc", "key", "pass", "pin", "pwd", "secret", "security", "token",
)  # fmt: skip


@lru_cache(maxsize=4096)
def _key_class(key: str) -> str | None:
    """The label class a JSON key names (``password``, ``q_api_key``, ``auth``...), or None."""
    if len(key) > 64:
        return None
    m = _KEY_LABEL.fullmatch(key)
    if m is None:
        return None
    if m.group("auth") is not None:
        return "auth"
    core_start = m.start("core")
    return _label_class(m.group("core"), key[:core_start])


# JSON key names can be a user's data (a mapping keyed by e-mail): cleared past the cache max age.
_KEYS_SWEPT = ClearedMemo(_key_class.cache_clear)
SWEEPER.track(_KEYS_SWEPT)


# -- card numbers ---------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn (mod 10) check."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if position % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


_CARD_SPLIT = re.compile(r"[ \-]")


def _card(value: str) -> bool:
    digits = value.replace(" ", "").replace("-", "")
    if not 13 <= len(digits) <= 19 or len(set(digits)) < 2:
        return False
    if not (digits[0] in "3456" or 2221 <= int(digits[:4]) <= 2720):
        return False
    seps = {c for c in value if c in " -"}
    if len(seps) > 1:
        return False
    if seps:
        groups = _CARD_SPLIT.split(value)
        if len(groups[0]) != 4 or any(not 3 <= len(g) <= 7 for g in groups[1:]):
            return False
    return luhn_valid(digits)


# -- phones ---------------------------------------------------------------------------------------


def _digit_count(low: int, high: int) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        return low <= sum(c.isdigit() for c in value) <= high

    return check


def _nanp(value: str) -> bool:
    """(NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX or NXX NXX XXXX (N: 2-9), one kind of separator."""
    digits = [c for c in value if c.isdigit()]
    if digits[0] not in "23456789" or digits[3] not in "23456789":
        return False
    if value[0] == "(":
        return value[4] == ")"
    return value[3] == value[7] and ")" not in value


def _ssn(value: str) -> bool:
    area, group, serial = value.split("-")
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _standalone(check: Callable[[str], bool] | None = None) -> Callable[[re.Match[str]], bool]:
    """A number not glued to a word, a dash, a dot or a decimal: ``x-555-...``, ``1.555...`` are not phones."""

    def ok(m: re.Match[str]) -> bool:
        text, start, end = m.string, m.start(), m.end()
        if start and (text[start - 1].isalnum() or text[start - 1] in "_-.+/"):
            return False
        after = text[end : end + 2]
        if after and (
            after[0].isalnum() or after[0] in "_-" or (after[0] == "." and after[1:].isdigit())
        ):
            return False
        return check is None or check(text[start:end])

    return ok
