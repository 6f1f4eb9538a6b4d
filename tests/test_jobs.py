"""Reading and validating jobs files (CONTRACT.md section 1), CSV and JSONL."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchrun.errors import JobsFileError
from batchrun.jobs import Job, JobType, read_jobs, summarize

HEADER = "id,type,team_id,payload\n"


def write(tmp_path, text, name="jobs.csv"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def problems(tmp_path, text, name="jobs.csv"):
    """The (line, reason) pairs of a file that must be refused."""
    with pytest.raises(JobsFileError) as info:
        read_jobs(write(tmp_path, text, name))
    return info.value.problems


def test_reads_each_type_with_its_request(tmp_path):
    """Each type becomes its method, path and limit key."""
    jobs = read_jobs(
        write(
            tmp_path,
            HEADER + 'q,run-query,acme,"{""sql"": 1}"\ni,invite,acme,\na,avatar,,\n',
        )
    )
    assert [(j.endpoint.method, j.path, j.key.value) for j in jobs] == [
        ("POST", "/teams/acme/data/run-query", "run-query"),
        ("POST", "/teams/acme/members/invite", "invite"),
        ("PUT", "/users/me/avatar", "avatar"),
    ]
    assert jobs[0].payload == {"sql": 1}
    assert jobs[1].payload == {}


def test_bom_crlf_blank_lines_and_extra_columns(tmp_path):
    """A BOM, \\r\\n line ends, blank lines and extra columns are all fine."""
    text = "\ufeffid,type,team_id,payload,owner\r\n\r\na,avatar,,,me\r\n  \r\nb,avatar,,,you\r\n"
    jobs = read_jobs(write(tmp_path, text))
    assert [(j.id, j.line) for j in jobs] == [("a", 3), ("b", 5)]


def test_quoted_multiline_payload_keeps_line_numbers(tmp_path):
    """A payload spanning lines is one row; the next row keeps its own line number."""
    text = HEADER + 'a,avatar,,"{""x"":\n1}"\nb,bogus,,\n'
    assert problems(tmp_path, text) == [
        (4, "type is 'bogus' (expected run-query, invite, avatar)")
    ]


def test_team_id_is_not_needed_for_avatar(tmp_path):
    """An avatar job needs no team and ignores one given."""
    [job] = read_jobs(write(tmp_path, "id,type,team_id\na,avatar,../x\n"))
    assert job.team_id is None


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param("a,fax,t,", "type is 'fax'", id="unknown-type"),
        pytest.param("a,,t,", "type is missing", id="missing-type"),
        pytest.param(",run-query,t,", "id is empty", id="empty-id"),
        pytest.param("  ,run-query,t,", "id is empty", id="blank-id"),
        pytest.param("a,run-query,,", "team_id is missing", id="missing-team"),
        pytest.param("a,invite,a/b,", "team_id 'a/b' may hold only", id="slash"),
        pytest.param("a,invite,..,", "team_id '..'", id="dot-dot"),
        pytest.param("a,invite,.,", "team_id '.'", id="dot"),
        pytest.param("a,invite,a%2Fb,", "team_id 'a%2Fb'", id="percent"),
        pytest.param("a,invite,a b,", "team_id 'a b'", id="space"),
        pytest.param("a,invite,a\tb,", "team_id 'a\\tb'", id="control"),
        pytest.param("a,invite,t,{oops", "payload is not valid JSON", id="bad-json"),
        pytest.param(
            'a,invite,t,"[1,2]"', "payload must be a JSON object, got list", id="list"
        ),
        pytest.param(
            "a,invite,t,42", "payload must be a JSON object, got int", id="number"
        ),
    ],
)
def test_bad_csv_rows_are_named_by_line_and_reason(tmp_path, row, reason):
    """Each bad row is refused with its line number and a reason a person understands."""
    [(line, text)] = problems(tmp_path, HEADER + "ok,avatar,,\n" + row + "\n")
    assert line == 3
    assert reason in text


def test_duplicate_id_names_both_lines(tmp_path):
    """A repeated id names the line where it first appeared."""
    text = HEADER + "a,avatar,,\nb,avatar,,\na,avatar,,\n"
    assert problems(tmp_path, text) == [(4, "duplicate id 'a' (first on line 2)")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("", "the file is empty", id="empty"),
        pytest.param("\n\n", "the file is empty", id="only-blank-lines"),
        pytest.param(
            "id,kind\na,avatar\n", "lacks column(s) type", id="missing-column"
        ),
        pytest.param("a,avatar\n", "lacks column(s) id, type", id="no-header"),
    ],
)
def test_bad_files_are_refused_as_a_whole(tmp_path, text, reason):
    """Files with no usable header are refused with one clear problem."""
    [(_, text_)] = problems(tmp_path, text)
    assert reason in text_


def test_header_only_is_an_empty_valid_file(tmp_path):
    """A header with no rows holds zero jobs."""
    assert read_jobs(write(tmp_path, HEADER)) == []


def test_non_utf8_bytes_name_their_line(tmp_path):
    """Bytes that are not UTF-8 are refused, naming the line they are on."""
    assert problems(tmp_path, b"id,type\nok,avatar\nx\xff,avatar\n") == [
        (3, "not UTF-8 text (save the file as UTF-8)")
    ]


def test_missing_file_and_folder_are_refused(tmp_path):
    """A path that does not exist, or is a folder, gets a clear message."""
    for path, reason in ((tmp_path / "nope.csv", "no such file"), (tmp_path, "folder")):
        with pytest.raises(JobsFileError) as info:
            read_jobs(path)
        assert reason in info.value.message
        assert "Nothing was sent" in info.value.message


def test_more_than_20_problems_are_counted(tmp_path):
    """The first 20 problems are shown, the rest counted."""
    rows = "".join(f"j{i},fax,t,\n" for i in range(25))
    with pytest.raises(JobsFileError) as info:
        read_jobs(write(tmp_path, HEADER + rows))
    assert info.value.total == 25
    assert len(info.value.problems) == 20
    assert info.value.message.endswith("... and 5 more")
    assert "line 21:" in info.value.message
    assert "line 22:" not in info.value.message


def test_jsonl_reads_objects_with_object_payloads(tmp_path):
    """JSON Lines: one object per line, payload an object, integer ids allowed."""
    lines = [
        {"id": 7, "type": "invite", "team_id": "t", "payload": {"email": "a@b.c"}},
        {"id": "x", "type": "avatar", "extra": True},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n\n"
    jobs = read_jobs(write(tmp_path, text, "jobs.jsonl"))
    assert jobs == [
        Job("7", JobType.INVITE, "t", line=1),
        Job("x", JobType.AVATAR, None, line=2),
    ]
    assert jobs[0].payload == {"email": "a@b.c"}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param("{not json", "not valid JSON", id="bad-json"),
        pytest.param("[1]", "expected a JSON object, got list", id="not-object"),
        pytest.param('{"id": true, "type": "avatar"}', "id is a bool", id="bool-id"),
        pytest.param('{"id": 1.5, "type": "avatar"}', "id is a float", id="float-id"),
        pytest.param('{"type": "avatar"}', "id is missing", id="missing-id"),
        pytest.param(
            '{"id": "a", "type": "avatar", "payload": [1]}',
            "got list",
            id="list-payload",
        ),
        pytest.param('{"id": "a", "type": 3}', "type is 3", id="type-not-string"),
        pytest.param(
            '{"id": "a", "type": "invite", "team_id": 5}',
            "team_id is missing",
            id="team-not-string",
        ),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, line, reason):
    """Each bad JSON line is refused with its line number and reason."""
    [(number, text)] = problems(
        tmp_path, '{"id": "ok", "type": "avatar"}\n' + line + "\n", "j.jsonl"
    )
    assert number == 2
    assert reason in text


def test_team_id_is_percent_encoded_into_one_path_segment():
    """Even a team id that slipped past validation stays one path segment."""
    job = Job("a", JobType.INVITE, "a/../b")
    assert job.path == "/teams/a%2F..%2Fb/members/invite"


def test_summary_counts_types_and_teams(tmp_path):
    """summarize counts jobs per type and per team."""
    text = HEADER + "a,run-query,x,\nb,run-query,y,\nc,invite,x,\nd,avatar,,\n"
    summary = summarize(read_jobs(write(tmp_path, text)))
    assert summary.total == 4
    assert summary.per_type == {
        JobType.RUN_QUERY: 2,
        JobType.INVITE: 1,
        JobType.AVATAR: 1,
    }
    assert summary.per_team == {"x": 2, "y": 1}


def test_large_payload_fields_are_accepted(tmp_path):
    """A payload larger than the csv module's default field limit is read."""
    big = json.dumps({"blob": "x" * 300_000}).replace('"', '""')
    [job] = read_jobs(write(tmp_path, HEADER + f'a,avatar,,"{big}"\n'))
    assert len(job.payload["blob"]) == 300_000


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.lists(
            st.lists(
                st.sampled_from(
                    [
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
                        "{}",
                        "..",
                        "\x00",
                        "é",
                        "\r",
                        ",",
                        "\n",
                    ]
                ),
                max_size=6,
            ),
            max_size=6,
        ).map(lambda rows: "\n".join(",".join(r) for r in rows).encode()),
    ),
    jsonl=st.booleans(),
)
def test_any_bytes_give_jobs_or_a_jobs_file_error(tmp_path, data, jsonl):
    """Fuzz: whatever the bytes, reading returns jobs or raises JobsFileError only."""
    path = tmp_path / ("f.jsonl" if jsonl else "f.csv")
    path.write_bytes(data)
    jobs: list[Job] = []
    error = None
    try:
        jobs = read_jobs(path)
    except JobsFileError as exc:
        error = exc
    assert all(isinstance(j, Job) for j in jobs)
    assert error is None or (error.total >= 1 and error.message)
