"""Reading and validating jobs files (docs/reference/contract.md#the-jobs-file), CSV and JSONL."""

from __future__ import annotations

import csv
import errno
import io
import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchrun.core.errors import JobsFileError
from batchrun.jobs import jobfile
from batchrun.jobs.endpoints import JobType
from batchrun.jobs.job import Job, read_jobs, scan, summarize
from batchrun.jobs.jobfile import Problem

HEADER = "id,type,team_id,payload\n"
MIB = 2**20


def write(tmp_path: Path, data: str | bytes, name: str = "jobs.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def problems(
    tmp_path: Path, data: str | bytes, name: str = "jobs.csv"
) -> list[tuple[int, str]]:
    """The (line, reason) pairs of a file that must be refused."""
    with pytest.raises(JobsFileError) as info:
        read_jobs(write(tmp_path, data, name))
    return info.value.problems


def one_problem(
    tmp_path: Path, data: str | bytes, name: str = "jobs.csv"
) -> tuple[int, str]:
    [problem] = problems(tmp_path, data, name)
    return problem


# --- CSV: what is accepted -------------------------------------------------------


def test_reads_each_type_with_its_request(tmp_path):
    """Each type becomes its method, path and limit key."""
    text = HEADER + 'q,run-query,acme,"{""sql"": 1}"\ni,invite,acme,\na,avatar,,\n'
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.endpoint.method, j.path, j.key.value) for j in jobs] == [
        ("POST", "/teams/acme/data/run-query", "run-query"),
        ("POST", "/teams/acme/members/invite", "invite"),
        ("PUT", "/users/me/avatar", "avatar"),
    ]


def test_payload_is_parsed_and_empty_means_an_empty_object(tmp_path):
    """A CSV payload is JSON text; an empty or missing one is {}."""
    text = HEADER + 'a,avatar,,"{""x"": [1, 2]}"\nb,avatar,,  \nc,avatar\n'
    jobs = read_jobs(write(tmp_path, text))
    assert [j.payload for j in jobs] == [{"x": [1, 2]}, {}, {}]


def test_jobs_carry_their_line_number(tmp_path):
    """Job.line is the physical line of the row, the header being line 1."""
    jobs = read_jobs(write(tmp_path, HEADER + "a,avatar,,\nb,avatar,,\n"))
    assert [(j.id, j.line) for j in jobs] == [("a", 2), ("b", 3)]


def test_a_bom_is_accepted(tmp_path):
    """A UTF-8 byte order mark before the header is not part of the first column."""
    [job] = read_jobs(write(tmp_path, "\ufeff" + HEADER + "a,avatar,,\n"))
    assert job.id == "a"


def test_crlf_line_ends_are_accepted(tmp_path):
    """\\r\\n line ends read like \\n, and no \\r leaks into the last field."""
    text = HEADER.replace("\n", "\r\n") + "a,invite,acme,\r\nb,invite,acme,{}\r\n"
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.id, j.team_id, j.payload, j.line) for j in jobs] == [
        ("a", "acme", {}, 2),
        ("b", "acme", {}, 3),
    ]


def test_blank_and_whitespace_lines_are_skipped(tmp_path):
    """Empty lines, lines of spaces and lines of bare commas are no rows."""
    text = "\n" + HEADER + "\n   \na,avatar,,\n,,,\n\t\nb,avatar,,\n\n"
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.id, j.line) for j in jobs] == [("a", 5), ("b", 8)]


def test_extra_columns_are_ignored(tmp_path):
    """Columns beyond the known four, in any order, do not matter."""
    text = "note,type,owner,id\nhello,avatar,me,a\n"
    [job] = read_jobs(write(tmp_path, text))
    assert (job.id, job.type) == ("a", JobType.AVATAR)


def test_header_names_and_values_are_stripped(tmp_path):
    """Spaces around header names, ids and types are not significant."""
    [job] = read_jobs(write(tmp_path, " id , type \n  a  , avatar \n"))
    assert (job.id, job.type) == ("a", JobType.AVATAR)


def test_quoted_multiline_payload_is_one_row(tmp_path):
    """A quoted payload spanning lines is one row, numbered by its first line."""
    text = HEADER + 'a,avatar,,"{\n""x"":\n1}"\nb,avatar,,\n'
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.id, j.payload, j.line) for j in jobs] == [
        ("a", {"x": 1}, 2),
        ("b", {}, 5),
    ]


