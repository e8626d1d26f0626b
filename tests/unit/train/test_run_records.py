"""A run's record files (metrics.jsonl, eval/history.jsonl) read whole before a resume: a torn last line is
dropped and the file repaired, a record without its newline is kept, anything else damaged names file and line."""

import json

import pytest

from ctu.app.resume import RecordError, repair_records, split_records

A, B = b'{"step": 1, "x": 0.5}', b'{"step": 2, "x": 0.25}'


@pytest.mark.parametrize("data,records,torn", [
    (b"", [], None),
    (A + b"\n" + B + b"\n", [1, 2], None),
    (A + b"\n\n" + B + b"\n", [1, 2], None),  # blank lines are skipped, as the readers do
    (A + b"\n" + B, [1, 2], None),  # a whole record whose newline was not written
    (A + b"\n" + B[:9], [1], B[:9]),  # cut short
    (A + b"\n" + b"\0" * 12, [1], b"\0" * 12),  # a power loss's zero-filled block
    (B[:5], [], B[:5]),
    (A + b"\n" + b'{"step": 2, "x": "\xe2\x82', [1], b'{"step": 2, "x": "\xe2\x82'),  # cut inside a UTF-8 character
])
def test_the_tail_after_the_last_newline_is_a_record_or_torn(tmp_path, data, records, torn):
    got, tail = split_records(tmp_path / "m.jsonl", data)
    assert [r["step"] for r in got] == records and tail == torn


@pytest.mark.parametrize("data,message", [
    (B[:9] + b"\n" + A + b"\n", "line 1: not JSON (Expecting value at column 10)"),
    (A + b"\n" + b"[1]\n" + B + b"\n", "line 2: not a record (a JSON object with an integer 'step')"),
    (A + b"\n" + b'{"step": "2"}\n', "line 2: not a record"),
    (A + b"\n" + b'{"step": true}', "line 2: not a record"),  # a whole last line that is no record is no tear
    (b'{"x": "\xff"}\n', "line 1: not valid UTF-8 (byte 0xff at offset 7)"),
    (A + b"\n" + B[:9] + b"\n", "line 2: not JSON"),  # a damaged line with its newline is not torn: refuse it
])
def test_a_damaged_line_that_is_not_a_torn_tail_names_file_and_line(tmp_path, data, message):
    path = tmp_path / "m.jsonl"
    path.write_bytes(data)
    with pytest.raises(RecordError, match=f"^{tmp_path / 'm.jsonl'}: " + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        repair_records(path)
    assert path.read_bytes() == data  # untouched


def test_repair_drops_a_torn_line_in_place_and_says_so(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_bytes(A + b"\n" + B + b"\n" + b'{"step": 3, "x')
    assert [r["step"] for r in repair_records(path)] == [1, 2]
    assert path.read_bytes() == A + b"\n" + B + b"\n"
    assert capsys.readouterr().err == (f"ctu: warning: {path}: dropped a torn last line (14 bytes without a newline: "
                                       "a write cut short); the rest is kept\n")
    assert [p.name for p in tmp_path.iterdir()] == ["m.jsonl"]  # no temporary left


def test_a_whole_last_record_gets_its_newline_so_the_next_append_starts_a_line(tmp_path, capsys):
    path = tmp_path / "m.jsonl"
    path.write_bytes(A + b"\n" + B)
    repair_records(path)
    with open(path, "a") as f:
        f.write(json.dumps({"step": 3}) + "\n")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert capsys.readouterr().err == ""


def test_a_missing_or_sound_file_is_left_alone(tmp_path):
    assert repair_records(tmp_path / "none.jsonl") == [] and not (tmp_path / "none.jsonl").exists()
    path = tmp_path / "m.jsonl"
    path.write_bytes(A + b"\n")
    before = path.stat().st_mtime_ns, path.stat().st_ino
    repair_records(path)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
