"""Redaction of secrets (and, optionally, personal data) before anything is stored.

A :class:`Redactor` replaces what it finds with a typed placeholder
(``[REDACTED:api_key]`` by default), so the text stays readable for a
summarizer and a person while the secret itself never reaches a store, a
vector index or a hosted model. Pure functions over compiled regexes: no I/O,
no model, thread-safe, deterministic and idempotent (redacting redacted text
changes nothing).

What is found, by mode:

- ``"secrets"`` (the default of :class:`~memory.Memory`):

  - provider keys and tokens by their format: OpenAI (``sk-``, ``sk-proj-``),
    Anthropic (``sk-ant-``), AWS access key ids (``AKIA``/``ASIA``...),
    GitHub (``ghp_``, ``gho_``, ``github_pat_``...), GitLab (``glpat-``),
    Slack (``xox?-``, webhook URLs), Stripe (``sk_live_``, ``rk_live_``,
    ``whsec_``), Google (``AIza``, ``ya29.``, ``GOCSPX-``), Hugging Face
    (``hf_``), npm (``npm_``), SendGrid (``SG.``), Discord webhook URLs,
    tiermem's own API keys (``tmk_``), JWTs;
  - ``Authorization:`` header values and ``Bearer <token>``;
  - labelled values: ``password: ...``, ``api_key=...``, ``"client_secret": "..."``,
    ``OPENAI_API_KEY=...``, ``my password is ...``, ``PIN: 1234``, ``CVV 123``
    (the value must look like a credential for its label: see :func:`_accept`);
  - the password of URL user info (``postgres://user:<password>@host``);
  - payment card numbers (13-19 digits, spaces or dashes allowed) that pass
    the Luhn check and start like a card (2-6);
  - PEM/OpenSSH/PGP private key blocks.

- ``"secrets+pii"`` adds e-mail addresses, phone numbers (E.164, North
  American, leading-zero national formats, and any number after "phone:",
  "call me at"...) and US social security numbers.

- ``"off"`` stores everything verbatim.

JSON values (:meth:`Redactor.redact_json`) are walked: every string is redacted
as text, and a string under a key that names a credential (``password``,
``api_key``, ``accessToken``, ``Authorization``...) is replaced whole when it
looks like one. Keys themselves are kept (they are structure).

Custom patterns (``patterns={"employee_id": r"EMP-\\d{6}"}``) add kinds of
their own; a pattern with a group named ``secret`` has only that group replaced.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal, TypeVar, cast, get_args

import orjson

from tiers.errors import InvalidInputError

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "OFF",
    "Finding",
    "RedactMode",
    "Redactor",
    "check_patterns",
    "luhn_valid",
]

RedactMode = Literal["off", "secrets", "secrets+pii"]
J = TypeVar("J")  # a JSON value: redact_json gives back the same shape
MODES: Final[tuple[str, ...]] = get_args(RedactMode)

DEFAULT_PLACEHOLDER: Final = "[REDACTED:{kind}]"

_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a redactor found: what kind, which rule, where (``text[start:end]``)."""

    kind: str
    rule: str
    start: int
    end: int


# A rule's classifier gets a match and returns (kind, start, end) to replace, or None.
Classify = Callable[[re.Match[str]], tuple[str, int, int] | None]


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    pattern: re.Pattern[str]
    classify: Classify
    # The rule runs only on text holding one of these (a C-speed substring test).
    triggers: tuple[str, ...] = ()
    # Or: where this finds its word in the lowercased text, ``pattern`` is matched.
    finder: re.Pattern[str] | None = None
    finder_i: re.Pattern[str] | None = None  # the same, for text whose lowercase is longer
    # The finder runs only on text whose lowercase holds one of these words.
    words: tuple[str, ...] = ()
    # The rule runs only on text with a run of 7+ digits (cards, phones).
    digits: bool = False


def _group(kind: str, group: int | str = 0, check: Callable[[str], bool] | None = None) -> Classify:
    """A classifier that replaces ``group`` as ``kind`` when ``check`` accepts its text."""

    def classify(m: re.Match[str]) -> tuple[str, int, int] | None:
        start, end = m.span(group)
        if start < 0 or start == end:
            return None
        if check is not None and not check(m.string[start:end]):
            return None
        return kind, start, end

    return classify


# -- value shapes -------------------------------------------------------------------------------

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
    "authorization", "cv", "csc", "key", "pass", "pin", "pwd", "secret", "security", "token",
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


# -- the rules ------------------------------------------------------------------------------------

_WORDISH = r"[A-Za-z0-9_\-]"


def _after_boundary(literal: str) -> str:
    """``literal`` not glued to a token before it (the literal comes first, for a fast scan)."""
    return f"{re.escape(literal)}(?<!{_WORDISH}{re.escape(literal)})"


