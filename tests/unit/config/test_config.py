from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ctu.config.schema import Config, ConfigError, load_config, parse_override, save_config, to_dict


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_yaml_and_dotted_overrides(tmp_path):
    p = write(tmp_path, "model:\n  path: tiny-random\nenv:\n  domains: [mini, retail]\n")
    cfg = load_config(p, ["sampling.temperature=0.7", "env.max_turns=3", "eval.max_tasks=null",
                          "env.weights.mini=2"])
    assert isinstance(cfg, Config)
    assert cfg.model.path == "tiny-random" and cfg.env.domains == ["mini", "retail"]
    assert cfg.sampling.temperature == 0.7 and cfg.env.max_turns == 3 and cfg.eval.max_tasks is None
    assert cfg.env.weights == {"mini": 2.0} and isinstance(cfg.env.weights["mini"], float)


@pytest.mark.parametrize("override, message", [
    ("sampling.temprature=1", "unknown key 'sampling.temprature'"),
    ("nosuch.key=1", "unknown key 'nosuch'"),
    ("env.max_turns=abc", "env.max_turns: expected int, got str"),
    ("env.max_turns=true", "env.max_turns: expected int, got bool"),
    ("engine.kind=tpu", "engine.kind: must be one of"),
    ("env.domains=[mini, moon]", "env.domains[1]: unknown domain 'moon'"),
    ("env.domains=['mod:']", "env.domains[0]: 'mod:' is not 'package.module:function'"),
    ("env.max_turns=0", "env.max_turns: must be >= 1"),
    ("engine.kv_cache_tokens=0", "engine.kv_cache_tokens: must be >= 1"),
    ("sampling.top_p=1.5", "sampling.top_p"),
    ("sampling.top_k=-1", "sampling.top_k: must be >= 0"),
    ("engine.kind=remote", "engine.base_url: required"),
    ("env.weights.retail=1", "env.weights.retail: not one of env.domains"),
    ("env=3", "env: expected a mapping"),
    ("badly formed", "must look like section.key=value"),
])
def test_bad_configs_fail_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_sampling_top_k_reaches_the_engines_params():
    from ctu.rollout.components import sampling_params

    assert sampling_params(load_config(None, ["sampling.top_k=20"])).top_k == 20
    assert sampling_params(load_config(None, [])).top_k == 0


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [1, 2"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n"))


@dataclass
class _WithSecret:
    api_key: str = "sk-should-vanish"
    nested: dict = field(default_factory=lambda: {"auth_token": "tok-should-vanish", "keep": 1})


def test_saved_config_has_no_secrets_and_round_trips(tmp_path):
    scrubbed = str(to_dict(_WithSecret()))
    assert "should-vanish" not in scrubbed and "'keep': 1" in scrubbed
    cfg = load_config(None, ["engine.base_url=http://x/v1", "engine.kind=remote", "engine.api_key_env=OPENAI_API_KEY"])
    save_config(cfg, tmp_path / "run" / "config.yaml")
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["engine"]["api_key_env"] == "OPENAI_API_KEY"  # the variable's name, never its value
    assert load_config(tmp_path / "run" / "config.yaml") == cfg


def test_override_values_are_yaml():
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override("a.b=") == ("a.b", "")
    assert parse_override("a.b=x=y") == ("a.b", "x=y")
    assert load_config(None, ["sampling.temperature=1e-1"]).sampling.temperature == 0.1  # YAML 1.1 reads a string


@pytest.mark.parametrize("preset", sorted(p.name for p in Path("configs").glob("*.yaml")))
def test_every_preset_loads_and_validates(preset):
    cfg = load_config(f"configs/{preset}")
    assert cfg.trainer.max_steps >= 1 and cfg.env.domains


def test_off_reads_as_the_word_in_a_literal_choice(tmp_path):
    """YAML 1.1 reads a bare ``off`` as False: ``trainer.autocast=off`` (and ``autocast: off`` in a file) mean the
    choice 'off', not a type error; a bool stays an error where the choice has no such word."""
    assert load_config(None, ["trainer.autocast=off"]).trainer.autocast == "off"
    assert load_config(write(tmp_path, "trainer:\n  autocast: off\n")).trainer.autocast == "off"
    with pytest.raises(ConfigError, match="engine.kind: must be one of"):
        load_config(None, ["engine.kind=off"])


@pytest.mark.parametrize("variant, message", [
    ("alltools", "env.retrieval_variant: banking_knowledge retrieval variant 'alltools' needs network access"),
    ("bm26", "env.retrieval_variant: unknown banking_knowledge retrieval variant 'bm26'"),
])
def test_banking_knowledge_retrieval_variant_is_one_of_the_offline_ones(variant, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["env.domains=[banking_knowledge]", f"env.retrieval_variant={variant}"])
    assert message in str(err.value)
    assert load_config(None, ["env.domains=[banking_knowledge]", "env.retrieval_variant=grep_only"])