def test_team_id_is_ignored_for_avatar(tmp_path):
    """An avatar job needs no team and drops one given, even a malformed one."""
    [job] = read_jobs(write(tmp_path, "id,type,team_id\na,avatar,../x\n"))
    assert job.team_id is None


def test_team_id_column_is_needed_only_by_rows_that_need_a_team(tmp_path):
    """Without a team_id column avatar rows pass and team rows are named."""
    text = "id,type\na,avatar\nb,invite\n"
    assert one_problem(tmp_path, text) == (
        3,
        "team_id is missing: run-query and invite jobs need a team",
    )


def test_header_only_is_a_valid_empty_file(tmp_path):
    """A header with no rows holds zero jobs."""
    assert read_jobs(write(tmp_path, HEADER)) == []


def test_payload_larger_than_the_csv_default_limit_is_read(tmp_path):
    """A payload far above the csv module's 128 KiB default field limit is read."""
    big = json.dumps({"blob": "x" * 300_000}).replace('"', '""')
    [job] = read_jobs(write(tmp_path, HEADER + f'a,avatar,,"{big}"\n'))
    assert len(job.payload["blob"]) == 300_000


def test_nul_bytes_outside_known_columns_are_harmless(tmp_path):
    """NUL bytes in an ignored column do not stop the csv reader."""
    [job] = read_jobs(write(tmp_path, b"id,type,note\na,avatar,x\x00y\n"))
    assert job.id == "a"


# --- CSV: what is refused, row by row ----------------------------------------------


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param(
            "a,foo,t,",
            "unknown type 'foo' (expected run-query, invite, avatar or request)",
            id="unknown-type",
        ),
        pytest.param("a,Run-Query,t,", "unknown type 'Run-Query'", id="type-case"),
        pytest.param(
            "a,,t,",
            "type is missing (expected run-query, invite, avatar or request)",
            id="no-type",
        ),
        pytest.param(",run-query,t,", "id is empty", id="empty-id"),
        pytest.param("  ,run-query,t,", "id is empty", id="blank-id"),
        pytest.param("a", "type is missing", id="short-row"),
        pytest.param(
            "a\x00b,avatar,,", "id 'a\\x00b' holds a control character", id="nul-id"
        ),
        pytest.param("a,run-query,,", "team_id is missing", id="missing-team"),
        pytest.param("a,invite,  ,", "team_id is missing", id="blank-team"),
        pytest.param(
            "a,invite,a/b,", "team_id 'a/b' may hold only letters", id="slash"
        ),
        pytest.param("a,invite,..,", "team_id '..' may hold only", id="dot-dot"),
        pytest.param("a,invite,.,", "team_id '.' may hold only", id="dot"),
        pytest.param("a,invite,...,", "must not be only dots", id="dots"),
        pytest.param("a,invite,a%2Fb,", "team_id 'a%2Fb'", id="percent"),
        pytest.param("a,invite,a b,", "team_id 'a b'", id="space"),
        pytest.param("a,invite, acme,", "team_id ' acme'", id="leading-space"),
        pytest.param("a,invite,a\tb,", "team_id 'a\\tb'", id="tab"),
        pytest.param('a,invite,"acme\n",', "team_id 'acme\\n'", id="newline"),
        pytest.param("a,invite,café,", "team_id 'café'", id="non-ascii"),
        pytest.param(
            "a,invite,t,{oops",
            "payload is not valid JSON (Expecting property name enclosed in double "
            "quotes at character 2)",
            id="bad-json",
        ),
        pytest.param(
            'a,invite,t,"[1,2]"',
            "payload must be a JSON object {...}, got an array",
            id="array",
        ),
        pytest.param("a,invite,t,42", "got a number", id="number"),
        pytest.param('a,invite,t,"""x"""', "got a string", id="string"),
        pytest.param("a,invite,t,null", "got null", id="null"),
        pytest.param('a,invite,t,"{""x"": NaN}"', "NaN is not a JSON value", id="nan"),
        pytest.param(
            'a,invite,t,"{""x"": -Infinity}"', "-Infinity is not a JSON value", id="inf"
        ),
        pytest.param(
            'a,invite,t,"{""x"": 1e999}"', "the number '1e999' is too large", id="1e999"
        ),
        pytest.param(
            'a,invite,t,"{""x"": ' + "9" * 5000 + '}"',
            "a number of 5000 digits is too long",
            id="long-int",
        ),
        pytest.param(
            'a,invite,t,"{""x"": ""\\ud800""}"', "lone surrogate", id="surrogate"
        ),
        pytest.param(
            'a,invite,t,"' + "[" * 100_000 + '"', "nested too deeply", id="deep"
        ),
    ],
)
def test_bad_csv_row_is_named_by_line_and_reason(tmp_path, row, reason):
    """Each bad row is refused with its line number and a reason a person reads."""
    line, text = one_problem(tmp_path, HEADER + "ok,avatar,,\n" + row + "\n")
    assert line == 3
    assert reason in text