def _rule(
    name: str,
    pattern: str,
    classify: Classify,
    triggers: tuple[str, ...] = (),
    finder: str | None = None,
    words: tuple[str, ...] = (),
    digits: bool = False,
) -> _Rule:
    return _Rule(
        name,
        re.compile(pattern),
        classify,
        triggers,
        None if finder is None else re.compile(finder),
        None if finder is None else re.compile(finder, re.IGNORECASE),
        words,
        digits,
    )


def _secret_rules() -> list[_Rule]:
    api_key = _group("api_key", check=_has_letter_and_digit)
    return [
        _rule(
            "private_key",
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"(?:[\s\S]{0,65536}?-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
            r"|[A-Za-z0-9+/=\s\\:,.\-]*)",
            _group("private_key"),
            ("PRIVATE KEY",),
        ),
        _rule(
            "anthropic", _after_boundary("sk-ant-") + r"[A-Za-z0-9_\-]{20,}", api_key, ("sk-ant-",)
        ),
        _rule(
            "openai",
            _after_boundary("sk-") + r"(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}",
            api_key,
            ("sk-",),
        ),
        _rule(
            "stripe",
            r"(?:[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,})",
            _group("api_key", check=_has_letter_and_digit),
            ("k_live_", "k_test_", "whsec_"),
        ),
        _rule(
            "aws_access_key_id",
            r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|ROA|IPA|NPA|NVA|PKA)(?<![A-Z0-9]A...)[A-Z0-9]{16}(?![A-Z0-9])",
            _group("api_key"),
            (
                "AKIA",
                "ASIA",
                "ABIA",
                "ACCA",
                "AGPA",
                "AIDA",
                "AROA",
                "AIPA",
                "ANPA",
                "ANVA",
                "APKA",
            ),
        ),
        _rule(
            "github",
            r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
            api_key,
            ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        ),
        _rule(
            "gitlab",
            r"gl(?:pat|dt|rt|cbt|ptt)-[A-Za-z0-9_\-]{20,}",
            _group("api_key"),
            ("glpat-", "gldt-", "glrt-", "glcbt-", "glptt-"),
        ),
        _rule(
            "slack",
            r"(?:xox[abposre]-[A-Za-z0-9\-]{10,}|xapp-\d-[A-Za-z0-9\-]{20,})",
            api_key,
            ("xox", "xapp-"),
        ),
        _rule(
            "webhook_url",
            r"https://(?:hooks\.slack\.com/(?:services|workflows|triggers)/"
            r"|discord(?:app)?\.com/api/webhooks/\d+/)(?P<v>[A-Za-z0-9/_\-]{20,})",
            _group("secret", "v"),
            ("hooks.slack.com", "/api/webhooks/"),
        ),
        _rule(
            "google_api_key",
            _after_boundary("AIza") + r"[0-9A-Za-z_\-]{35}(?![A-Za-z0-9_\-])",
            _group("api_key"),
            ("AIza",),
        ),
        _rule(
            "google_oauth",
            r"(?:ya29\.[0-9A-Za-z_\-]{20,}|GOCSPX-[0-9A-Za-z_\-]{20,})",
            _group("token"),
            ("ya29.", "GOCSPX-"),
        ),
        _rule(
            "tiermem",
            _after_boundary("tmk_") + r"[0-9a-f]{12}_[A-Za-z0-9_\-]{43}",
            _group("api_key"),
            ("tmk_",),
        ),
        _rule("huggingface", _after_boundary("hf_") + r"[A-Za-z0-9]{30,}", api_key, ("hf_",)),
        _rule("npm", _after_boundary("npm_") + r"[A-Za-z0-9]{36,}", api_key, ("npm_",)),
        _rule(
            "sendgrid",
            _after_boundary("SG.") + r"[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}",
            _group("api_key"),
            ("SG.",),
        ),
        _rule(
            "jwt",
            _after_boundary("eyJ")
            + r"[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
            _group("token"),
            ("eyJ",),
        ),
        _rule(
            "authorization_header",
            r"(?i:(?:proxy-)?authorization)\\?[\"']?\s*[:=]\s*\\?[\"']?"
            r"(?:(?i:bearer|basic|token|digest|apikey)\s+)?(?P<v>[A-Za-z0-9._~+/=\-]{8,})",
            _group("token", "v", lambda v: _plain_value(v) and _machine_made(v, 8)),
            finder="authorization",
            words=("authorization",),
        ),
        _rule(
            "bearer",
            r"(?i:bearer)\s+(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)",
            _group("token", "v", _has_letter_and_digit),
            finder="bearer",
            words=("bearer",),
        ),
        _rule(
            "url_credentials",
            r"://[^\s:/@'\"<>]{1,128}:(?P<v>[^\s/@'\"<>]{1,256})@(?=[\w\[])",
            _group("password", "v", _plain_value),
            ("://",),
        ),
        _Rule(
            "labelled",
            _LABEL_AT,
            _labelled,
            (),
            _LABEL_FIND,
            _LABEL_FIND_I,
            ("pass", "pwd", "key", "secret", "token", "pin", "cv", "csc", "security"),
        ),
        _rule(
            "card_number",
            r"\d(?<![\w.+\-/]\d)(?:[ \-]?\d){12,18}(?![\w\-]|\.\d)",
            _group("card_number", check=_card),
            digits=True,
        ),
    ]


