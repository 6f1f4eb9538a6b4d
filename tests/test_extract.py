"""Some jobs of a jobs file as a jobs file of their own (jobs/extract.py)."""

from __future__ import annotations

import json
import re

import pytest

from batchrun.core.errors import UsageError
from batchrun.jobs.extract import extract
from batchrun.jobs.job import read_jobs

CSV = (
    "\ufeffid,type,team_id,payload,note\r\n"
    'a,run-query,t1,"{""q"": 1}",first\r\n'
    "\r\n"
    'b,invite,t2,"{""email"": ""x@y.z""}","with, comma"\r\n'
    "c,avatar,,,\r\n"
)


def test_a_csv_copy_keeps_the_header_and_the_wanted_rows(tmp_path):
    """The copy has every column of the source (extra ones too), the wanted rows
    in file order, and reads back as the same jobs."""
    source = tmp_path / "jobs.csv"
    source.write_text(CSV, encoding="utf-8")
    dest = tmp_path / "failed.csv"
    found = extract(source, dest, {"c", "b"})
    assert found.written == 2
    assert found.missing == frozenset()
    lines = dest.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id,type,team_id,payload,note"
    assert lines[1] == 'b,invite,t2,"{""email"": ""x@y.z""}","with, comma"'
    assert lines[2] == "c,avatar,,,"
    wanted = [job for job in read_jobs(source) if job.id in {"b", "c"}]
    assert read_jobs(dest) == [
        type(job)(job.id, job.type, job.team_id, job.payload, n + 2)
        for n, job in enumerate(wanted)
    ]


def test_a_jsonl_copy_keeps_each_object(tmp_path):
    """JSON Lines stay JSON Lines: each wanted object, payload as an object."""
    source = tmp_path / "jobs.jsonl"
    rows = [
        {"id": 1, "type": "run-query", "team_id": "t", "payload": {"q": "é"}},
        {"id": "2", "type": "avatar", "extra": [1]},
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    dest = tmp_path / "failed.jsonl"
    found = extract(source, dest, {"1", "9"})
    assert found.written == 1
    assert found.missing == frozenset({"9"})
    assert [json.loads(line) for line in dest.read_text().splitlines()] == rows[:1]


def test_no_wanted_row_still_makes_a_jobs_file(tmp_path):
    """With nothing to copy, the copy is a header: a valid, empty jobs file."""
    source = tmp_path / "jobs.csv"
    source.write_text(CSV, encoding="utf-8")
    dest = tmp_path / "none.csv"
    assert extract(source, dest, set()).written == 0
    assert dest.read_bytes() == b"id,type,team_id,payload,note\r\n"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        pytest.param("jobs.csv", "is the jobs file itself", id="the-source"),
        pytest.param(
            "failed.jsonl", "is CSV (.csv); name the copy so too", id="format"
        ),
        pytest.param("no/such/folder/failed.csv", "cannot write", id="no-folder"),
    ],
)
def test_a_bad_destination_is_refused(tmp_path, name, said):
    """The jobs file is never overwritten, the format never changes, and a copy
    that cannot be written says so and leaves no temporary file behind."""
    source = tmp_path / "jobs.csv"
    source.write_text(CSV, encoding="utf-8")
    with pytest.raises(UsageError, match=re.escape(said)):
        extract(source, tmp_path / name, {"a"})
    assert source.read_bytes() == CSV.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.csv"]
