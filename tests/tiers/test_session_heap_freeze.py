"""A process's first recall keeps the heap alive then out of later full GC scans (issue 19 item 2).

See :func:`tiers.session._reads.freeze_long_lived`: once per process, after the
first recall, what is alive is collected and frozen (:func:`gc.freeze`), so a
full collection during a later query walks only what was made since. Checked in
a fresh process (this one's first recall happened in some earlier test), with
real parts: SQLite, embedded Chroma, the MiniLM model.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from tiers.session._reads import freeze_long_lived

FIRST_RECALLS = """
import gc, json, sys
from pathlib import Path
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.session import SessionSummary, SessionTier

root = Path(sys.argv[1])
embedder = MiniLMEmbedder()
kv = SqliteKVStore(root / "kv.sqlite3")
index = ChromaVectorIndex(root / "chroma", embedder=embedder)
tier = SessionTier(kv, index, embedder)
tier.save_session(SessionSummary(session_id="s1", user_id="u", task_description="ferry to Zanzibar"))
tier.save_session(SessionSummary(session_id="s2", user_id="u", task_description="tax forms"))
out = {"before": gc.get_freeze_count()}
out["empty_user"] = [h.summary.session_id for h in tier.recall_relevant("nobody", "ferry")]
out["after_empty_user"] = gc.get_freeze_count()
out["first"] = [h.summary.session_id for h in tier.recall_relevant("u", "ferry", top_k=2)]
out["after_first"] = gc.get_freeze_count()
garbage = [[]]
garbage[0].append(garbage)  # a cycle made after the freeze: still collected
del garbage
out["second"] = [h.summary.session_id for h in tier.recall_relevant("u", "ferry", top_k=2)]
out["after_second"] = gc.get_freeze_count()
out["collected"] = gc.collect()
tier.close()
index.close()
kv.close()
print(json.dumps(out))
"""


def test_the_first_recall_of_a_process_freezes_the_heap_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FIRST_RECALLS, str(tmp_path)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == 0
    # A user with no sessions embeds nothing and loads nothing: no freeze yet.
    assert out["empty_user"] == []
    assert out["after_empty_user"] == 0
    assert out["first"] == ["s1", "s2"]
    assert out["after_first"] > 0
    # Later recalls rank the same and freeze nothing more; new cycles are still collected.
    assert out["second"] == out["first"]
    assert out["after_second"] == out["after_first"]
    assert out["collected"] >= 2


def test_freezing_happens_once_per_process() -> None:
    freeze_long_lived()  # whether a recall of an earlier test did it or this call does
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert freeze_long_lived() is False
    assert gc.get_freeze_count() == frozen