def _pii_rules() -> list[_Rule]:
    def phone(check: Callable[[str], bool]) -> Classify:
        standalone = _standalone(check)
        return lambda m: ("phone", m.start(), m.end()) if standalone(m) else None

    return [
        _rule(
            "email",
            r"[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w\-])",
            _email,
            ("@",),
        ),
        _rule(
            "phone_labelled",
            r"(?i:phone|telephone|tel|mobile|cell|whatsapp|sms|fax|call\s+me|text\s+me|reach\s+me)"
            r"(?:\s*(?i:number|no\.?|#))?\s*(?:(?i:is|at|on)\s+|:\s*)?"
            r"(?P<v>\+?\(?\d[\d ().\-]{5,18}\d)(?![\w\-])",
            _word_start(_group("phone", "v", _digit_count(7, 15))),
            finder="phone|tel|mobile|cell|whatsapp|sms|fax|call me|text me|reach me",
            words=("phone", "tel", "mobile", "cell", "whatsapp", "sms", "fax", "me"),
            digits=True,
        ),
        _rule(
            "phone_international",
            r"\+[1-9]\d{0,2}(?:[ .\-]?\(?\d{1,4}\)?){2,5}(?![\w\-])",
            phone(_digit_count(8, 15)),
            ("+",),
            digits=True,
        ),
        _rule("phone_nanp", r"\d{3}[\-. ]\d{3}[\-. ]\d{4}", phone(_nanp), digits=True),
        _rule(
            "phone_nanp_paren", r"\(\d{3}\) ?\d{3}[\-. ]\d{4}", phone(_nanp), ("(",), digits=True
        ),
        _rule(
            "phone_national",
            r"0\d{2,4}[ \-]\d{3,4}[ \-]?\d{3,4}",
            phone(_digit_count(10, 11)),
            digits=True,
        ),
        _rule(
            "ssn",
            r"\d{3}-\d{2}-\d{4}",
            lambda m: ("ssn", m.start(), m.end()) if _standalone(_ssn)(m) else None,
            ("-",),
            digits=True,
        ),
    ]


def _word_start(classify: Classify) -> Classify:
    """``classify``, for a match that starts a word ("Tel: ...", not "Hotel (2011-2013)")."""

    def at_word_start(m: re.Match[str]) -> tuple[str, int, int] | None:
        if m.start() and m.string[m.start() - 1].isalpha():
            return None
        return classify(m)

    return at_word_start


def _email(m: re.Match[str]) -> tuple[str, int, int] | None:
    start = m.start()
    if start and (m.string[start - 1].isalnum() or m.string[start - 1] in "._%+-:"):
        return None
    return "email", start, m.end()


# Seven digits, with single separators between them: the least a card or phone number has.
_DIGIT_RUN = re.compile(r"\d(?:[ \-().]?\d){6}")
# ASCII digits -> "0", the separators _DIGIT_RUN allows -> "s", every other byte -> " ".
_DIGIT_MAP: Final = (
    bytes(
        ord("0") if chr(b).isdigit() else ord("s") if chr(b) in " -()." else ord(" ")
        for b in range(128)
    )
    + b" " * 128
)


# _DIGIT_RUN over text mapped by _DIGIT_MAP: it starts with a literal, so the regex
# engine jumps from digit to digit instead of trying every position.
_MAPPED_DIGIT_RUN = re.compile(rb"0(?:s?0){6}")


def _has_digit_run(data: bytes, text: str) -> bool:
    """Whether ``_DIGIT_RUN`` matches ``text`` (``data`` is its UTF-8), about six times faster."""
    if not data.isascii():
        return _DIGIT_RUN.search(text) is not None  # \d matches other scripts' digits too
    return _MAPPED_DIGIT_RUN.search(data.translate(_DIGIT_MAP)) is not None


_SECRET_RULES: Final = _secret_rules()
_PII_RULES: Final = _pii_rules()


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


_JSON_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f]*')
"""Text JSON writes as it is (no quote, backslash or control character to escape)."""
_MAX_NARROWED: Final = 256


