"""KFP's cron, checked before any request: the schedule as KFP's API server parses it
(robfig/cron v1, seconds first), refused with the field and what it allows otherwise."""

from __future__ import annotations

import re

from batchscale.errors import BadInput

CRON_FIELDS = (("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31),
               ("month", 1, 12), ("day-of-week", 0, 6))
"""KFP's cron (robfig/cron v1, which its API server parses with) has a seconds field first."""
CRON_NAMES = {
    "month": {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(),
                                         1)},
    "day-of-week": {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())},
}
CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                    "@hourly")
CRON_EVERY = "@every "
CRON_MAX_CHARS = 200
GO_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ns|us|µs|μs|ms|s|m|h))+")
GO_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
             "h": 3600.0}
GO_MAX_DURATION_S = (2**63 - 1) / 1e9
DAYS_IN_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30,
                 12: 31}
CRON_HELP = ("KFP cron is 'second minute hour day-of-month month day-of-week' (e.g. '0 0 2 * * *' "
             "for 02:00 every day; numbers, names JAN-DEC and SUN-SAT, *, ?, a-b, */n, lists "
             "a,b), or one of " + ", ".join(CRON_DESCRIPTORS) + ", or '@every 1h30m'")


def check_cron(cron: str) -> str:
    """The schedule as KFP's API server parses it (robfig/cron v1 `Parse`), whitespace
    normalized; BadInput naming the field otherwise. Stricter than KFP where KFP accepts a
    mistake: a 5-field crontab line (KFP would read it as seconds first), a day that never comes
    ('31 2': Feb 31), '+5', empty list items, '@every' below a second."""
    if not isinstance(cron, str) or not cron.strip():
        raise BadInput(f"--cron: give a schedule; {CRON_HELP}")
    if len(cron) > CRON_MAX_CHARS:
        raise BadInput(f"--cron: {len(cron)} characters is not a schedule (at most "
                       f"{CRON_MAX_CHARS}); {CRON_HELP}")
    control = sorted({repr(c) for c in cron if c != " " and (c.isspace() or not c.isprintable())})
    if control:  # a pasted line's newline or tab: what KFP's parser then reads is not this text
        raise BadInput(f"--cron: {cron!r} contains {', '.join(control)}; give the schedule on "
                       f"one line with single spaces; {CRON_HELP}")
    text = " ".join(cron.split())
    if text.startswith("@"):
        return _check_descriptor(cron, text)
    fields = text.split(" ")
    if len(fields) != len(CRON_FIELDS):
        raise BadInput(f"--cron: {cron!r} has {len(fields)} fields; KFP needs "
                       f"{len(CRON_FIELDS)} (second minute hour day-of-month month "
                       "day-of-week), e.g. '0 0 2 * * *' for 02:00 every day")
    parsed = {}
    for value, (name, low, high) in zip(fields, CRON_FIELDS, strict=True):
        try:
            parsed[name] = _cron_field(value, low, high, CRON_NAMES.get(name, {}))
        except ValueError as err:
            named = "".join(f", {n.upper()}" for n in CRON_NAMES.get(name, {}))
            raise BadInput(f"--cron: {cron!r}: {name} field {value!r}: {err}; allowed: "
                           f"{low}-{high}{named}, *, ?, a-b, */n, a/n and lists a,b") from None
    _check_day_comes(cron, parsed)
    return text


def _check_descriptor(cron: str, text: str) -> str:
    if text in CRON_DESCRIPTORS:
        return text
    duration = text[len(CRON_EVERY):] if text.startswith(CRON_EVERY) else None
    if duration is None or not GO_DURATION.fullmatch(duration):
        raise BadInput(f"--cron: {cron!r} is not a schedule KFP knows; {CRON_HELP}")
    seconds = sum(float(n) * GO_UNIT_S[unit] for n, unit in
                  re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h)", duration))
    if not 1 <= seconds <= GO_MAX_DURATION_S:
        raise BadInput(f"--cron: {cron!r}: the interval must be between 1 s and "
                       f"{GO_MAX_DURATION_S / 3600:,.0f} h")
    return text


def _cron_field(value: str, low: int, high: int, names: dict[str, int]) -> tuple[set[int], bool]:
    """(the values a field selects, whether it is '*' or '?', which robfig treats apart)."""
    selected: set[int] = set()
    star = False
    for item in value.split(","):
        span, slash, step_text = item.partition("/")
        step = _cron_number(step_text, {}) if slash else 1
        if step < 1:
            raise ValueError("a step must be at least 1")
        if span in ("*", "?"):
            start, end, star = low, high, True
        else:
            first, dash, last = span.partition("-")
            start = _cron_number(first, names)
            end = _cron_number(last, names) if dash else high if slash else start
        if start < low or end > high:
            raise ValueError(f"{item!r} is out of range")
        if start > end:
            raise ValueError(f"{item!r} starts after it ends")
        selected.update(range(start, end + 1, step))
    return selected, star


def _cron_number(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{text!r} is not a number{' or a name' if names else ''}")
    return int(text)


def _check_day_comes(cron: str, parsed: dict[str, tuple[set[int], bool]]) -> None:
    """robfig requires both the day of month and the day of week to match when either is '*' or
    '?' (either one otherwise): refuse days of month that none of the months has."""
    days, days_star = parsed["day-of-month"]
    _, weekdays_star = parsed["day-of-week"]
    months, _ = parsed["month"]
    if (days_star or weekdays_star) and not any(
            day <= DAYS_IN_MONTH[month] for day in days for month in months):
        raise BadInput(f"--cron: {cron!r} never runs: no month of {sorted(months)} has day "
                       f"{min(days)}")