def test_payload_too_deep_to_send_is_refused(tmp_path, monkeypatch):
    """A payload that parses but cannot be encoded again is refused, not sent."""

    def too_deep(*args, **kwargs):
        raise RecursionError

    monkeypatch.setattr(json, "dumps", too_deep)
    deep = '"{""a"": ' + "[" * 150 + "]" * 150 + '}"'
    reason = one_problem(tmp_path, HEADER + f"a,avatar,,{deep}\n")[1]
    assert reason == "payload is nested too deeply"


def test_duplicate_id_names_both_lines(tmp_path):
    """A repeated id names the line where it first appeared."""
    text = HEADER + "a,avatar,,\nb,avatar,,\na,avatar,,\n"
    assert one_problem(tmp_path, text) == (4, "duplicate id 'a' (first on line 2)")


def test_duplicate_of_a_bad_row_is_named_too(tmp_path):
    """An id is taken even by a bad row, so fixing that row shows no new problem."""
    text = HEADER + "a,fax,,\na,avatar,,\n"
    assert [line for line, _ in problems(tmp_path, text)] == [2, 3]
    assert problems(tmp_path, text)[1] == (3, "duplicate id 'a' (first on line 2)")


def test_ids_are_compared_after_stripping(tmp_path):
    """' a' and 'a' are the same id."""
    text = HEADER + "a,avatar,,\n a ,avatar,,\n"
    assert one_problem(tmp_path, text)[1] == "duplicate id 'a' (first on line 2)"


def test_every_bad_row_is_reported(tmp_path):
    """All bad rows are named, not just the first."""
    text = HEADER + "a,fax,,\nb,avatar,,\n,avatar,,\nd,invite,,\n"
    assert [line for line, _ in problems(tmp_path, text)] == [2, 4, 5]


def test_problem_in_multiline_record_names_its_first_line(tmp_path):
    """A bad record spanning lines is named by the line it starts on."""
    text = HEADER + 'a,avatar,,"{\n1\n}"\nb,avatar,,\n'
    assert one_problem(tmp_path, text)[0] == 2


def test_a_literal_quote_inside_a_field_keeps_line_numbers(tmp_path):
    """A quote in the middle of an unquoted field does not shift later lines."""
    text = HEADER + 'a,avatar,,\nb,avatar,x"y,\nc,fax,,\n'
    assert one_problem(tmp_path, text)[0] == 4


# --- CSV: what is refused, as structure ------------------------------------------


def test_unclosed_quote_is_refused_not_swallowing_rows(tmp_path):
    """An unclosed quote is an error at its row, not a field eating later jobs."""
    text = 'id,type,note\na,avatar,ok\nb,avatar,"oops\nc,avatar,x\nd,avatar,y\n'
    assert one_problem(tmp_path, text) == (
        3,
        'a quoted field starts here but its closing " is missing',
    )


def test_text_after_a_closing_quote_is_refused_and_reading_goes_on(tmp_path):
    """A field like "ab"c is an error; the next rows are still checked."""
    text = HEADER + 'a,avatar,"x"y,\nb,fax,,\n'
    assert problems(tmp_path, text) == [
        (2, 'text follows a closing " (inside a quoted field write a quote as "")'),
        (3, "unknown type 'fax' (expected run-query, invite, avatar or request)"),
    ]


def test_lone_carriage_returns_are_refused(tmp_path):
    """Old Mac \\r line ends are named, with the line ends that do work."""
    line, reason = one_problem(tmp_path, "id,type\ra,avatar\r")
    assert line == 1
    assert "end lines with \\n or \\r\\n" in reason


def test_csv_field_limit_is_16_mib(tmp_path):
    """Fields may be large, yet a field holds at most 16 MiB in memory."""
    csv.field_size_limit(1024)
    read_jobs(write(tmp_path, "id,type\na,avatar\n"))
    assert csv.field_size_limit() == 16 * MIB


