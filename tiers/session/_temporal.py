"""Dates in recall queries: "yesterday", "two months ago", "last March", "on 7 May 2023".

:func:`parse_query` finds the time expressions of a query and turns each
into a :class:`TimeWindow` relative to the time the query is asked; recall
then boosts the sessions whose time falls in (or near) one of them
(:func:`date_match`, used by :mod:`tiers.session._recall`). A query without
a time expression has no window and its ranking is unchanged.

The parser is a few focused regular expressions, offline and English only.
It reads what people write to an assistant about their own past:

- absolute: ISO dates (``2023-05-07``), ``7 May 2023``, ``May 7th``,
  ``October 24, 2023``, ``May 2023``, ``in 2022``;
- a month named after a preposition (``in March``, ``last March``, ``from
  July to October``): the latest such month not after the query (``last
  March`` asked in March is a year back);
- relative to the query: ``today``, ``yesterday``, ``N days/weeks/months/years
  ago`` (``a few``, ``a couple of`` and number words too), ``last/past N
  weeks``, ``last week/month/year/weekend``, ``this week/month/year``,
  ``last Saturday``.

Words that are also dates only in context ("may", "march") count only next
to a preposition, a day or a year; "last time" or "the past" alone are not
dates. Times are UTC calendar days.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

__all__ = ["DatedQuery", "TimeWindow", "date_match", "parse_query"]

_SECONDS_PER_DAY = 86_400.0

_MONTHS = {
    name: number
    for number, name in enumerate(
        (
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ),
        start=1,
    )
}
_WEEKDAYS = {
    name: number
    for number, name in enumerate(
        ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
    )
}
_NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a couple of": 2,
    "a couple": 2,
    "couple of": 2,
    "a few": 3,
    "few": 3,
    "several": 3,
}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}

_MONTH = r"(?P<month>" + "|".join(_MONTHS) + r")"
_LAST_MONTH = r"(?P<last_month>" + "|".join(_MONTHS) + r")"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_COUNT = r"(?P<count>\d{1,3}|" + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True)) + r")"
_WEEKDAY = r"(?P<weekday>" + "|".join(_WEEKDAYS) + r")"
_UNIT = r"(?P<unit>day|week|month|year)s?"
# A bare month name followed by one of these is a verb ("and may I ask"), not a date.
_NOT_A_MONTH = r"(?!\s+(?:i|we|you|he|she|they|it|be|have|not)\b)"
# Words after which a bare month name is a date ("in May"), not a verb ("may I").
_MONTH_CUES = (
    r"in|last|this|during|of|since|early|late|mid|from|to|and|or|until|till|by|before|after|"
    r"through|between|around|past|previous"
)

# Tried in order; a match consumes its text, so "7 May 2023" is one day, not a day and a month.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        ("iso", r"\b(?P<year>(?:19|20)\d\d)[-/](?P<month>[01]?\d)[-/](?P<day>[0-3]?\d)\b"),
        ("day", rf"\b{_DAY}(?:\s+of)?\s+{_MONTH}\b(?:,?\s+{_YEAR}\b)?"),
        ("day", rf"\b{_MONTH}\s+{_DAY}\b(?!\s*:)(?:,?\s+{_YEAR}\b)?"),
        ("month", rf"\b{_MONTH},?\s+{_YEAR}\b"),
        ("months", rf"\b(?:from|between)\s+{_MONTH}\s+(?:to|and|until|through)\s+{_LAST_MONTH}\b"),
        ("month", rf"\b{_MONTH}(?=\s+(?:and|or|to|through|until)\s+{_LAST_MONTH}\b)"),
        (
            "month",
            rf"\b(?P<cue>{_MONTH_CUES})\s+(?:the\s+(?:month\s+of\s+)?)?{_MONTH}\b{_NOT_A_MONTH}",
        ),
        ("year", rf"\b(?:in|of|during|since|for|from|to|and)\s+{_YEAR}\b"),
        ("ago", rf"\b{_COUNT}\s+{_UNIT}\s+(?:ago|back|earlier)\b"),
        ("span", rf"\b(?:last|past|previous)\s+{_COUNT}\s+{_UNIT}\b"),
        ("weekday", rf"\b(?P<cue>last|this|on|past)\s+{_WEEKDAY}\b"),
        ("period", r"\b(?P<cue>last|past|previous|this)\s+(?P<unit>week|weekend|month|year)\b"),
        ("yesterday", r"\b(?:the\s+day\s+before\s+)?yesterday\b"),
        ("today", r"\b(?:today|tonight|this\s+morning|this\s+evening|earlier\s+today)\b"),
    )
)


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """A span of time a query asks about, as POSIX timestamps.

    Attributes:
        start: First second of the span.
        end: First second after it.
    """

    start: float
    end: float

    @classmethod
    def of_days(cls, first: date, last: date) -> TimeWindow:
        """The UTC calendar days from ``first`` to ``last``, both included."""
        start = datetime(first.year, first.month, first.day, tzinfo=UTC)
        end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
        return cls(start.timestamp(), end.timestamp())


@dataclass(frozen=True, slots=True)
class DatedQuery:
    """A query split into the times it names and the rest of its words.

    Attributes:
        windows: The times the query names (empty: none).
        rest: The query with those time expressions blanked out: what to
            match by keyword, so "last" in "last March" does not favour every
            session that says "last".
    """

    windows: list[TimeWindow]
    rest: str


def parse_query(query: str, now: datetime) -> DatedQuery:
    """Find the time expressions of ``query``, as windows relative to ``now``.

    Args:
        query: The recall query.
        now: When the query is asked (timezone-aware; naive is taken as UTC).
    """
    today = (now if now.tzinfo else now.replace(tzinfo=UTC)).astimezone(UTC).date()
    text = query
    windows: list[TimeWindow] = []
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            window = _window(kind, match, today)
            if window is not None:
                windows.append(window)
        # Blank out what matched so a later, looser pattern does not read it again.
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return DatedQuery(windows, text if windows else query)


def date_match(created_at: float, windows: list[TimeWindow]) -> float:
    """How well a session's time fits the windows: 1 inside one, falling to 0 away from them.

    A session just after a window still counts for much: people tell of an
    event in a session a few days later ("I went rafting last weekend").
    The falloff grows with the window (a day: a few days; a month: a couple
    of weeks), so a coarse question is not decided by a day either way.

    Args:
        created_at: The session's time, a POSIX timestamp.
        windows: The query's windows; none gives 0.
    """
    best = 0.0
    for window in windows:
        width_days = (window.end - window.start) / _SECONDS_PER_DAY
        before = max(1.0, 0.25 * width_days)
        after = max(3.0, 0.5 * width_days)
        if created_at < window.start:
            fit = 1.0 - (window.start - created_at) / _SECONDS_PER_DAY / before
        elif created_at >= window.end:
            fit = 1.0 - (created_at - window.end) / _SECONDS_PER_DAY / after
        else:
            return 1.0
        best = max(best, fit)
    return best


def _window(kind: str, match: re.Match[str], today: date) -> TimeWindow | None:
    """The window of one matched expression, or ``None`` when it is no real date."""
    groups = match.groupdict()
    if kind in ("iso", "day"):
        month = _month_number(groups["month"])
        year = int(groups["year"]) if groups.get("year") else None
        return _day_window(year, month, int(groups["day"]), today)
    if kind == "month":
        month = _month_number(groups["month"])
        if groups.get("year"):
            return _month_window(int(groups["year"]), month)
        cue = (groups.get("cue") or "").lower()
        year = today.year if month <= today.month else today.year - 1
        if cue in ("last", "previous", "past") and month == today.month:
            year -= 1
        return _month_window(year, month)
    if kind == "months":
        first = _month_number(groups["month"])
        last = _month_number(groups["last_month"])
        # Both months are the latest ones not after today, the first one before the last.
        last_year = today.year if last <= today.month else today.year - 1
        first_year = last_year if first <= last else last_year - 1
        start = _month_window(first_year, first).start
        return TimeWindow(start, _month_window(last_year, last).end)
    if kind == "year":
        year = int(groups["year"])
        return TimeWindow.of_days(date(year, 1, 1), date(year, 12, 31))
    if kind == "ago":
        days = _count(groups["count"]) * _UNIT_DAYS[groups["unit"].lower()]
        # "Two months ago" is rarely exact: a window as wide as half a unit each side.
        half = _UNIT_DAYS[groups["unit"].lower()] // 2
        center = today - timedelta(days=days)
        return TimeWindow.of_days(center - timedelta(days=half), center + timedelta(days=half))
    if kind == "span":
        days = _count(groups["count"]) * _UNIT_DAYS[groups["unit"].lower()]
        return TimeWindow.of_days(today - timedelta(days=days), today)
    if kind == "weekday":
        return _weekday_window(groups["cue"].lower(), _WEEKDAYS[groups["weekday"].lower()], today)
    if kind == "period":
        return _period_window(groups["cue"].lower(), groups["unit"].lower(), today)
    if kind == "yesterday":
        back = 2 if match.group(0).lower().startswith("the") else 1
        day = today - timedelta(days=back)
        return TimeWindow.of_days(day, day)
    return TimeWindow.of_days(today, today)


def _month_number(name: str) -> int:
    return int(name) if name.isdigit() else _MONTHS[name.lower()]


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBER_WORDS[" ".join(word.lower().split())]


def _day_window(year: int | None, month: int, day: int, today: date) -> TimeWindow | None:
    """One day; without a year, the latest such day not after ``today``."""
    for candidate_year in [year] if year is not None else [today.year, today.year - 1]:
        try:
            found = date(candidate_year, month, day)
        except ValueError:
            return None  # "31 February", "May 0": no date
        if year is not None or found <= today:
            return TimeWindow.of_days(found, found)
    return None


def _month_window(year: int, month: int) -> TimeWindow:
    first = date(year, month, 1)
    following = date(year + month // 12, month % 12 + 1, 1)
    return TimeWindow.of_days(first, following - timedelta(days=1))


def _weekday_window(cue: str, weekday: int, today: date) -> TimeWindow:
    """The latest such weekday before ``today`` ("last Saturday" on a Saturday: a week back)."""
    back = (today.weekday() - weekday) % 7
    if back == 0 and cue != "this":
        back = 7
    day = today - timedelta(days=back)
    return TimeWindow.of_days(day, day)


def _period_window(cue: str, unit: str, today: date) -> TimeWindow:
    """``last/past/this`` ``week/weekend/month/year``; "last" reaches up to today."""
    current = cue == "this"
    if unit == "weekend":
        saturday = today - timedelta(days=(today.weekday() - 5) % 7 or (0 if current else 7))
        return TimeWindow.of_days(saturday, saturday + timedelta(days=1))
    if unit == "week":
        if cue == "past":
            return TimeWindow.of_days(today - timedelta(days=7), today)
        # "Last week" is said of the calendar week before and of the last seven days alike.
        monday = today - timedelta(days=today.weekday() + (0 if current else 7))
        return TimeWindow.of_days(monday, today)
    if unit == "month":
        if cue == "past":
            return TimeWindow.of_days(today - timedelta(days=30), today)
        first = today.replace(day=1)
        if not current:
            first = (first - timedelta(days=1)).replace(day=1)
        return TimeWindow.of_days(first, today)
    if cue == "past":
        return TimeWindow.of_days(today - timedelta(days=365), today)
    year = today.year if current else today.year - 1
    return TimeWindow.of_days(date(year, 1, 1), today)
