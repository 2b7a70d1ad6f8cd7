"""Realistic agent chat-state checkpoints for the benches, deterministic for a given generator.

One shape, the peers harness's (``/work/shared/peers/common.py``, issue 16): a
run's id and step, messages that grow with the step (2 + step, at most 24),
two tool results and an effect log of dicts with an ``idempotency_key``
(1 + step entries, at most 10). The benches that measure on it differ in the
proportions and vocabularies they were first written with, and their figures
depend on the exact bytes: :class:`ChatShape` and :class:`Vocabulary` hold
those differences as parameters, so each bench keeps its payloads byte for
byte.
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Vocabulary:
    """The words a payload's text is drawn from, uniformly or with cumulative weights."""

    words: Sequence[str]
    cum_weights: Sequence[float] | None = None

    @classmethod
    def zipf(cls, rng: random.Random, count: int = 4000) -> Vocabulary:
        """``count`` pseudo-words of 2 to 10 letters drawn from ``rng``, Zipf-like weights.

        The peers harness's vocabulary: text from it compresses roughly like
        English prose rather than like one repeated word.
        """
        letters = string.ascii_lowercase
        words = [
            "".join(rng.choice(letters) for _ in range(rng.randint(2, 10))) for _ in range(count)
        ]
        # Cumulative, as random.choices would make them from the weights on every call.
        weights = itertools.accumulate(1.0 / (i + 1) ** 0.9 for i in range(count))
        return cls(words, list(weights))

    def text(self, rng: random.Random, length: int) -> str:
        """``length`` characters of space-separated words drawn from ``rng``."""
        words = rng.choices(self.words, cum_weights=self.cum_weights, k=length // 6 + 1)
        return " ".join(words)[:length]


@dataclass(frozen=True)
class ChatShape:
    """The proportions of a chat-state checkpoint, and what its choices are drawn from.

    Attributes:
        message_share: The part of the size the messages' text takes, all messages together.
        tool_share: The part of the size each of the two tool outputs takes.
        tools: The tool names a result is drawn from; a single name is used without a draw.
        effects: The effect names an effect-log entry is drawn from.
        parent_link: Whether the state names its parent checkpoint (``parent_id``).
    """

    message_share: float
    tool_share: float
    tools: Sequence[str]
    effects: Sequence[str]
    parent_link: bool

    def state(
        self, rng: random.Random, vocabulary: Vocabulary, run_id: str, step: int, size: int = 5000
    ) -> dict[str, object]:
        """A checkpoint of about ``size`` JSON bytes at ``step`` of run ``run_id``.

        Every random choice comes from ``rng``, in the order of the keys, so
        the same generator state gives the same bytes.
        """
        messages = min(2 + step, 24)
        per_message = int(size * self.message_share / messages)
        head: dict[str, object] = {"run_id": run_id, "seq": step}
        if self.parent_link:
            head["parent_id"] = f"{run_id}:{step - 1:06d}" if step else None
        return {
            **head,
            "status": "committed",
            "messages": [
                {
                    "id": f"m{step}-{i}",
                    "role": ("user", "assistant", "tool")[i % 3],
                    "content": vocabulary.text(rng, per_message),
                }
                for i in range(messages)
            ],
            "tool_results": [
                {
                    "call_id": f"call-{step}-{i}",
                    "tool": self._tool(rng),
                    "output": vocabulary.text(rng, int(size * self.tool_share)),
                }
                for i in range(2)
            ],
            "effect_log": [
                {
                    "idempotency_key": f"{run_id}-eff-{step}-{i}-{rng.getrandbits(64):016x}",
                    "effect": rng.choice(self.effects),
                    "status": "done",
                    "ts": 1.7e9 + step * 10 + i,
                }
                for i in range(min(1 + step, 10))
            ],
        }

    def _tool(self, rng: random.Random) -> str:
        # A choice among one still consumes the generator: a single tool is not drawn, so the
        # benches written with a fixed tool name keep the rest of their random stream.
        return self.tools[0] if len(self.tools) == 1 else rng.choice(self.tools)
