"""Reading supervised data files: a JSON array in linear time as JSON Lines is, and every malformed file (content
after the array, nesting too deep for Python's JSON reader, a missing comma) one error naming the file and line."""

import json

import pytest

from ctu.episode.data.conversations import DataError
from ctu.episode.data.sft import read_conversations
from tests.support.timing import thread_cpu_seconds


def record(n: int) -> dict:
    return {"messages": [{"role": "user", "content": f"where is order #{n}?"},
                         {"role": "assistant", "content": f"Order #{n} ships tomorrow."}]}


def cpu_seconds(path) -> float:
    return thread_cpu_seconds(read_conversations, path)[1]


def test_a_json_array_reads_in_time_linear_like_json_lines(tmp_path):
    records = [record(n) for n in range(15_000)]  # 1.9 MB: quadratic line counting took 10 s here
    (tmp_path / "a.json").write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = cpu_seconds(tmp_path / "a.jsonl")
    array = cpu_seconds(tmp_path / "a.json")
    assert array < 3 * lines + 0.5, f"array {array:.2f}s vs JSON Lines {lines:.2f}s of CPU"


def test_array_records_carry_the_line_they_start_on(tmp_path):
    (tmp_path / "a.json").write_text("[" + json.dumps(record(0)) + ",\n\n" + json.dumps(record(1), indent=1)
                                     + ",\n" + json.dumps(record(2)) + "]")
    assert [c.extra["line"] for c in read_conversations(tmp_path / "a.json")] == [1, 3, 15]


def test_content_after_the_array_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps([record(0)]) + "\n" + json.dumps(record(1)) + "\n" + json.dumps(record(2)) + "\n")
    with pytest.raises(DataError) as info:
        read_conversations(path)
    assert str(info.value).startswith(f"{path}:2: content after the JSON array that ends on line 1")


@pytest.mark.parametrize("text,line,message", [
    ('[{"messages": []}\n {"messages": []}]', 2, "expected ',' or ']'"),
    ('[\n' + json.dumps(record(0)) + ',\n', 2, "the JSON array is not closed"),
    ('[\n' + json.dumps(record(0)) + ',\n]', 3, "not valid JSON"),
])
def test_a_broken_array_names_the_line(tmp_path, text, line, message):
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as info:
        read_conversations(path)
    assert str(info.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("name,wrap", [("deep.json", lambda s: "[\n" + s + "\n]"), ("deep.jsonl", lambda s: s)])
def test_deep_nesting_is_an_error_naming_file_and_line_not_a_recursion_error(tmp_path, name, wrap):
    deep = json.dumps({"messages": [], "x": "@"}).replace('"@"', "[" * 100_000 + "]" * 100_000)
    path = tmp_path / name
    path.write_text(wrap(json.dumps(record(0)) + ",\n" * name.endswith(".json") + "\n" * name.endswith("l") + deep))
    with pytest.raises(DataError) as info:
        read_conversations(path)
    assert str(info.value).startswith(f"{path}:{3 if name.endswith('.json') else 2}: nested too deeply")


def test_json_lines_split_on_newlines_only(tmp_path):
    path = tmp_path / "sep.jsonl"  # U+2028 and U+0085 are legal inside JSON strings; str.splitlines splits on them
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"a{sep}b"},
                                                     {"role": "assistant", "content": "ok"}]}, ensure_ascii=False)
                            + "\n" for sep in ("\u2028", "\x85", "\x1c")))
    conversations = read_conversations(path)
    assert [c.extra["line"] for c in conversations] == [1, 2, 3]
    assert conversations[0].messages[0]["content"] == "a\u2028b"


def test_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([record(0)]).encode())
    assert len(read_conversations(path)) == 1
