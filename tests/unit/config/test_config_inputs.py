"""Config inputs that used to pass silently or fail without naming their file: duplicate YAML keys, bytes that are
not UTF-8, integers too long for Python to read or too large for a seed, repeated domains, ports out of range."""

import pytest

from ctu.app.cli import main
from ctu.config.schema import ConfigError, load_config


def refused(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_repeated_section_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lr: 0.1\nrun:\n  seed: 1\ntrainer:\n  max_steps: 3\n")
    assert refused(path) == f"{path}:5: key 'trainer' appears twice in one mapping (first on line 1); merge them"


def test_a_repeated_nested_key_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lr: 0.1\n  lr: 0.2\n")
    assert refused(path).startswith(f"{path}:3: key 'lr' appears twice")


def test_bytes_that_are_not_utf8_name_the_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"run:\n  seed: 1\n  dir: \xff\xfe\n")
    assert refused(path) == f"{path}:3: not valid UTF-8 (byte 0xff)"


@pytest.mark.parametrize("digits", [5000, 100_000])
def test_an_integer_too_long_to_read_names_the_file_and_line(tmp_path, digits):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  dir: x\n  seed: " + "1" * digits + "\n")
    message = refused(path)
    assert message.startswith(f"{path}:3: an integer of {digits} digits")
    assert len(message) < 300


def test_an_integer_too_long_in_an_override_names_the_override():
    message = refused(None, ["run.seed=" + "7" * 5000])
    assert message.startswith("override 'run.seed': an integer of 5000 digits")


@pytest.mark.parametrize("key", ["run.seed", "sampling.seed"])
@pytest.mark.parametrize("value", [2**64, -1, 10**30])
def test_a_seed_out_of_range_is_refused(key, value):
    assert refused(None, [f"{key}={value}"]) == f"{key}: must be in [0, {2**32 - 1}], got {value}"


def test_any_integer_beyond_64_bits_is_refused():
    assert refused(None, [f"trainer.max_steps={2**70}"]).startswith("trainer.max_steps: must be at most")


def test_a_domain_named_twice_is_refused():
    assert refused(None, ["env.domains=[mini, mini]"]) == (
        "env.domains[1]: 'mini' is already env.domains[0]; each domain is listed once "
        "(env.weights sets how often one is drawn)")


@pytest.mark.parametrize("url", ["http://localhost:99999999/v1", "http://localhost:65536", "http://u:p@h:0x1/v1"])
def test_a_port_out_of_range_is_refused_at_load(url):
    message = refused(None, [f"user.base_url={url}"])
    assert message.startswith("user.base_url: the port must be a number in 0-65535")
    assert "p@" not in message


def test_a_good_port_passes():
    load_config(None, ["user.base_url=http://localhost:8000/v1"])


def test_the_cli_prints_one_line_naming_the_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lr: 0.1\ntrainer:\n  max_steps: 3\n")
    assert main(["plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == (f"ctu: config error: {path}:3: key 'trainer' appears twice in one mapping (first on "
                           "line 1); merge them")
