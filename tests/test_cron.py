"""The cron checker (`batchscale/cron.py`) against an oracle: robfig/cron v1.2.0's parser, what
KFP's API server validates a recurring run's cron with, ported below; hypothesis draws valid
and invalid schedules."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.cron import CRON_FIELDS, CRON_NAMES, check_cron
from batchscale.errors import BadInput


class RobfigCronV1:
    """The oracle: robfig/cron v1.2.0 `Parse` (what KFP's API server validates with), ported
    line by line from its parser.go for the 6-field form and the descriptors."""

    BOUNDS = [(0, 59, {}), (0, 59, {}), (0, 23, {}), (1, 31, {}), (1, 12, CRON_NAMES["month"]),
              (0, 6, CRON_NAMES["day-of-week"])]
    DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                   "@hourly"}

    @classmethod
    def accepts(cls, spec: str) -> bool:
        if spec.startswith("@"):
            return spec in cls.DESCRIPTORS or spec.startswith("@every ")  # duration: Go's
        fields = spec.split()
        if len(fields) not in (5, 6):  # day-of-week is optional in v1's default parser
            return False
        try:
            for field, (low, high, names) in zip(fields, cls.BOUNDS, strict=False):
                for expr in filter(None, field.split(",")):  # Go's FieldsFunc drops empties
                    cls._range(expr, low, high, names)
        except ValueError:
            return False
        return True

    @classmethod
    def _range(cls, expr: str, low: int, high: int, names: dict) -> None:
        range_and_step = expr.split("/")
        low_and_high = range_and_step[0].split("-")
        if low_and_high[0] in ("*", "?"):
            start, end = low, high
        else:
            start = cls._int_or_name(low_and_high[0], names)
            if len(low_and_high) > 2:
                raise ValueError("too many hyphens")
            end = cls._int_or_name(low_and_high[1], names) if len(low_and_high) == 2 else start
        if len(range_and_step) > 2:
            raise ValueError("too many slashes")
        step = cls._atoi(range_and_step[1]) if len(range_and_step) == 2 else 1
        if len(range_and_step) == 2 and len(low_and_high) == 1:
            end = high
        if start < low or end > high or start > end or step == 0:
            raise ValueError("out of range")

    @classmethod
    def _int_or_name(cls, text: str, names: dict) -> int:
        return names[text.lower()] if text.lower() in names else cls._atoi(text)

    @staticmethod
    def _atoi(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError("not an int")
        if int(text) < 0:
            raise ValueError("negative")
        return int(text)


def number_or_name(index: int) -> st.SearchStrategy[str]:
    _, low, high = CRON_FIELDS[index]
    names = list(CRON_NAMES.get(CRON_FIELDS[index][0], {}))
    return st.one_of(st.integers(low, high).map(str),
                     *([st.sampled_from(names).map(str.upper)] if names else []))


@st.composite
def cron_items(draw, index: int) -> str:
    _, low, high = CRON_FIELDS[index]
    kind = draw(st.sampled_from(["value", "range", "star", "step"]))
    if kind == "value":
        return draw(number_or_name(index))
    if kind == "star":
        return draw(st.sampled_from(["*", "?"]))
    if kind == "step":
        return f"{draw(st.sampled_from(['*', str(low)]))}/{draw(st.integers(1, high + 1))}"
    a, b = sorted(draw(st.lists(st.integers(low, high), min_size=2, max_size=2)))
    return f"{a}-{b}"


@st.composite
def valid_crons(draw) -> str:
    fields = [",".join(draw(st.lists(cron_items(i), min_size=1, max_size=3)))
              for i in range(len(CRON_FIELDS))]
    fields[3] = draw(st.sampled_from(["*", "1-28", "?", "*/2"]))  # a day every month has
    return " ".join(fields)


@settings(max_examples=100, deadline=None)
@given(valid_crons())
def test_valid_cron_fields_are_accepted_as_kfp_accepts_them(cron):
    assert RobfigCronV1.accepts(cron)
    assert check_cron(f"  {cron.replace(' ', '  ')} ") == cron


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, len(CRON_FIELDS) - 1), data=st.data())
def test_an_out_of_range_field_is_refused_naming_it(index, data):
    name, low, high = CRON_FIELDS[index]
    bad = data.draw(st.one_of(st.integers(high + 1, 10**6), st.integers(-5, low - 1)
                              if low > 0 else st.integers(high + 1, high + 9)))
    fields = ["0", "0", "0", "1", "1", "*"]
    fields[index] = str(bad) if bad >= 0 else f"{bad}-1"
    cron = " ".join(fields)
    with pytest.raises(BadInput, match=f"{name} field") as err:
        check_cron(cron)
    assert f"allowed: {low}-{high}" in str(err.value)
    assert not RobfigCronV1.accepts(cron) or bad < 0  # Go splits '-5-1' differently


cron_text = st.text(st.sampled_from("0123456789*?/-,@ abcdefghijklmnopqrstuvwxyzJANMO\t+"),
                    max_size=30)


@settings(max_examples=100, deadline=None)
@given(cron_text)
def test_any_cron_text_is_refused_clearly_or_accepted_only_if_kfp_accepts_it(text):
    try:
        normalized = check_cron(text)
    except BadInput as err:
        assert str(err).startswith("--cron:")
        return
    assert RobfigCronV1.accepts(normalized)


@pytest.mark.parametrize(("cron", "needle"), [
    ("0 2 * * *", "has 5 fields"),
    ("0 0 0 31 2 *", "never runs"),
    ("0 0 0 30 FEB *", "never runs"),
    ("60 * * * * *", "second field '60'"),
    ("0 0 0 * * 7", "day-of-week field '7'"),
    ("0 0 0 * * MONDAY", "day-of-week field 'MONDAY'"),
    ("*/0 * * * * *", "a step must be at least 1"),
    ("1,,2 * * * * *", "second field '1,,2'"),
    ("5-1 * * * * *", "starts after it ends"),
    ("@every 500ms", "between 1 s and"),
    ("@every 1d", "not a schedule KFP knows"),
    ("@Hourly", "not a schedule KFP knows"),
    ("", "give a schedule"),
    ("0 0 2 * * *\n", "contains '\\n'; give the schedule on one line"),
    ("0\t0 2 * * *", "contains '\\t'"),
    ("0 " * 200, "is not a schedule"),
])
def test_cron_refusals_name_what_is_wrong(cron, needle):
    with pytest.raises(BadInput, match=re.escape(needle)):
        check_cron(cron)


@pytest.mark.parametrize("cron", ["0 0 2 * * *", "0 30 9 * * MON-FRI", "0 0 0 1 JAN,jul ?",
                                  "*/15 * * * * *", "0 0 0 29 2 *", "0 0 */6 * * *",
                                  "@hourly", "@daily", "@every 1h30m", "@every 90s",
                                  "@every 1.5h"])
def test_usual_schedules_are_accepted(cron):
    assert check_cron(cron) == cron and RobfigCronV1.accepts(cron)