@pytest.fixture
def small_field_limit(monkeypatch):
    """A 1 KiB csv field limit, so a too-large field costs no time to build."""
    monkeypatch.setattr(jobfile, "MAX_ROW", 1024)


@pytest.mark.usefixtures("small_field_limit")
def test_field_over_the_limit_is_refused(tmp_path):
    """A field beyond the field limit is refused, naming the line its record starts on."""
    big = "x\n" * 600
    line, reason = problems(tmp_path, f'id,type\na,avatar\n"{big}",avatar\n')[0]
    assert (line, reason) == (3, "a field is larger than 16 MiB")


def test_line_over_16_mib_stops_reading(tmp_path):
    """A line beyond 16 MiB is refused without reading it all into memory."""
    data = b"id,type\na,avatar\n" + b"x" * (16 * MIB + 1) + b"\nb,fax\n"
    assert one_problem(tmp_path, data) == (
        3,
        "a line is longer than 16 MiB: this does not look like a jobs file",
    )


@pytest.mark.parametrize(
    ("data", "where", "reason"),
    [
        pytest.param(
            b"id,type\nok,avatar\nx\xff,avatar\n",
            3,
            "not UTF-8 text (byte 0xff, column 2): save the file as UTF-8",
            id="in-a-row",
        ),
        pytest.param(
            b'id,type,payload\na,avatar,"{\n\xe9\n}"\n',
            3,
            "byte 0xe9",
            id="in-a-record",
        ),
        pytest.param(b"\xff\xfei\x00d\x00\n", 1, "byte 0xff", id="utf-16"),
    ],
)
def test_non_utf8_bytes_name_their_line(tmp_path, data, where, reason):
    """Bytes that are not UTF-8 are refused, naming the line they are on."""
    line, text = one_problem(tmp_path, data)
    assert line == where
    assert reason in text


def test_first_undecodable_line_of_a_record_is_named(tmp_path):
    """With bad bytes on several lines of one record, the first is named."""
    data = b'id,type,payload\na,avatar,"{\n\xff\n\xfe}"\n'
    assert one_problem(tmp_path, data)[0] == 3


def test_non_utf8_bytes_do_not_stop_the_check(tmp_path):
    """Rows after an undecodable line are still checked and counted."""
    lines = [line for line, _ in problems(tmp_path, b"id,type\n\xff,avatar\nb,fax\n")]
    assert lines == [2, 3]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            "",
            (
                0,
                "the file is empty: expected a header row (the first line must name "
                "the columns, e.g. id,type,team_id,payload)",
            ),
            id="empty",
        ),
        pytest.param("\n \r\n\n", (0, "the file is empty"), id="only-blank-lines"),
        pytest.param("\ufeff", (0, "the file is empty"), id="only-a-bom"),
        pytest.param(
            "id,kind\na,avatar\n",
            (1, "the header 'id,kind' lacks column(s) type: the first line must"),
            id="missing-column",
        ),
        pytest.param(
            "\na,avatar\n",
            (2, "the header 'a,avatar' lacks column(s) id, type"),
            id="no-header",
        ),
        pytest.param(
            "id,type,id\na,avatar,b\n",
            (1, "the header names id more than once"),
            id="column-twice",
        ),
        pytest.param(
            b"id,ty\xffpe\na,avatar\n", (1, "not UTF-8 text"), id="undecodable-header"
        ),
        pytest.param(
            'id,"type\na,avatar\n',
            (1, 'a quoted field starts here but its closing " is missing'),
            id="broken-header",
        ),
    ],
)
def test_file_without_a_usable_header_is_refused_once(tmp_path, data, expected):
    """A file with no usable header is refused with one clear problem."""
    line, reason = one_problem(tmp_path, data)
    assert line == expected[0]
    assert reason.startswith(expected[1])


def test_duplicate_extra_columns_are_harmless(tmp_path):
    """Only known columns must be unique in the header."""
    [job] = read_jobs(write(tmp_path, "id,type,note,note\na,avatar,x,y\n"))
    assert job.id == "a"


# --- the file as a whole ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param("nope.csv", "no such file", id="missing"),
        pytest.param(".", "this is a folder, not a jobs file", id="folder"),
        pytest.param("a\x00b.csv", "not a usable file name", id="nul-in-name"),
    ],
)
def test_unreadable_path_is_one_whole_file_problem(tmp_path, name, reason):
    """A path that is missing, a folder or unusable gets one clear message."""
    with pytest.raises(JobsFileError) as info:
        read_jobs(tmp_path / name)
    assert info.value.problems[0] == (0, info.value.problems[0][1])
    assert reason in info.value.message
    assert info.value.message.endswith("Nothing was sent.")