@dataclass(frozen=True, slots=True)
class _RuleSet:
    """Rules and their gates at once: text that passes none (most text) costs a few substring tests."""

    rules: tuple[_Rule, ...]
    ungated: bool
    triggers: tuple[str, ...]
    words: tuple[str, ...]
    digits: bool

    @classmethod
    def of(cls, rules: tuple[_Rule, ...]) -> _RuleSet:
        return cls(
            rules,
            any(not (r.triggers or r.words or r.digits) for r in rules),
            tuple(sorted({t for r in rules for t in r.triggers})),
            tuple(sorted({w for r in rules for w in r.words})),
            any(r.digits for r in rules),
        )


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
        self._all = _RuleSet.of(self._rules)
        # The rule sets redact_json narrowed to, by the rules kept (a handful in practice).
        self._narrowed: dict[tuple[int, ...], _RuleSet] = {}
        # The gates can be tested on a value's JSON text only if JSON never escapes
        # a character of theirs, so an occurrence in a string is one in the text too.
        self._text_gates = all(
            _JSON_PLAIN.fullmatch(gate) is not None
            for gate in (*self._all.triggers, *self._all.words, *_KEY_WORDS)
        ) and all(word.isascii() for word in self._all.words)
        self._trigger_chars = tuple(sorted({c for t in self._all.triggers for c in t}))
        self._gate_words = tuple(sorted({*self._all.words, *_KEY_WORDS}))

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
        return self._find(text, self._all)

    def _find(self, text: str, rule_set: _RuleSet) -> list[Finding]:
        """:meth:`findings` by the rules of ``rule_set`` (all rules, or those a value can match)."""
        if not rule_set.rules or len(text) < 6:
            return []
        found: list[tuple[int, int, int, str, str]] = []
        lowered: str | None = None
        digits: bool | None = None
        if not rule_set.ungated:
            # Lowercased only for rules with words (a narrowed set often has none).
            if rule_set.words:
                lowered = text.lower()
            if not (
                any(map(text.__contains__, rule_set.triggers))
                or (lowered is not None and any(map(lowered.__contains__, rule_set.words)))
                or (rule_set.digits and (digits := _DIGIT_RUN.search(text) is not None))
            ):
                return []
        for rule in rule_set.rules:
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
        return self._redact(text, self._all)

    def _redact(self, text: str, rule_set: _RuleSet) -> str:
        found = self._find(text, rule_set)
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
        rule_set, by_key = self._narrow(value, key)
        if not rule_set.rules and not by_key:
            return value  # no string of it can change: no walk
        return cast(J, self._walk(value, key, rule_set, by_key))

    def _narrow(self, value: object, key: str | None) -> tuple[_RuleSet, bool]:
        """The rules some string of ``value`` may match, and whether a key may name a credential.

        One pass over the value's JSON text (every string of it is in there
        verbatim) runs every rule's gates once, so each string is then tested
        against the few rules left instead of all of them: a rule whose gates
        the whole text fails is skipped by every string's gates too.
        """
        if not self._text_gates:
            return self._all, True
        try:
            data = orjson.dumps(value)
        except TypeError:  # not plain JSON (an int key, a huge int, deep nesting): test it all
            return self._all, True
        text = data.decode()
        lowered = text.lower()
        digits = self._all.digits and _has_digit_run(data, text)
        # A trigger with a character the text lacks cannot occur in it: one fast
        # character search each spares most of the triggers' substring scans.
        absent = frozenset(c for c in self._trigger_chars if c not in text)
        # Each word is searched once, though rules and the key test share words.
        words = frozenset(w for w in self._gate_words if w in lowered)
        kept = tuple(
            n
            for n, rule in enumerate(self._rules)
            if (not rule.triggers or any(t in text for t in rule.triggers if absent.isdisjoint(t)))
            and (not rule.words or not words.isdisjoint(rule.words))
            and (not rule.digits or digits)
        )
        rule_set = self._narrowed.get(kept)
        if rule_set is None:
            rule_set = _RuleSet.of(tuple(self._rules[n] for n in kept))
            if len(self._narrowed) < _MAX_NARROWED:
                self._narrowed[kept] = rule_set
        by_key = key is not None or not words.isdisjoint(_KEY_WORDS)
        return rule_set, by_key

    def _walk(self, value: object, key: str | None, rule_set: _RuleSet, by_key: bool) -> object:
        if isinstance(value, str):
            if by_key and key is not None:
                whole = self._by_key(key, value)
                if whole is not None:
                    return whole
            if not rule_set.rules or len(value) < 6:
                return value  # what _find decides first, without two calls per string
            return self._redact(value, rule_set)
        if isinstance(value, dict):
            changed: dict[object, object] | None = None
            for k, v in value.items():
                new = self._walk(v, k, rule_set, by_key)
                if new is not v:
                    if changed is None:
                        changed = dict(value)
                    changed[k] = new
            return value if changed is None else changed
        if isinstance(value, list):
            out: list[object] | None = None
            for n, v in enumerate(value):
                new = self._walk(v, key, rule_set, by_key)
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
