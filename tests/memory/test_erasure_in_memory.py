"""Deleting means gone from the process's memory too (invariant 8): after forget_user,
delete_session or delete_fact, no cache, memo or view of the process holds the deleted text.

The texts are made at run time from a random token, so only what was stored holds them; another
user's text, stored and read alike, must still be found (the search works). A deleted session's
or fact's text is searched as a phrase: single words stay in the keyword stemmer's memo and JSON
key names in the redactor's (see the README's "What deleting guarantees").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory import Memory
from memory.settings import Settings
from tests.live_objects import holders


def said(*lines: str) -> list[dict[str, str]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": line}
        for n, line in enumerate(lines)
    ]


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data"))
    yield mem
    mem.close()


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex[:12]


def use(memory: Memory, user: str, query: str) -> None:
    """Read the user's data as an agent does: recall, continuation context, facts."""
    memory.recall_relevant(user, query)
    memory.build_continuation_context(user, query)
    memory.get_facts(user)


def test_forget_user_leaves_none_of_their_text_in_the_process(memory: Memory, token: str) -> None:
    memory.set_fact("alice", "nickname", f"quokka{token} the brave")
    memory.end_session(
        "alice", "a1", said(f"I prefer marmoset{token} tea with honey.", "Noted, with honey.")
    )
    memory.set_fact("bob", "nickname", f"wombat{token} the bold")
    memory.end_session("bob", "b1", said(f"I prefer wombat{token} coffee, black.", "Noted."))
    assert memory.flush(60)
    use(memory, "alice", "tea")
    use(memory, "bob", "coffee")
    assert holders(f"marmoset{token} tea"), "the search finds nothing at all: it is broken"

    memory.forget_user("alice")
    assert memory.flush(60)

    assert holders(f"quokka{token} the") == []
    assert holders(f"marmoset{token} tea") == []
    assert holders(f"wombat{token} the"), "bob's fact was read: something holds it"


def test_a_deleted_session_leaves_none_of_its_text_in_the_process(
    memory: Memory, token: str
) -> None:
    memory.end_session("alice", "s1", said(f"I prefer marmoset{token} tea with honey.", "Noted."))
    memory.end_session(
        "alice", "s2", said(f"I prefer axolotl{token} sandwiches, sliced thin.", "Noted.")
    )
    assert memory.flush(60)
    use(memory, "alice", "sandwiches")
    assert holders(f"axolotl{token} sandwiches"), "the search finds nothing at all: it is broken"

    assert memory.delete_session("alice", "s2")
    assert memory.flush(60)

    # Not read again since: what the user's view, memos and decoded facts kept must be gone.
    assert holders(f"axolotl{token} sandwiches") == []
    # The next recall is incremental and finds the other session, not the deleted one.
    assert [
        hit.summary.session_id for hit in memory.recall_relevant("alice", "sandwiches tea")
    ] == ["s1"]


def test_a_deleted_fact_leaves_none_of_its_text_in_the_process(memory: Memory, token: str) -> None:
    memory.set_fact("alice", "pet", f"okapi{token} named Fred")
    memory.set_fact("alice", "tone", f"short{token} and plain")
    use(memory, "alice", "pet")
    assert holders(f"okapi{token} named"), "the search finds nothing at all: it is broken"

    assert memory.delete_fact("alice", "pet")

    # The tombstone in the history keeps the record's key, never its value.
    assert holders(f"okapi{token} named") == []
    assert [fact.key for fact in memory.get_facts("alice")] == ["tone"]