def test_permission_denied_is_a_problem(tmp_path, monkeypatch):
    """An OSError on opening becomes a problem naming its cause."""

    def deny(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "open", deny)
    assert list(scan(tmp_path / "jobs.csv")) == [
        Problem(0, "cannot read it: Permission denied")
    ]


def test_read_error_midway_is_a_problem(tmp_path, monkeypatch):
    """An OSError while reading ends the scan with a problem, not a traceback."""

    class Failing(io.BytesIO):
        def readline(self, size=-1):
            if self.tell():
                raise OSError(errno.EIO, "Input/output error")
            return super().readline(size)

    path = write(tmp_path, HEADER)
    monkeypatch.setattr(Path, "open", lambda *a, **k: Failing(b"id,type\na,avatar\n"))
    assert list(scan(path)) == [Problem(0, "cannot read it: Input/output error")]


def test_scan_streams_rows(tmp_path):
    """Scanning holds a few lines at a time, never the whole file."""
    row = "a{},avatar,,," + "x" * (MIB // 4) + "\n"
    path = write(
        tmp_path,
        "id,type,team_id,payload,note\n" + "".join(row.format(i) for i in range(64)),
    )
    tracemalloc.start()
    try:
        count = sum(isinstance(item, Job) for item in scan(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 64
    assert peak < 4 * MIB  # the file is 16 MiB


def test_more_than_20_problems_show_20_and_a_count(tmp_path):
    """The first 20 problems are shown in order, the rest only counted."""
    rows = "".join(f"j{i},fax,t,\n" for i in range(25))
    with pytest.raises(JobsFileError) as info:
        read_jobs(write(tmp_path, HEADER + rows))
    lines = info.value.message.splitlines()
    assert info.value.total == 25
    assert [line for line, _ in info.value.problems] == list(range(2, 22))
    assert lines[0] == f"{tmp_path / 'jobs.csv'}: 25 invalid row(s); nothing was sent."
    assert (
        lines[1]
        == "  line 2: unknown type 'fax' (expected run-query, invite, avatar or request)"
    )
    assert lines[20].startswith("  line 21: ")
    assert lines[21:] == ["  ... and 5 more"]


# --- JSON Lines --------------------------------------------------------------------


def test_jsonl_reads_objects_with_object_payloads(tmp_path):
    """JSON Lines: one object per line, payload an object, integer ids allowed."""
    lines = [
        {"id": 7, "type": "invite", "team_id": "t", "payload": {"email": "a@b.c"}},
        {"id": "x", "type": "avatar", "extra": True, "payload": None},
        {"id": "y", "type": "run-query", "team_id": "t"},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    jobs = read_jobs(write(tmp_path, text, "jobs.jsonl"))
    assert [(j.id, j.type, j.team_id, j.payload, j.line) for j in jobs] == [
        ("7", JobType.INVITE, "t", {"email": "a@b.c"}, 1),
        ("x", JobType.AVATAR, None, {}, 2),
        ("y", JobType.RUN_QUERY, "t", {}, 3),
    ]


def test_jsonl_blank_lines_bom_and_crlf(tmp_path):
    """JSON Lines skips blank lines and accepts a BOM and \\r\\n line ends."""
    text = '\ufeff{"id": "a", "type": "avatar"}\r\n\r\n  \r\n{"id": "b", "type": "avatar"}\r\n'
    jobs = read_jobs(write(tmp_path, text, "jobs.jsonl"))
    assert [(j.id, j.line) for j in jobs] == [("a", 1), ("b", 4)]


def test_empty_jsonl_file_holds_no_jobs(tmp_path):
    """A JSON Lines file has no header, so an empty one is valid and empty."""
    assert read_jobs(write(tmp_path, "\n", "jobs.jsonl")) == []


@pytest.mark.parametrize("name", ["JOBS.JSONL", ".jsonl"])
def test_name_ending_in_jsonl_means_json_lines(tmp_path, name):
    """The format follows the name's ending, whatever its case."""
    [job] = read_jobs(write(tmp_path, '{"id": "a", "type": "avatar"}\n', name))
    assert job.id == "a"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param(
            "{not json",
            "not valid JSON (Expecting property name enclosed in double quotes at "
            "character 2)",
            id="bad-json",
        ),
        pytest.param(
            "[1]", "expected one JSON object {...} per line, got an array", id="array"
        ),
        pytest.param('"x"', "got a string", id="string"),
        pytest.param("null", "got null", id="null"),
        pytest.param(
            '{"id": "a", "type": "avatar"} {}', "Extra data", id="two-objects"
        ),
        pytest.param(
            '{"id": true, "type": "avatar"}',
            "id must be a string or an integer, got a boolean",
            id="bool-id",
        ),
        pytest.param('{"id": 1.5, "type": "avatar"}', "got a number", id="float-id"),
        pytest.param('{"id": ["a"], "type": "avatar"}', "got an array", id="list-id"),
        pytest.param('{"id": null, "type": "avatar"}', "id is missing", id="null-id"),
        pytest.param('{"type": "avatar"}', "id is missing", id="missing-id"),
        pytest.param('{"id": " ", "type": "avatar"}', "id is empty", id="empty-id"),
        pytest.param(
            '{"id": "\\u001b[2J", "type": "avatar"}',
            "control character",
            id="escape-id",
        ),
        pytest.param(
            '{"id": "\\udfff", "type": "avatar"}', "lone surrogate", id="surrogate-id"
        ),
        pytest.param(
            '{"id": "ok", "type": "avatar"}',
            "duplicate id 'ok' (first on line 1)",
            id="dup",
        ),
        pytest.param(
            '{"id": "a", "type": 3}',
            "type must be a string, got a number",
            id="int-type",
        ),
        pytest.param(
            '{"id": "a", "type": "fax"}', "unknown type 'fax'", id="unknown-type"
        ),
        pytest.param('{"id": "a"}', "type is missing", id="missing-type"),
        pytest.param(
            '{"id": "a", "type": "invite", "team_id": 5}',
            "team_id must be a string, got a number",
            id="int-team",
        ),
        pytest.param(
            '{"id": "a", "type": "invite"}', "team_id is missing", id="no-team"
        ),
        pytest.param(
            '{"id": "a", "type": "invite", "team_id": "../x"}',
            "team_id '../x'",
            id="bad-team",
        ),
        pytest.param(
            '{"id": "a", "type": "avatar", "payload": [1]}',
            "payload must be a JSON object {...}, got an array",
            id="array-payload",
        ),
        pytest.param(
            '{"id": "a", "type": "avatar", "payload": "{}"}',
            "payload must be a JSON object {...}, got a string",
            id="string-payload",
        ),
        pytest.param(
            '{"id": "a", "type": "avatar", "payload": {"x": NaN}}',
            "not valid JSON (NaN is not a JSON value)",
            id="nan",
        ),
        pytest.param(
            '{"id": "a", "type": "avatar", "payload": {"x": "\\ud800"}}',
            "payload holds a lone surrogate",
            id="surrogate-payload",
        ),
        pytest.param(
            '{"id": ' + "1" * 4301 + "}", "4301 digits is too long", id="long-int-id"
        ),
        pytest.param("[" * 100_000, "nested too deeply", id="deep"),
    ],
)
def test_bad_jsonl_line_is_named(tmp_path, line, reason):
    """Each bad JSON line is refused with its line number and reason."""
    text = '{"id": "ok", "type": "avatar"}\n' + line + "\n"
    number, text = one_problem(tmp_path, text, "j.jsonl")
    assert number == 2
    assert reason in text


def test_jsonl_integer_and_string_ids_collide(tmp_path):
    """Id 7 and id "7" are the same job."""
    text = '{"id": 7, "type": "avatar"}\n{"id": "7", "type": "avatar"}\n'
    assert one_problem(tmp_path, text, "j.jsonl") == (
        2,
        "duplicate id '7' (first on line 1)",
    )


def test_jsonl_non_utf8_line_is_named_and_reading_goes_on(tmp_path):
    """An undecodable JSON line is named, and later lines are still checked."""
    data = b'{"id": "a\xff", "type": "avatar"}\n{"id": "b", "type": "fax"}\n'
    assert [line for line, _ in problems(tmp_path, data, "j.jsonl")] == [1, 2]


# --- summary -----------------------------------------------------------------------


def test_summary_counts_types_and_teams():
    """summarize counts jobs per type and per team; avatar jobs have no team."""
    jobs = [
        Job("a", JobType.RUN_QUERY, "x"),
        Job("b", JobType.RUN_QUERY, "y"),
        Job("c", JobType.INVITE, "x"),
        Job("d", JobType.AVATAR),
    ]
    summary = summarize(jobs)
    assert summary.total == 4
    assert summary.per_type == {
        JobType.RUN_QUERY: 2,
        JobType.INVITE: 1,
        JobType.AVATAR: 1,
    }
    assert summary.per_team == {"x": 2, "y": 1}


def test_summary_of_no_jobs_is_empty():
    """An empty file summarizes to zero with no types or teams."""
    summary = summarize([])
    assert (summary.total, summary.per_type, summary.per_team) == (0, {}, {})


# --- any bytes at all --------------------------------------------------------------

CELLS = [
    "id",
    "type",
    "team_id",
    "payload",
    "run-query",
    "avatar",
    "invite",
    "a",
    "",
    '"',
    '""',
    "{}",
    '{"x":1}',
    "[",
    "..",
    "a/b",
    "\x00",
    "é",
    "\r",
    "\n",
    " ",
    "NaN",
    "\ud800",
]
CSV_ISH = st.lists(st.lists(st.sampled_from(CELLS), max_size=6), max_size=8).map(
    lambda rows: "\n".join(",".join(r) for r in rows).encode("utf-8", "surrogatepass")
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(CELLS),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["id", "type", "team_id", "payload"]), inner, max_size=4
        )
    ),
    max_leaves=8,
)
JSONL_ISH = st.lists(JSON_VALUES.map(json.dumps), max_size=5).map(
    lambda lines: "\n".join(lines).encode()
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.binary(max_size=300) | CSV_ISH | JSONL_ISH, jsonl=st.booleans())
def test_any_bytes_give_jobs_or_a_jobs_file_error(tmp_path, data, jsonl):
    """Fuzz: whatever the bytes, reading returns jobs or raises JobsFileError only."""
    path = write(tmp_path, data, "f.jsonl" if jsonl else "f.csv")
    jobs: list[Job] = []
    error = None
    try:
        jobs = read_jobs(path)
    except JobsFileError as exc:
        error = exc
    assert error is None or (error.total >= 1 and error.problems)
    assert all(isinstance(job, Job) for job in jobs)
    assert len({job.id for job in jobs}) == len(jobs)


