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

The implementation is private: ``_base`` holds the modes, findings and the
shape of a rule, ``_values`` the tests of what a value looks like, ``_rules``
the rule table, and ``_redactor`` the :class:`Redactor` that applies it to
text and walks JSON (``_scan`` and ``_json_text`` narrow the rules on a value's
JSON text, ``_verdicts`` keeps the strings a walk found clean).
"""

from __future__ import annotations

from tiers.redaction._base import DEFAULT_PLACEHOLDER, Finding, RedactMode
from tiers.redaction._redactor import OFF, Redactor, check_patterns, redact_dumped_json
from tiers.redaction._values import luhn_valid

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "OFF",
    "Finding",
    "RedactMode",
    "Redactor",
    "check_patterns",
    "luhn_valid",
    "redact_dumped_json",
]
