"""The limit grammar, profiles and the limit table."""

from __future__ import annotations

import pytest

from batchrun.core.errors import StateError, UsageError
from batchrun.core.limits import (
    LimitKey,
    Profile,
    Rule,
    Window,
    limit_table,
    parse_override,
    parse_rule,
    read_table,
    table_text,
)


@pytest.mark.parametrize(
    ("text", "windows"),
    [
        pytest.param("15/1m+500/1h", [(15, 60), (500, 3600)], id="profile-b"),
        pytest.param("30/1m", [(30, 60)], id="profile-a"),
        pytest.param("15/5m", [(15, 300)], id="invite"),
        pytest.param("10/5m", [(10, 300)], id="avatar"),
        pytest.param("120/1m", [(120, 60)], id="global"),
        pytest.param("15/m", [(15, 60)], id="bare-unit"),
        pytest.param("30/2s", [(30, 2)], id="scaled"),
        pytest.param("5/250ms", [(5, 0.25)], id="milliseconds"),
        pytest.param("1/1.5s", [(1, 1.5)], id="decimal"),
        pytest.param(" 15 / 1m + 500 / 1h ", [(15, 60), (500, 3600)], id="spaces"),
        pytest.param("2/h", [(2, 3600)], id="hour"),
        pytest.param("10/1d", [(10, 86400)], id="day"),
        pytest.param("1000/24h+10/1d", [(1000, 86400), (10, 86400)], id="day-and-24h"),
    ],
)
def test_contract_rules_parse(text, windows):
    """Every rule shape of the contract parses into its windows."""
    assert [(w.count, w.seconds) for w in parse_rule(text).windows] == windows


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "cannot read ''", id="empty"),
        pytest.param("15", "cannot read '15'", id="no-window"),
        pytest.param("15/1w", "cannot read '15/1w'", id="bad-unit"),
        pytest.param("0/1m", "at least 1 request", id="zero-count"),
        pytest.param("5/0s", "longer than 0 s", id="zero-window"),
        pytest.param("-1/1m", "cannot read", id="negative"),
        pytest.param("15/1m+", "cannot read ''", id="dangling-plus"),
        pytest.param("1.5/1m", "cannot read", id="fractional-count"),
    ],
)
def test_bad_rules_are_refused_with_a_hint(text, fragment):
    """A bad rule names what it could not read and shows the grammar."""
    with pytest.raises(UsageError) as info:
        parse_rule(text)
    assert fragment in info.value.message
    assert "Examples: 30/1m" in info.value.message


def test_override_names_key_and_rule():
    """`--limit KEY=RULE` gives the key and its rule."""
    key, rule = parse_override("invite=3/1s")
    assert key is LimitKey.INVITE
    assert str(rule) == "3/1s"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("run-query", "expected KEY=RULE", id="no-equals"),
        pytest.param("bogus=1/1s", "unknown key 'bogus'", id="unknown-key"),
    ],
)
def test_bad_overrides_are_refused(text, fragment):
    """A bad `--limit` says what is wrong and lists the keys."""
    with pytest.raises(UsageError, match=fragment) as info:
        parse_override(text)
    assert "run-query, invite, avatar, global" in info.value.message


def test_default_table_is_profile_b():
    """Without flags: run-query 15/1m+500/1h, invite 15/5m, avatar 10/5m, global."""
    table = {key: str(rule) for key, rule in limit_table().items()}
    assert table == {
        LimitKey.RUN_QUERY: "15/1m+500/1h",
        LimitKey.INVITE: "15/5m",
        LimitKey.AVATAR: "10/5m",
        LimitKey.GLOBAL: "120/1m",
    }


def test_profile_a_changes_only_run_query():
    """Profile a sets run-query to 30/1m."""
    table = limit_table(profile=Profile.A)
    assert str(table[LimitKey.RUN_QUERY]) == "30/1m"
    assert str(table[LimitKey.INVITE]) == "15/5m"


def test_overrides_replace_one_key():
    """An override replaces its key's rule, profile or not."""
    table = limit_table(overrides=[parse_override("run-query=1/1s")])
    assert str(table[LimitKey.RUN_QUERY]) == "1/1s"


def test_interval_is_the_binding_long_run_rate():
    """15/1m+500/1h: 500/h binds the long run, 7.2 s apart."""
    assert parse_rule("15/1m+500/1h").interval == pytest.approx(7.2)


def test_a_rule_needs_a_window():
    """An empty rule is refused when built."""
    with pytest.raises(UsageError):
        Rule(())


def test_window_prints_in_the_grammar():
    """Windows print back in the grammar they were written in."""
    assert [str(Window(1, s)) for s in (0.25, 1.5, 90, 7200, 86400)] == [
        "1/250ms",
        "1/1.5s",
        "1/90s",
        "1/2h",
        "1/1d",
    ]


def test_a_rule_table_survives_storing():
    """table_text and read_table round-trip every key's windows."""
    table = {k: r.scaled(30) for k, r in limit_table(profile=Profile.B).items()}
    assert read_table(table_text(table)) == table


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"nope": [[1, 1.0]]}', id="unknown-key"),
        pytest.param('{"invite": [[0, 1.0]]}', id="zero-count"),
        pytest.param("{oops", id="not-json"),
    ],
)
def test_a_damaged_stored_table_is_a_state_error(text):
    """A damaged stored table exits 74 with a message, not a traceback."""
    with pytest.raises(StateError, match="damaged"):
        read_table(text)


def test_a_burst_reading_shows_its_burst_and_scales_with_the_rule():
    rule = Rule((Window(30, 60.0),), 10)
    assert str(rule) == "30/1m, bursts of 11"
    assert rule.scaled(30) == Rule((Window(30, 2.0),), 10)
    assert rule != Rule((Window(30, 60.0),))
    assert Rule((Window(15, 60.0), Window(500, 3600.0))).shortest == Window(15, 60.0)


def test_a_burst_below_zero_is_refused():
    with pytest.raises(UsageError, match="at least 0"):
        Rule((Window(30, 60.0),), -1)


def test_a_scaled_window_reads_in_milliseconds_and_parses_back():
    window = Window(1, 1 / 30)  # 1 s at --time-scale 30
    assert str(window) == "1/33.3ms"
    assert parse_rule(str(window)).windows[0].seconds == pytest.approx(1 / 30, 2e-3)