def test_ndjson_is_json_lines(tmp_path):
    """`.ndjson` is read as JSON Lines, payloads as objects."""
    path = tmp_path / "jobs.ndjson"
    path.write_text('{"id": "a", "type": "avatar", "payload": {"x": 1}}\n')
    [job] = read_jobs(path)
    assert job.payload == {"x": 1}


def test_a_json_array_gets_a_clear_message(tmp_path):
    """A `.json` file holding an array is refused with how to convert it; one
    holding an object per line is JSON Lines."""
    path = tmp_path / "jobs.json"
    path.write_text('[{"id": "a", "type": "avatar"}]\n')
    with pytest.raises(JobsFileError) as caught:
        read_jobs(path)
    assert "holds an array" in str(caught.value.problems)
    assert "jq -c" in str(caught.value.problems)
    path.write_text('{"id": "a", "type": "avatar"}\n')
    assert [job.id for job in read_jobs(path)] == ["a"]


# --- request jobs (issue 37) -------------------------------------------------------

REQUEST_HEADER = "id,type,team_id,payload,method,path\n"


def test_request_rows_are_read_from_csv_with_method_path_and_body(tmp_path):
    """A request row names its method and path; GET and DELETE carry no body."""
    text = REQUEST_HEADER + (
        "g,request,acme,,GET,/teams/{team_id}/reports?day=1\n"
        'p,request,,"{""a"": 1}",patch,/users/me/profile\n'
        "d,request,,,DELETE,/teams/beta/members/m7\n"
    )
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.endpoint.method, j.path, j.body, j.key.value) for j in jobs] == [
        ("GET", "/teams/acme/reports?day=1", None, "global"),
        ("PATCH", "/users/me/profile", {"a": 1}, "global"),
        ("DELETE", "/teams/beta/members/m7", None, "global"),
    ]
    assert summarize(jobs).per_team == {"acme": 1}


