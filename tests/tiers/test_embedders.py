"""The local MiniLM embedder (real ONNX model) and the litellm embedder (local stub server)."""

from __future__ import annotations

import base64
import itertools
import json
import random
import shutil
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
from tokenizers import Tokenizer

from summarizer.embeddings import LiteLLMEmbedder
from tiers.backends.base import Embedder
from tiers.backends.embedders import (
    CALL_COST_TOKENS,
    MODEL_SHA256,
    TOKENIZER_FILE,
    MiniLMEmbedder,
    model_file,
    plan_calls,
)
from tiers.errors import BackendUnavailableError, EmbedderError, InvalidInputError

SENTENCES = [
    "We migrated the billing service from MySQL to Postgres 16 last sprint.",
    "The database move for invoicing finished; Postgres is now the primary store.",
    "Book a window seat on the morning train to Kyoto for the team offsite.",
    "",
    "Short.",
    "Decided to postpone the Kubernetes upgrade until the autoscaler bug is fixed, "
    "and to keep the worker pool at twelve nodes over the holiday freeze.",
]


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    model = MiniLMEmbedder()
    model.load()
    return model


def cosine(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_implements_the_protocol_with_unit_vectors(embedder: MiniLMEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert (embedder.name, embedder.dimension) == ("all-MiniLM-L6-v2-int8", 384)
    vectors = embedder.embed(SENTENCES)
    assert len(vectors) == len(SENTENCES)
    assert all(len(v) == 384 for v in vectors)
    assert np.allclose(np.linalg.norm(np.array(vectors), axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]) == []


def test_paraphrases_are_closer_than_unrelated_text(embedder: MiniLMEmbedder) -> None:
    billing, invoicing, train = embedder.embed(SENTENCES[:3])
    assert cosine(billing, invoicing) > 0.5
    assert cosine(billing, invoicing) > cosine(billing, train) + 0.3


def test_matches_a_reference_with_the_tokenizers_own_fixed_padding(
    embedder: MiniLMEmbedder,
) -> None:
    """Our per-batch padding and pooling give what the plain 128-padded pipeline gives."""
    tokenizer = Tokenizer.from_file(str(TOKENIZER_FILE))  # as shipped: fixed 128 padding
    encodings = tokenizer.encode_batch(SENTENCES)
    assert {len(e.ids) for e in encodings} == {128}
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    session = onnxruntime.InferenceSession(
        str(model_file()), sess_options=options, providers=["CPUExecutionProvider"]
    )
    ids = np.array([e.ids for e in encodings], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
    (hidden,) = session.run(
        None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    )
    pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    reference = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    ours = np.array(embedder.embed(SENTENCES))
    assert np.min(np.sum(ours * reference, axis=1)) > 0.9999


def test_order_is_kept_across_sorted_batches() -> None:
    small_batches = MiniLMEmbedder(batch_size=2)
    together = np.array(small_batches.embed(SENTENCES))
    alone = np.array([small_batches.embed([s])[0] for s in SENTENCES])
    assert np.min(np.sum(together * alone, axis=1)) > 0.9999


def _plan_cost(lengths: list[int], ends: list[int]) -> int:
    begins = [0, *ends[:-1]]
    return sum(
        CALL_COST_TOKENS + (e - b) * lengths[e - 1] for b, e in zip(begins, ends, strict=True)
    )


def test_planned_calls_cover_every_text_within_the_batch_cap_at_the_least_cost() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 8)
        lengths = sorted(rng.choice([rng.randint(3, 40), rng.randint(3, 256)]) for _ in range(n))
        cap = rng.randint(1, 5)
        ends = plan_calls(lengths, cap)
        assert ends[-1] == n
        assert ends == sorted(set(ends))
        assert all(e - b <= cap for b, e in zip([0, *ends[:-1]], ends, strict=True))
        # Against every way of cutting the sorted texts into calls of at most ``cap``.
        best = min(
            _plan_cost(lengths, [*cuts, n])
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
            if all(e - b <= cap for b, e in zip([0, *cuts], [*cuts, n], strict=True))
        )
        assert _plan_cost(lengths, ends) == best
    assert plan_calls([], 32) == []
    assert len(plan_calls([20] * 70, 32)) == 3  # as few calls as the cap allows
    assert len(plan_calls([5] * 10 + [250] * 10, 32)) == 2  # never pad short texts to 250


def test_long_text_is_truncated_not_refused(embedder: MiniLMEmbedder) -> None:
    long_text = " ".join(["the quarterly report lists revenue by region"] * 200)
    base, with_tail = embedder.embed([long_text, long_text + " and a completely different ending"])
    # Past 256 tokens nothing is read, so the tail cannot change the vector.
    assert cosine(base, with_tail) > 0.99999
    assert abs(float(np.linalg.norm(base)) - 1.0) < 1e-5


def test_bad_input_is_refused(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(InvalidInputError, match="not one string"):
        embedder.embed("a bare string")
    with pytest.raises(InvalidInputError) as info:
        embedder.embed(["fine", 3])  # type: ignore[list-item]
    assert info.value.field == "texts[1]"
    with pytest.raises(InvalidInputError, match="batch_size"):
        MiniLMEmbedder(batch_size=0)


def test_a_model_file_with_another_checksum_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"not the pinned model")
    bad = MiniLMEmbedder(model_path=fake)
    with pytest.raises(EmbedderError, match=MODEL_SHA256) as info:
        bad.embed(["hello"])
    assert "reinstall" in str(info.value)
    assert isinstance(info.value, BackendUnavailableError)


def test_a_flipped_byte_in_a_copy_of_the_real_model_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "model.onnx"
    shutil.copyfile(model_file(), copy)
    assert MiniLMEmbedder(model_path=copy).embed(["works"])  # the intact copy loads
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(EmbedderError, match="sha256"):
        MiniLMEmbedder(model_path=copy).load()


def test_a_missing_model_file_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="cannot read"):
        MiniLMEmbedder(model_path=tmp_path / "absent.onnx").load()


@pytest.mark.usefixtures("no_network")
def test_cold_load_and_concurrent_use_need_no_network() -> None:
    fresh = MiniLMEmbedder()  # loads lazily, inside the threads below
    expected = MiniLMEmbedder().embed(SENTENCES)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: fresh.embed(SENTENCES), range(8)))
    for result in results:
        assert np.allclose(result, expected, atol=1e-5)


