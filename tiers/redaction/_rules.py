"""The rule table: one rule per kind of secret or personal data, tried in order."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from tiers.redaction._base import Classify, _group, _Rule
from tiers.redaction._values import (
    _LABEL_AT,
    _LABEL_FIND,
    _LABEL_FIND_I,
    _card,
    _digit_count,
    _has_letter_and_digit,
    _labelled,
    _machine_made,
    _nanp,
    _plain_value,
    _ssn,
    _standalone,
)

_WORDISH = r"[A-Za-z0-9_\-]"
# The digit runs rules need (see _Rule.digits): a phone has 7 digits at least, a card 13.
_PHONE_DIGITS: Final = 7
_CARD_DIGITS: Final = 13


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
    digits: int = 0,
    json_gate: str | None = None,
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
        None if json_gate is None else re.compile(json_gate),
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
            "anthropic",
            _after_boundary("sk-ant-") + r"[A-Za-z0-9_\-]{20,}",
            api_key,
            ("sk-ant-",),
            # A JSON gate drops the boundary test: the escape JSON writes for a control
            # character before a token ends in a digit (\u0001), a word character.
            json_gate=r"sk-ant-[A-Za-z0-9_\-]{20,}",
        ),
        _rule(
            "openai",
            _after_boundary("sk-") + r"(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}",
            api_key,
            ("sk-",),
            # "task-list", "risk-free": prose holds "sk-" often, a long token after it rarely.
            json_gate=r"sk-[A-Za-z0-9_\-]{20,}",
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
            # Prose holds "xox" ("xoxo"), rarely a dash and ten token characters after it.
            json_gate=r"xox[abposre]-[A-Za-z0-9\-]{10}|xapp-\d-[A-Za-z0-9\-]{20}",
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
            json_gate=r"AIza[0-9A-Za-z_\-]{35}",
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
            json_gate=r"tmk_[0-9a-f]{12}_[A-Za-z0-9_\-]{43}",
        ),
        _rule(
            "huggingface",
            _after_boundary("hf_") + r"[A-Za-z0-9]{30,}",
            api_key,
            ("hf_",),
            json_gate=r"hf_[A-Za-z0-9]{30,}",
        ),
        _rule(
            "npm",
            _after_boundary("npm_") + r"[A-Za-z0-9]{36,}",
            api_key,
            ("npm_",),
            json_gate=r"npm_[A-Za-z0-9]{36,}",
        ),
        _rule(
            "sendgrid",
            _after_boundary("SG.") + r"[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}",
            _group("api_key"),
            ("SG.",),
            json_gate=r"SG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16}",
        ),
        _rule(
            "jwt",
            _after_boundary("eyJ")
            + r"[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
            _group("token"),
            ("eyJ",),
            json_gate=r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8}",
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
            # JSON writes a character of these classes as itself or as an escape made of
            # them (backslash, letters, digits), so only the length limits are dropped;
            # most URLs ("https://host/path") fail it at their first "/".
            json_gate=r"://[^\s:/@'\"<>]+:[^\s/@'\"<>]+@",
        ),
        _Rule(
            "labelled",
            _LABEL_AT,
            _labelled,
            (),
            _LABEL_FIND,
            _LABEL_FIND_I,
            ("pass", "pwd", "key", "secret", "token", "pin", "cvv", "cvc", "csc", "security"),
        ),
        _rule(
            "card_number",
            r"\d(?<![\w.+\-/]\d)(?:[ \-]?\d){12,18}(?![\w\-]|\.\d)",
            _group("card_number", check=_card),
            # 13 digits at least: ids, timestamps and hex digests have 7-digit runs often.
            digits=_CARD_DIGITS,
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
            # The pattern's "\s+" between two words: as it is in a string, and as JSON writes
            # it (\n, \t, \u001f...) in the value's text the narrowing searches.
            finder=r"phone|tel|mobile|cell|whatsapp|sms|fax"
            r"|(?:call|text|reach)(?:\s|\\(?:[tnrf]|u00[01][0-9a-f]))+me",
            words=("phone", "tel", "mobile", "cell", "whatsapp", "sms", "fax", "me"),
            digits=_PHONE_DIGITS,
        ),
        _rule(
            "phone_international",
            r"\+[1-9]\d{0,2}(?:[ .\-]?\(?\d{1,4}\)?){2,5}(?![\w\-])",
            phone(_digit_count(8, 15)),
            ("+",),
            digits=_PHONE_DIGITS,
        ),
        _rule("phone_nanp", r"\d{3}[\-. ]\d{3}[\-. ]\d{4}", phone(_nanp), digits=_PHONE_DIGITS),
        _rule(
            "phone_nanp_paren",
            r"\(\d{3}\) ?\d{3}[\-. ]\d{4}",
            phone(_nanp),
            ("(",),
            digits=_PHONE_DIGITS,
        ),
        _rule(
            "phone_national",
            r"0\d{2,4}[ \-]\d{3,4}[ \-]?\d{3,4}",
            phone(_digit_count(10, 11)),
            digits=_PHONE_DIGITS,
        ),
        _rule(
            "ssn",
            r"\d{3}-\d{2}-\d{4}",
            lambda m: ("ssn", m.start(), m.end()) if _standalone(_ssn)(m) else None,
            ("-",),
            digits=_PHONE_DIGITS,
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


# Seven digits, any run of the separators a phone rule allows between two of them (" - ",
# ") (": "phone: 555 - 1234" is one): the least a card or phone number has.
_DIGIT_RUN = re.compile(r"\d(?:[ \-().]*\d){6}")
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
_MAPPED_DIGIT_RUN = re.compile(rb"0(?:s*0){6}")


_ASCII: Final = bytes(range(128))
_ANY_DIGIT = re.compile(r"\d")


def _other_digits(data: bytes) -> bool:
    """Whether the UTF-8 ``data`` has a digit of another script (``\\d`` matches those too).

    Its non-ASCII characters alone, UTF-8 still (an ASCII byte is never part of
    another character's), are searched: a few in most text, where a ``\\d`` regex
    over the whole text tries every place (~1.6 ms over 85 KB of chat).
    """
    return _ANY_DIGIT.search(data.translate(None, _ASCII).decode()) is not None


def _has_digit_run(data: bytes, text: str, other_digits: bool | None = None) -> bool:
    """Whether ``_DIGIT_RUN`` matches ``text`` (``data`` is its UTF-8), about six times faster.

    ``other_digits`` is :func:`_other_digits` of ``data`` when the caller has it
    (the card gate asks the same of the same text), else None.
    """
    if not data.isascii() and (_other_digits(data) if other_digits is None else other_digits):
        return _DIGIT_RUN.search(text) is not None
    # Every digit is ASCII: runs of them and their separators are the same in the bytes.
    return _MAPPED_DIGIT_RUN.search(data.translate(_DIGIT_MAP)) is not None


# What the card rule needs: 13 digits, a space or a dash allowed between two of them.
_CARD_RUN = re.compile(r"\d(?:[ \-]?\d){12}")
# _CARD_RUN starting where the card rule may start, on ASCII bytes: not after a digit or a
# dash, nor after what glues a number to a word before it (the rule's lookbehind: letters,
# "_", ".", "+", "/"), but for the letters an escape JSON writes ends with (\n, \u001f...).
_ASCII_CARD_RUN = re.compile(rb"(?<![0-9\-g-mo-qsv-zG-MO-QSV-Z_.+/])[0-9](?:[ \-]?[0-9]){12}")
# _CARD_RUN in bytes, for UTF-8 text whose digits are all ASCII.
_BYTES_CARD_RUN = re.compile(rb"[0-9](?:[ \-]?[0-9]){12}")
# ASCII letters -> lowercase; ASCII digits, spaces and dashes -> "0"; every other byte as it
# is. A card's 13 digits and the separators between them are 13 zeros or more in a row, and
# the gate words (letters only) are where the lowercase has them: one map serves both.
_GATE_MAP: Final = bytes(
    ord("0") if chr(b) in "0123456789 -" else ord(chr(b).lower()) if b < 128 else b
    for b in range(256)
)
_RUN_ZEROS: Final = b"0" * 13
_NOT_ZERO = re.compile(rb"[^0]")


def _has_card_run(data: bytes, text: str, other_digits: bool | None = None) -> bool:
    """Whether a string of the JSON ``text`` (``data`` is its UTF-8) may hold a card number.

    Never False where the card rule matches a string of it. Most text has no
    13 digits, spaces or dashes in a row (one table map, then a C substring
    test); each such run is searched for 13 digits, single separators between
    them, starting where a card may start, which hex ids glued to a word
    ("eff-3-1-4129...") and timestamps lack. ``other_digits`` is
    :func:`_other_digits` of ``data`` when the caller has it (the phone gates
    ask the same of the same text), else None. A caller with ASCII ``data``
    already mapped by :data:`_GATE_MAP` asks :func:`_runs_match` itself.
    """
    if data.isascii():
        return _runs_match(data, data.translate(_GATE_MAP), _ASCII_CARD_RUN)
    if _other_digits(data) if other_digits is None else other_digits:
        return _CARD_RUN.search(text) is not None
    # Every digit is ASCII: _CARD_RUN's matches are the same in the bytes (where a non-ASCII
    # character before a run is no ASCII letter, so the run is searched without a lookbehind).
    return _runs_match(data, data.translate(_GATE_MAP), _BYTES_CARD_RUN)


def _runs_match(data: bytes, runs: bytes, card_run: re.Pattern[bytes]) -> bool:
    """Whether ``card_run`` matches inside a run of 13+ ASCII digits, spaces and dashes of ``data``.

    ``runs`` is ``data`` mapped by :data:`_GATE_MAP` (those characters are its zeros).
    """
    start = runs.find(_RUN_ZEROS)
    while start >= 0:
        # The run of digits, spaces and dashes from here (it starts here: the search
        # begins after the last one).
        other = _NOT_ZERO.search(runs, start)
        end = len(runs) if other is None else other.start()
        if card_run.search(data, start, end) is not None:
            return True
        start = runs.find(_RUN_ZEROS, end)
    return False


_SECRET_RULES: Final = _secret_rules()
_PII_RULES: Final = _pii_rules()
