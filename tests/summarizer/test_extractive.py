"""ExtractiveSummarizer and parse_transcript on real dialogue.

Hand-written multi-turn transcripts (support refund, coding help, trip
planning) pin specific extractions; public LoCoMo dev sessions, when present
on this machine, check structural properties on dialogue we did not write.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from summarizer import (
    ExtractiveSummarizer,
    InvalidTranscriptError,
    LiteLLMSummarizer,
    Summarization,
    Summarizer,
    parse_transcript,
)
from summarizer.extractive import extract_facts, is_filler, split_sentences
from tiers.errors import InvalidInputError
from tiers.ids import ID_PATTERN
from tiers.models import Message

pytestmark = pytest.mark.usefixtures("no_network")

WHEN = datetime(2025, 3, 14, 9, 30, tzinfo=UTC)
LOCOMO = Path("/work/shared/data/recall-dev/locomo.sessions.jsonl")

# --------------------------------------------------------------------------- transcripts

REFUND = [
    {"role": "system", "content": "You are a support agent for Brightline Home. Be concise."},
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello! How can I help you today?"},
    {
        "role": "user",
        "content": (
            "I ordered a Vortex 900 blender last week (order #48213) and it arrived with a "
            "cracked jar. I'd like a refund please, not a replacement. My name is Dana Whitfield."
        ),
    },
    {
        "role": "assistant",
        "content": (
            "I'm sorry about that, Dana. I can see order #48213 for $129.99, delivered on "
            "Mar. 3. Could you send a photo of the damage?"
        ),
    },
    {
        "role": "user",
        "content": (
            "Sure, I just uploaded it to the ticket. Also, do I need to ship the blender back? "
            "And will the refund go to my Visa or store credit?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Thanks, I've got the photo. No need to ship it back: the damage is clear from the "
            "photo. Since you prefer a refund, we'll go with a full refund to the original Visa "
            "card instead of store credit. I've issued the refund of $129.99 and emailed you a "
            "confirmation. It should appear on your statement within 5-7 business days."
        ),
    },
    {
        "role": "user",
        "content": (
            "Great, thank you. I prefer email over phone calls for any follow-ups. "
            "What happens if it doesn't show up by next Friday?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Good question, I'm not sure what the bank's cutoff is. If it isn't there by next "
            "Friday, reply to the confirmation email and we will escalate it with the payments "
            "team. Is there anything else I can help you with?"
        ),
    },
    {"role": "user", "content": "No, that's all. Thanks so much!"},
]

CODING = [
    {
        "role": "user",
        "content": (
            "Hey. I'm trying to speed up a Python script that parses 2 GB of CSV logs; it takes "
            "about 40 minutes right now. Can you help me profile it and find the bottleneck?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Sure. Run it under cProfile first:\n\n```bash\npython -m cProfile -o out.prof "
            "parse_logs.py\n```\n\nThen open out.prof with snakeviz and look at cumulative time."
        ),
    },
    {
        "role": "user",
        "content": (
            "Done. About 70% of the time is in `datetime.strptime`, called once per row. "
            "Should I switch to pandas?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Pandas would work, but it is a big dependency for one script. Let's use "
            "`datetime.fromisoformat` instead of `strptime`, since your timestamps are ISO 8601; "
            "it is roughly 10x faster. I've rewritten the `parse_row` function:\n\n"
            "```python\ndef parse_row(row):\n    ts = datetime.fromisoformat(row[0])\n"
            "    return ts, row[1]\n```\n\n"
            "I also replaced the list of rows with a generator, so memory stays flat."
        ),
    },
    {
        "role": "user",
        "content": (
            "Wow, it's down to 6 minutes. I always use type hints, by the way, so please add "
            "them. I'm still not sure whether we should parallelise it across files though."
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Nice speed-up! I've added type hints to `parse_row` and `main`. "
            "Next, you should add a regression test with a 1,000-row sample file so the speed-up "
            "doesn't silently break. We can revisit multiprocessing tomorrow once you've measured "
            "how many files a typical run reads."
        ),
    },
    {
        "role": "user",
        "content": "Sounds good. How many worker processes would make sense on a 4-core box?",
    },
]

TRIP = [
    {
        "role": "user",
        "content": (
            "Good morning! My partner and I are going to Japan for 10 days in April. "
            "Can you help us plan an itinerary? We land in Tokyo on April 3."
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Happy to help! A classic route is Tokyo, Hakone, Kyoto and Osaka. How do you feel "
            "about fast-paced city days versus slower days in nature?"
        ),
    },
    {
        "role": "user",
        "content": (
            "We love hiking and hate crowded tourist traps. I'm vegetarian, and I'm allergic to "
            "shellfish, so food tips need to respect that. I live in Toronto, so jet lag will be "
            "rough on day one."
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Got it. Then let's go with 3 nights in Tokyo, 2 in Hakone and 5 in Kyoto, with a "
            "day trip to Nara instead of staying in Osaka. I've drafted a day-by-day plan with a "
            "light first day in Tokyo and the Kumano-style trail walks near Kyoto. "
            "Shojin ryori (Buddhist temple cuisine) is fully vegetarian and a great fit."
        ),
    },
    {
        "role": "user",
        "content": (
            "Perfect. We decided to get the 7-day JR Pass. I haven't decided yet whether to book "
            "a ryokan in Hakone or a regular hotel. Which is better value?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "A ryokan with dinner included is usually better value in Hakone, around ¥25,000 "
            "per person per night. You should book it soon, since April is cherry blossom season. "
            "Next, reserve the JR Pass online before you fly and activate it on day 4."
        ),
    },
    {
        "role": "user",
        "content": "Will do. Remind me to check the cherry blossom forecast a week before we go.",
    },
]

REFUND_PREFIX_REPEATS = [
    {"role": "user", "content": "Please cancel my gym membership, it renews on the 1st."},
    {
        "role": "assistant",
        "content": "I've cancelled your membership. Your last charge was Feb. 1.",
    },
    {"role": "user", "content": "Thanks. Did it really go through?"},
    {"role": "assistant", "content": "Yes, I've cancelled your membership, effective today."},
]


def summarize(transcript: list[dict[str, Any]], **options: Any) -> Summarization:
    return ExtractiveSummarizer(**options).summarize(
        transcript, user_id="dana", session_id="sess-1", created_at=WHEN
    )


def fact_values(result: Summarization) -> dict[str, Any]:
    return {fact.key: fact.value for fact in result.facts}


def normalized(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- hand-written dialogue


def test_refund_session() -> None:
    result = summarize(REFUND)
    summary = result.summary
    assert summary.user_id == "dana"
    assert summary.session_id == "sess-1"
    assert summary.created_at == WHEN
    assert result.usage is None
    # The request, not the greeting.
    assert summary.task_description.startswith("I ordered a Vortex 900 blender")
    assert "I'd like a refund please" in summary.task_description
    assert "Hi there" not in summary.task_description
    assert any("we'll go with a full refund" in d for d in summary.decisions_made)
    assert any(d.startswith("No need to ship it back") for d in summary.decisions_made)
    assert any("I've issued the refund of $129.99" in w for w in summary.work_completed)
    # The user's order last week is context, not work done in this session.
    assert not any("I ordered" in w for w in summary.work_completed)
    assert "What happens if it doesn't show up by next Friday?" in summary.open_questions
    # Both asked in one turn and answered in the next one.
    assert not any("ship the blender back" in q for q in summary.open_questions)
    assert not any("Visa or store credit" in q for q in summary.open_questions)
    assert not any("anything else" in q.lower() for q in summary.open_questions)
    assert any("we will escalate it" in n for n in summary.next_recommended_steps)
    facts = fact_values(result)
    assert facts["name"] == "Dana Whitfield"
    assert facts["preference.email"] == "prefers email over phone calls for any follow-ups"
    assert {f.key: f.evidence for f in result.facts}["name"] == "My name is Dana Whitfield."


def test_coding_session() -> None:
    result = summarize(CODING)
    summary = result.summary
    assert "speed up a Python script" in summary.task_description
    assert "Can you help me profile it" in summary.task_description
    assert summary.decisions_made == [
        "Let's use `datetime.fromisoformat` instead of `strptime`, since your timestamps are "
        "ISO 8601; it is roughly 10x faster."
    ]
    assert "I've added type hints to `parse_row` and `main`." in summary.work_completed
    assert any(
        w.startswith("I've rewritten the `parse_row` function") for w in summary.work_completed
    )
    assert any("replaced the list of rows with a generator" in w for w in summary.work_completed)
    assert summary.open_questions == [
        "I'm still not sure whether we should parallelise it across files though.",
        "How many worker processes would make sense on a 4-core box?",
    ]
    assert any(
        n.startswith("Next, you should add a regression test")
        for n in summary.next_recommended_steps
    )
    assert any("revisit multiprocessing tomorrow" in n for n in summary.next_recommended_steps)
    # Early instructions the user already carried out ("Done.") are not next steps.
    assert not any("cProfile" in n for n in summary.next_recommended_steps)
    everything = " ".join(
        summary.decisions_made
        + summary.work_completed
        + summary.open_questions
        + summary.next_recommended_steps
    )
    assert "def parse_row" not in everything  # code blocks are not sentences
    assert fact_values(result) == {"preference.use_type_hints": "always use type hints"}


def test_trip_planning_session() -> None:
    result = summarize(TRIP)
    summary = result.summary
    assert summary.task_description == (
        "My partner and I are going to Japan for 10 days in April. "
        "Can you help us plan an itinerary?"
    )
    assert len(summary.decisions_made) == 2
    assert summary.decisions_made[0].startswith("Then let's go with 3 nights in Tokyo")
    assert summary.decisions_made[1] == "We decided to get the 7-day JR Pass."
    assert summary.work_completed == [
        "I've drafted a day-by-day plan with a light first day in Tokyo and the Kumano-style "
        "trail walks near Kyoto."
    ]
    assert summary.open_questions == [
        "I haven't decided yet whether to book a ryokan in Hakone or a regular hotel."
    ]
    assert summary.next_recommended_steps[-1] == (
        "Remind me to check the cherry blossom forecast a week before we go."
    )
    assert "You should book it soon, since April is cherry blossom season." in (
        summary.next_recommended_steps
    )
    # The user describing themselves is a fact, not a plan.
    assert not any("Toronto" in n for n in summary.next_recommended_steps)
    assert fact_values(result) == {
        "preference.hiking": "loves hiking",
        "preference.crowded_tourist_traps": "dislikes crowded tourist traps",
        "allergy.shellfish": "shellfish",
        "diet": "vegetarian",
        "location": "Toronto",
    }


@pytest.mark.parametrize("transcript", [REFUND, CODING, TRIP], ids=["refund", "coding", "trip"])
def test_items_are_sentences_of_the_transcript(transcript: list[dict[str, Any]]) -> None:
    summary = summarize(transcript).summary
    text = normalized(" ".join(m["content"] for m in transcript))
    for item in (
        summary.decisions_made
        + summary.work_completed
        + summary.open_questions
        + summary.next_recommended_steps
    ):
        assert item in text


def test_deterministic() -> None:
    first = [summarize(t).model_dump() for t in (REFUND, CODING, TRIP)]
    second = [summarize(t).model_dump() for t in (REFUND, CODING, TRIP)]
    assert first == second


def test_caps_and_clipping() -> None:
    result = summarize(TRIP, max_items=1, max_item_chars=40, max_task_chars=50)
    summary = result.summary
    assert len(summary.task_description) <= 50
    for items in (summary.decisions_made, summary.next_recommended_steps):
        assert len(items) == 1
        assert len(items[0]) <= 40
    # The cap keeps the latest next step; clipped items end with an ellipsis.
    assert summary.next_recommended_steps[0].startswith("Remind me to check")
    assert summary.next_recommended_steps[0].endswith("…")
    assert summary.decisions_made == ["We decided to get the 7-day JR Pass."]  # short enough


def test_near_duplicates_are_merged() -> None:
    summary = summarize(REFUND_PREFIX_REPEATS).summary
    assert summary.work_completed == ["Yes, I've cancelled your membership, effective today."]
    assert summary.task_description == "Please cancel my gym membership, it renews on the 1st."


def test_greeting_only_first_turns_are_skipped() -> None:
    transcript = [
        {"role": "user", "content": "Hey! Good morning."},
        {"role": "assistant", "content": "Good morning! How can I help you today?"},
        {"role": "user", "content": "My laptop won't turn on after the update. Any ideas?"},
        {"role": "assistant", "content": "Hold the power button for 30 seconds, then try again."},
    ]
    summary = summarize(transcript).summary
    assert summary.task_description == "My laptop won't turn on after the update. Any ideas?"


def test_unanswered_question_at_the_end_is_open() -> None:
    transcript = [
        {"role": "user", "content": "Can you draft a polite reminder email to my landlord?"},
        {
            "role": "assistant",
            "content": "Here is a draft: Dear Mr. Patel, the heating is still broken.",
        },
        {"role": "user", "content": "Should I mention the lease clause about repairs?"},
    ]
    summary = summarize(transcript).summary
    assert summary.open_questions == ["Should I mention the lease clause about repairs?"]
    assert summary.work_completed == [
        "Here is a draft: Dear Mr. Patel, the heating is still broken."
    ]


def test_deferred_answer_leaves_the_question_open() -> None:
    transcript = [
        {"role": "user", "content": "Does the warranty cover water damage on the X200?"},
        {"role": "assistant", "content": "I'm not sure, let me check with the warranty team."},
    ]
    summary = summarize(transcript).summary
    assert "Does the warranty cover water damage on the X200?" in summary.open_questions


def test_system_and_tool_messages_are_not_the_conversation() -> None:
    transcript = [
        {"role": "system", "content": "You must always decided to go with the cheapest option."},
        {"role": "user", "content": "I need a flight from Oslo to Rome on May 2."},
        {"role": "tool", "content": "Issued ticket 4411. Next step: send receipt."},
        {"role": "assistant", "content": "I've booked the 9:40 a.m. SAS flight for you."},
    ]
    summary = summarize(transcript).summary
    assert summary.decisions_made == []
    assert summary.work_completed == ["I've booked the 9:40 a.m. SAS flight for you."]
    assert summary.task_description == "I need a flight from Oslo to Rome on May 2."


# --------------------------------------------------------------------------- facts


def facts_of(*user_lines: str, role: str = "user") -> dict[str, Any]:
    messages = [Message.model_validate({"role": role, "content": line}) for line in user_lines]
    return {fact.key: fact.value for fact in extract_facts(messages)}


def test_fact_patterns() -> None:
    facts = facts_of(
        "Hi, my name is Priya Raman and I live in San Francisco, California.",
        "I work as a data engineer at a fintech startup.",
        "I'm severely allergic to peanuts.",
        "Please call me Pri.",
        "I'm from Pune originally.",
        "I work for Stripe.",
        "My favorite cuisine is Ethiopian.",
        "Never book red-eye flights for me.",
        "I really don't like window seats.",
    )
    assert facts == {
        "name": "Priya Raman",
        "location": "San Francisco, California",
        "occupation": "data engineer at a fintech startup",
        "allergy.peanuts": "peanuts",
        "preferred_name": "Pri",
        "hometown": "Pune",
        "employer": "Stripe",
        "preference.favorite_cuisine": "Ethiopian",
        "preference.book_red_eye_flights": "never book red-eye flights for me",
        "preference.window_seats": "dislikes window seats",
    }


def test_fact_false_positives_are_ignored() -> None:
    assert (
        facts_of(
            "I'd like a refund for order 1234.",
            "I like that idea!",
            "I love it.",
            "Do I prefer aisle seats?",
            "I don't live in Boston anymore.",
            "Call me back tomorrow please.",
            "I'm not allergic to anything.",
        )
        == {}
    )


def test_facts_come_from_the_user_only() -> None:
    assert facts_of("My name is Aria and I love helping people.", role="assistant") == {}


def test_later_statement_wins() -> None:
    facts = facts_of("I live in Lyon.", "Actually, I just moved to Paris.")
    assert facts == {"location": "Paris"}


def test_fact_keys_are_valid_ids() -> None:
    facts = facts_of(
        "I love Café Crème & croissants!!",
        "I prefer 4K/HDR monitors over 1080p ones.",
        "I'm allergic to ???",
    )
    assert facts == {
        "preference.cafe_creme_croissants": "loves Café Crème & croissants",
        "preference.4k_hdr_monitors": "prefers 4K/HDR monitors over 1080p ones",
    }
    for key in facts:
        assert ID_PATTERN.fullmatch(key), key


def test_curly_apostrophes_are_read_like_straight_ones() -> None:
    transcript = [
        {"role": "user", "content": "I’m allergic to sesame. Can you suggest a dinner spot?"},
        {"role": "assistant", "content": "Let’s go with Nori House. I’ve booked a table at 7."},
    ]
    result = summarize(transcript)
    assert result.summary.decisions_made == ["Let’s go with Nori House."]
    assert result.summary.work_completed == ["I’ve booked a table at 7."]
    (fact,) = result.facts
    assert (fact.key, fact.value, fact.evidence) == (
        "allergy.sesame",
        "sesame",
        "I’m allergic to sesame.",
    )


# --------------------------------------------------------------------------- sentences


def test_split_sentences_handles_abbreviations_and_decimals() -> None:
    text = "Dr. Smith arrived at 3.30 p.m. on Jan. 5. Then we paid $49.99. See No. 5, e.g. Visa. I said no. Done!"
    assert split_sentences(text) == [
        "Dr. Smith arrived at 3.30 p.m. on Jan. 5.",
        "Then we paid $49.99.",
        "See No. 5, e.g. Visa.",
        "I said no.",
        "Done!",
    ]


def test_split_sentences_drops_code_and_splits_bullets() -> None:
    text = (
        "Here is the plan:\n- Book the hotel.\n- Buy JR passes\n\n"
        "```python\nx = compute(1.5)\nprint(x)\n```\nAfter that, rest.\nA wrapped\nline."
    )
    assert split_sentences(text) == [
        "Here is the plan:",
        "Book the hotel.",
        "Buy JR passes",
        "After that, rest.",
        "A wrapped line.",
    ]


@pytest.mark.parametrize(
    ("sentence", "filler"),
    [
        ("Hi there!", True),
        ("Thanks so much for your help!", True),
        ("Hey Andrew, how's it going?", True),
        ("Take care and have a good one!", True),
        ("Is there anything else I can help you with?", True),
        ("Thanks, I need a refund for my order.", False),
        ("Hey, the build fails on Windows.", False),
    ],
)
def test_filler(sentence: str, filler: bool) -> None:
    assert is_filler(sentence) is filler


# --------------------------------------------------------------------------- transcript validation


def test_parse_transcript_accepts_messages_and_content_parts() -> None:
    messages = parse_transcript(
        [
            Message(role="user", content="Hello"),
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this photo?"},
                    {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
                    {"type": "text", "text": "Be brief."},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "1", "function": {"name": "look", "arguments": "{}"}}],
            },
            {"role": "developer", "content": "Be nice.", "name": "ops"},
        ]
    )
    assert [m.role for m in messages] == ["user", "user", "assistant", "system"]
    assert messages[1].content == "What is in this photo?\nBe brief."
    assert messages[2].content == ""
    assert [(c.id, c.name) for c in messages[2].tool_calls] == [("1", "look")]
    assert messages[1].attachments == ("image",)  # noted, not dropped silently
    assert messages[3].name == "ops"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "transcript"),
        ("hello", "transcript"),
        ({"role": "user", "content": "hi"}, "transcript"),
        ([{"role": "user", "content": "ok"}, "oops"], "transcript[1]"),
        ([{"content": "no role"}], "transcript[0].role"),
        (
            [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
            "transcript[1].role",
        ),
        ([{"role": "user"}], "transcript[0].content"),
        ([{"role": "user", "content": 42}], "transcript[0].content"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 7}]}],
            "transcript[0].content[0].text",
        ),
        ([{"role": "user", "content": [3]}], "transcript[0].content[0]"),
        ([{"role": "user", "content": "x" * 200_001}], "transcript[0].content"),
        ([{"role": "user", "content": "hi", "name": 5}], "transcript[0].name"),
    ],
)
def test_parse_transcript_names_the_bad_field(raw: object, field: str) -> None:
    with pytest.raises(InvalidTranscriptError) as info:
        parse_transcript(raw)
    assert info.value.field == field
    assert field in str(info.value)


def test_summarize_rejects_bad_input_before_work() -> None:
    summarizer = ExtractiveSummarizer()
    with pytest.raises(InvalidTranscriptError, match=r"transcript\[0\]\.role"):
        summarizer.summarize([{"role": "bot", "content": "x"}], user_id="u", session_id="s")
    with pytest.raises(InvalidInputError, match="user_id"):
        summarizer.summarize(REFUND, user_id="a:b", session_id="s")
    with pytest.raises(InvalidInputError, match="session_id"):
        summarizer.summarize(REFUND, user_id="u", session_id="")


def test_both_summarizers_meet_the_protocol() -> None:
    assert isinstance(ExtractiveSummarizer(), Summarizer)
    assert isinstance(LiteLLMSummarizer("gpt-4o-mini"), Summarizer)
    assert ExtractiveSummarizer().name == "extractive"


# --------------------------------------------------------------------------- LoCoMo (public data)

LOCOMO_PICKS = [0, 7, 19, 30, 44, 58, 71, 82]


def locomo_sessions() -> list[Any]:
    if not LOCOMO.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{LOCOMO} not present"))]
    lines = LOCOMO.read_text(encoding="utf-8").splitlines()
    picks = [json.loads(lines[i]) for i in LOCOMO_PICKS if i < len(lines)]
    return [pytest.param(s, id=f"{s['user_id']}-{s['session_id']}") for s in picks]


def as_transcript(session: dict[str, Any]) -> list[dict[str, str]]:
    """Two people talking: the first speaker plays the user, the other the assistant."""
    first = session["turns"][0]["speaker"]
    return [
        {"role": "user" if turn["speaker"] == first else "assistant", "content": turn["text"]}
        for turn in session["turns"]
    ]


@pytest.mark.parametrize("session", locomo_sessions())
def test_locomo_structure(session: dict[str, Any]) -> None:
    transcript = as_transcript(session)
    summarizer = ExtractiveSummarizer()
    result = summarizer.summarize(
        transcript, user_id="locomo-user", session_id=session["session_id"], created_at=WHEN
    )
    summary = result.summary
    text = normalized(" ".join(t["content"] for t in transcript))
    user_text = normalized(" ".join(t["content"] for t in transcript if t["role"] == "user"))
    assert summary.task_description
    assert len(summary.task_description) <= 300
    assert not is_filler(summary.task_description)
    for items in (
        summary.decisions_made,
        summary.work_completed,
        summary.open_questions,
        summary.next_recommended_steps,
    ):
        assert len(items) <= 8
        assert len(set(items)) == len(items)
        for item in items:
            assert len(item) <= 300
            assert item.removesuffix("…") in text
            assert not is_filler(item)
    for sentence in split_sentences(summary.task_description.removesuffix("…")):
        assert sentence in text
    for fact in result.facts:
        assert ID_PATTERN.fullmatch(fact.key)
        assert 0.6 <= fact.confidence <= 0.8
        assert fact.evidence.removesuffix("…") in user_text
    again = summarizer.summarize(
        transcript, user_id="locomo-user", session_id=session["session_id"], created_at=WHEN
    )
    assert again == result


def test_locomo_sessions_yield_content() -> None:
    if not LOCOMO.exists():
        pytest.skip(f"{LOCOMO} not present")
    summarizer = ExtractiveSummarizer()
    lines = LOCOMO.read_text(encoding="utf-8").splitlines()
    non_empty = 0
    for line in lines[:20]:
        summary = summarizer.summarize(
            as_transcript(json.loads(line)), user_id="u", session_id="s"
        ).summary
        lists = summary.open_questions + summary.next_recommended_steps + summary.decisions_made
        non_empty += bool(lists)
    # Casual chat has fewer decisions than agent sessions, but most sessions say something.
    assert non_empty >= 15