# -- LiteLLMEmbedder against a local OpenAI-compatible server --------------------------------


class StubEmbeddings:
    """A tiny OpenAI-compatible /v1/embeddings server on loopback, answering out of order."""

    def __init__(self, dimension: int = 6) -> None:
        self.dimension = dimension
        self.requests: list[dict[str, Any]] = []
        self.fail = False
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append({"path": self.path, **body})
                if stub.fail:
                    self._send(500, {"error": {"message": "stub failure", "type": "server_error"}})
                    return
                data = []
                for index, text in enumerate(body["input"]):
                    vector = stub.vector(text)
                    if body.get("encoding_format") == "base64":
                        packed = struct.pack(f"<{len(vector)}f", *vector)
                        embedding: Any = base64.b64encode(packed).decode()
                    else:
                        embedding = vector
                    data.append({"object": "embedding", "index": index, "embedding": embedding})
                data.reverse()  # the "index" field, not the position, says which input it is
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 3, "total_tokens": 3},
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def vector(self, text: str) -> list[float]:
        # Deterministic, unnormalised, and different per text.
        return (
            [float(len(text) + 1)]
            + [float((ord(c) % 7) + 1) for c in text[: self.dimension - 1]]
            + [0.5] * max(0, self.dimension - 1 - len(text))
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[StubEmbeddings]:
    server = StubEmbeddings()
    yield server
    server.stop()


def stub_embedder(stub: StubEmbeddings, **kwargs: Any) -> LiteLLMEmbedder:
    return LiteLLMEmbedder(
        "openai/stub-embedding", api_base=stub.url, api_key="sk-test", max_retries=0, **kwargs
    )


@pytest.mark.usefixtures("no_network")
def test_litellm_embedder_batches_orders_and_normalises(stub: StubEmbeddings) -> None:
    embedder = stub_embedder(stub, batch_size=2)
    texts = ["alpha", "a much longer text", "mid", "", "zeta"]
    vectors = embedder.embed(texts)
    assert len(stub.requests) == 3  # 5 texts in batches of 2, no extra probe
    assert isinstance(embedder, Embedder)
    assert all(r["path"] == "/v1/embeddings" for r in stub.requests)
    assert embedder.dimension == stub.dimension
    for text, vector in zip(texts, vectors, strict=True):
        raw = np.array(stub.vector(text or " "))
        assert np.allclose(vector, raw / np.linalg.norm(raw), atol=1e-6)
    assert embedder.name == "litellm:openai/stub-embedding"


@pytest.mark.usefixtures("no_network")
def test_litellm_embedder_discovers_or_checks_the_dimension(stub: StubEmbeddings) -> None:
    probing = stub_embedder(stub)
    assert probing.dimension == stub.dimension  # asked the model once
    assert len(stub.requests) == 1
    wrong = stub_embedder(stub, dimension=1536)
    with pytest.raises(EmbedderError, match="returned 6 dimensions, expected 1536"):
        wrong.embed(["x"])


@pytest.mark.usefixtures("no_network")
def test_litellm_failures_are_typed(stub: StubEmbeddings) -> None:
    stub.fail = True
    with pytest.raises(EmbedderError, match="stub-embedding") as info:
        stub_embedder(stub).embed(["x"])
    assert isinstance(info.value, BackendUnavailableError)
    with pytest.raises(InvalidInputError):
        stub_embedder(stub).embed("bare string")
    with pytest.raises(InvalidInputError):
        LiteLLMEmbedder("")


@pytest.mark.usefixtures("no_network")
def test_litellm_mock_response_path() -> None:
    embedder = LiteLLMEmbedder("text-embedding-3-small", mock_response=[3.0, 4.0])
    assert embedder.embed(["anything"]) == [[0.6, 0.8]]
    assert embedder.dimension == 2
    # litellm's mock answers one vector whatever the input: a count mismatch is caught.
    with pytest.raises(EmbedderError, match="returned 1 vectors for 2 texts"):
        embedder.embed(["one", "two"])