def test_request_rows_are_read_from_jsonl(tmp_path):
    """In JSON Lines a request's payload is an object, its method and path text."""
    lines = [
        {"id": 1, "type": "request", "method": "POST", "path": "/x", "payload": {}},
        {
            "id": 2,
            "type": "request",
            "method": "PUT",
            "path": "/y",
            "payload": {"k": 2},
        },
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    jobs = read_jobs(write(tmp_path, text, "jobs.jsonl"))
    assert [(j.method, j.path, j.body) for j in jobs] == [
        ("POST", "/x", {}),
        ("PUT", "/y", {"k": 2}),
    ]


@pytest.mark.parametrize(
    ("method", "path", "key"),
    [
        pytest.param("POST", "/teams/{team_id}/data/run-query", "run-query", id="rq"),
        pytest.param("POST", "/teams/other/data/run-query?x=1", "run-query", id="rq-q"),
        pytest.param("POST", "/teams/{team_id}/data/run-query/", "run-query", id="rq/"),
        pytest.param("POST", "/teams/a/d%61ta/run-query", "run-query", id="rq-escape"),
        pytest.param("POST", "/teams/{team_id}/members/invite", "invite", id="invite"),
        pytest.param("PUT", "/users/me/avatar", "avatar", id="avatar"),
        pytest.param("GET", "/teams/{team_id}/data/run-query", "global", id="get-rq"),
        pytest.param("PUT", "/teams/{team_id}/members/invite", "global", id="put-inv"),
        pytest.param("POST", "/teams/a/data/run-query/x", "global", id="below-rq"),
        pytest.param("POST", "/users/me/avatar", "global", id="post-avatar"),
        pytest.param("GET", "/users/me", "global", id="other"),
    ],
)
def test_a_request_draws_on_the_budget_the_server_counts_it_against(
    tmp_path, method, path, key
):
    """A request naming a limited endpoint is paced by its rule; others by global."""
    text = REQUEST_HEADER + f"r,request,acme,,{method},{path}\n"
    [job] = read_jobs(write(tmp_path, text))
    assert job.key.value == key


@pytest.mark.parametrize(
    ("method", "safe"),
    [("GET", True), ("PUT", True), ("DELETE", True), ("POST", False), ("PATCH", False)],
)
def test_a_request_is_safe_to_repeat_by_its_method(tmp_path, method, safe):
    """RFC 9110: GET, PUT, DELETE may be repeated; POST and PATCH may not, even
    to run-query's path."""
    text = REQUEST_HEADER + f"r,request,acme,,{method},/teams/acme/data/run-query\n"
    [job] = read_jobs(write(tmp_path, text))
    assert job.endpoint.safe_to_repeat is safe


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param(
            'r,request,,"{""a"": 1}",GET,/x',
            "a GET request carries no payload",
            id="get-payload",
        ),
        pytest.param(
            'r,request,,"{""a"": 1}",DELETE,/x',
            "a DELETE request carries no payload",
            id="delete-payload",
        ),
        pytest.param(
            "r,request,,,GET,/teams/{team_id}/x",
            "team_id is missing: the path holds {team_id}",
            id="placeholder-no-team",
        ),
        pytest.param(
            "r,request,a/b,,GET,/teams/{team_id}/x",
            "team_id 'a/b' may hold only",
            id="placeholder-bad-team",
        ),
        pytest.param("r,request,,,FETCH,/x", "unknown method 'FETCH'", id="method"),
        pytest.param("r,request,,,,/x", "method is missing", id="no-method"),
        pytest.param("r,request,,,GET,", "path is missing", id="no-path"),
        pytest.param("r,request,,,GET,/a/../b", "'..' step", id="dot-dot"),
        pytest.param(
            "r,run-query,acme,,GET,",
            "method is for request jobs: a run-query job goes to its own endpoint",
            id="typed-with-method",
        ),
        pytest.param(
            "r,avatar,,,,/users/me",
            "path is for request jobs: an avatar job goes to its own endpoint",
            id="typed-with-path",
        ),
    ],
)
def test_a_bad_request_row_is_named_by_line_and_reason(tmp_path, row, reason):
    """Each way a request row can be wrong is refused with its line and reason."""
    line, text = one_problem(tmp_path, REQUEST_HEADER + "ok,avatar,,,,\n" + row + "\n")
    assert line == 3
    assert reason in text


def test_a_header_naming_path_twice_is_refused(tmp_path):
    """Two `path` columns would leave it unclear where a request goes."""
    line, text = one_problem(tmp_path, "id,type,path,path\n1,request,/a,/b\n")
    assert (line, text) == (1, "the header names path more than once")
