"""A request job's method and path: never out of the base URL (issue 37)."""

from __future__ import annotations

import pytest

from batchrun.jobs.endpoints import Method
from batchrun.jobs.target import MAX_PATH, BadTarget, check_method, check_path


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/teams/{team_id}/reports", id="template"),
        pytest.param("/users/me/sessions?active=1&sort=-created", id="query"),
        pytest.param("/teams/acme/reports?next=https://x.example/y", id="url-in-query"),
        pytest.param("/files/100%25/a%20b", id="escapes"),
        pytest.param("/teams/acme/members/m-7/", id="trailing-slash"),
        pytest.param("/v1:batch/a:b", id="colon-in-a-step"),
        pytest.param("/", id="root"),
    ],
)
def test_a_path_under_the_base_url_is_kept_as_written(path):
    """A relative path with steps, escapes and a query string is accepted as is."""
    assert check_path(path) == path


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        pytest.param("https://evil.example/x", "names a scheme", id="absolute-url"),
        pytest.param("http:/teams/a", "names a scheme", id="scheme"),
        pytest.param("javascript:alert(1)", "names a scheme", id="other-scheme"),
        pytest.param("//evil.example/x", "starts with '//'", id="network-path"),
        pytest.param("teams/a", "does not start with '/'", id="relative"),
        pytest.param("/teams/../admin", "'..' step", id="dot-dot"),
        pytest.param("/teams/a/..", "'..' step", id="dot-dot-last"),
        pytest.param("/teams/./a", "'..' step", id="dot"),
        pytest.param("/teams//a", "holds '//'", id="double-slash"),
        pytest.param("/teams/a%2F..%2Fadmin", "encoded slash", id="encoded-slash"),
        pytest.param("/teams/a%2f", "encoded slash", id="encoded-slash-lower"),
        pytest.param("/teams/a%5Cb", "encoded slash", id="encoded-backslash"),
        pytest.param("/teams/a%252Fb", "encoded slash", id="double-encoded-slash"),
        pytest.param("/teams/%2e%2e/admin", "'..' step", id="encoded-dot-dot"),
        pytest.param("/teams/%252e%252e/x", "'..' step", id="double-encoded-dots"),
        pytest.param("/teams\\..\\admin", "'\\'", id="backslash"),
        pytest.param("/teams/a b", "a space", id="space"),
        pytest.param("/teams/a\nb", "control character", id="newline"),
        pytest.param("/teams/a#frag", "'#'", id="fragment"),
        pytest.param("/teams/{team}/x", "brace", id="other-placeholder"),
        pytest.param("/x?f={}", "brace", id="brace-in-query"),
        pytest.param("/" + "a" * MAX_PATH, "longer than", id="too-long"),
        pytest.param("", "path is missing", id="empty"),
        pytest.param(None, "path is missing", id="none"),
        pytest.param(7, "must be a string, got a number", id="number"),
    ],
)
def test_a_path_that_could_leave_the_base_url_is_refused(path, reason):
    """A scheme, a host, a step out, or an escape that becomes one: each refused."""
    with pytest.raises(BadTarget) as info:
        check_path(path)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("value", "method"),
    [("GET", Method.GET), ("post", Method.POST), (" Delete ", Method.DELETE)],
)
def test_a_method_is_read_in_any_case(value, method):
    """GET, POST, PUT, PATCH, DELETE in any case and spacing."""
    assert check_method(value) is method


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("FETCH", "unknown method 'FETCH' (expected GET, POST, PUT, PATCH, DELETE)"),
        ("HEAD", "unknown method 'HEAD'"),
        ("", "method is missing"),
        (None, "method is missing"),
        (["GET"], "method must be a string, got an array"),
    ],
)
def test_an_unknown_method_is_refused(value, reason):
    """Anything but the five methods is refused, naming the five."""
    with pytest.raises(BadTarget) as info:
        check_method(value)
    assert reason in str(info.value)
