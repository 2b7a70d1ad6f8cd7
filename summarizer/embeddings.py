"""Hosted embeddings through litellm: any embedding model litellm can call.

An :class:`~tiers.backends.base.Embedder` for users who configure a hosted
model instead of the bundled local one (:class:`tiers.backends.embedders.MiniLMEmbedder`).
It lives here because litellm may only be imported in ``summarizer``; the
import is lazy (it is slow) and never fetches litellm's price list.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tiers.errors import EmbedderError, InvalidInputError

_PROBE_TEXT = "dimension probe"


def _import_litellm() -> ModuleType:
    # Without this, importing litellm downloads a model price list (and waits 5 s offline).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import litellm
    except ImportError as exc:
        raise EmbedderError("hosted embeddings need litellm: pip install 'litellm>=1.50'") from exc
    return litellm


def _normalise(vector: Sequence[float], *, model: str) -> list[float]:
    values = [float(x) for x in vector]
    norm = math.sqrt(math.fsum(x * x for x in values))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbedderError(f"embedding model {model!r} returned a zero or non-finite vector")
    return [x / norm for x in values]


class LiteLLMEmbedder:
    """Embeddings from a hosted model through ``litellm.embedding``, L2-normalised.

    Args:
        model: A litellm model name, e.g. ``"openai/text-embedding-3-small"``.
        dimension: Expected vector length. ``None`` asks the model once, on
            first use of :attr:`dimension` or :meth:`embed`.
        batch_size: Texts per request.
        **kwargs: Passed to every ``litellm.embedding`` call (``api_base``,
            ``api_key``, ``timeout``, ``dimensions``, ...).
    """

    def __init__(
        self,
        model: str,
        dimension: int | None = None,
        *,
        batch_size: int = 128,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError("model must be a non-empty litellm model name", field="model")
        if dimension is not None and (
            not isinstance(dimension, int) or isinstance(dimension, bool) or dimension < 1
        ):
            raise InvalidInputError(
                "dimension must be a positive integer or None", field="dimension"
            )
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", field="batch_size")
        self.model = model
        self.name = f"litellm:{model}"
        self.batch_size = batch_size
        self._kwargs = kwargs
        self._dimension = dimension
        self._lock = threading.Lock()

    @property
    def dimension(self) -> int:
        """Length of every vector; asks the model once if it was not given.

        Raises:
            EmbedderError: The model could not be asked.
        """
        if self._dimension is None:
            with self._lock:
                if self._dimension is None:
                    self._dimension = len(self._request([_PROBE_TEXT])[0])
        return self._dimension

    @dimension.setter
    def dimension(self, value: int) -> None:
        self._dimension = value

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts``; one unit vector per text, in input order.

        Raises:
            InvalidInputError: ``texts`` is a bare string or holds a non-string.
            EmbedderError: The request failed, or the model returned the wrong
                number of vectors or a wrong-sized vector.
        """
        if isinstance(texts, str):
            raise InvalidInputError(
                "texts must be a sequence of strings, not one string", field="texts"
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInputError(
                    f"texts[{index}] must be a string, got {type(text).__name__}",
                    field=f"texts[{index}]",
                )
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(self._request(list(texts[start : start + self.batch_size])))
        if not vectors:
            return vectors
        with self._lock:
            if self._dimension is None:
                self._dimension = len(vectors[0])
            expected = self._dimension
        for vector in vectors:
            if len(vector) != expected:
                raise EmbedderError(
                    f"embedding model {self.model!r} returned {len(vector)} dimensions, expected "
                    f"{expected}: configure the dimension the model produces"
                )
        return vectors

    def _request(self, batch: list[str]) -> list[list[float]]:
        litellm = _import_litellm()
        # Hosted APIs reject empty strings; a single space embeds as "nothing".
        payload = [text if text.strip() else " " for text in batch]
        try:
            response: Any = litellm.embedding(model=self.model, input=payload, **self._kwargs)
        except Exception as exc:  # litellm raises many provider-specific types
            raise EmbedderError(
                f"embedding model {self.model!r} failed ({type(exc).__name__}): {exc}"
            ) from exc
        data = list(getattr(response, "data", None) or [])
        if len(data) != len(batch):
            raise EmbedderError(
                f"embedding model {self.model!r} returned {len(data)} vectors for {len(batch)} texts"
            )

        def field(item: Any, name: str) -> Any:
            return item[name] if isinstance(item, dict) else getattr(item, name)

        # Providers may answer out of order; "index" says which input each vector belongs to.
        ordered = sorted(data, key=lambda item: int(field(item, "index")))
        return [_normalise(field(item, "embedding"), model=self.model) for item in ordered]
