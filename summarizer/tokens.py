"""Token counting with tiktoken, offline.

tiktoken downloads its BPE files on first use. litellm's wheel already ships
``cl100k_base``, ``o200k_base`` and ``p50k_base`` under the cache-file names
tiktoken expects, so pointing ``TIKTOKEN_CACHE_DIR`` there makes stock tiktoken
work with no network. The folder is located without importing litellm (slow).
litellm resets ``TIKTOKEN_CACHE_DIR`` when its tokenizer module loads unless
``CUSTOM_TIKTOKEN_CACHE_DIR`` is set, so both are set.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import tiktoken

from summarizer.errors import SummarizerError

DEFAULT_ENCODING = "cl100k_base"
OFFLINE_ENCODINGS = ("cl100k_base", "o200k_base", "p50k_base")


def _litellm_tokenizer_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


@functools.cache
def get_encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """Load a tiktoken encoding from files shipped on disk, never from the network.

    Raises:
        SummarizerError: The encoding is not one shipped offline and no
            ``TIKTOKEN_CACHE_DIR`` was configured by the user.
    """
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        folder = _litellm_tokenizer_dir()
        if folder is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
            os.environ.setdefault("CUSTOM_TIKTOKEN_CACHE_DIR", str(folder))
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:
        raise SummarizerError(
            f"tiktoken encoding {name!r} is not available offline; use one of "
            f"{', '.join(OFFLINE_ENCODINGS)} or set TIKTOKEN_CACHE_DIR to a folder holding it"
        ) from exc


def count_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    """Number of tokens of ``text`` in ``encoding``."""
    return len(get_encoding(encoding).encode(text, disallowed_special=()))


def truncate_tokens(text: str, max_tokens: int, encoding: str = DEFAULT_ENCODING) -> str:
    """The longest prefix of ``text`` that fits in ``max_tokens`` tokens."""
    enc = get_encoding(encoding)
    tokens = enc.encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text
    return enc.decode(tokens[: max(max_tokens, 0)])
