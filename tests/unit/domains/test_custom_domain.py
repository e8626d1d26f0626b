"""Domains of one's own: ``env.domains=[package.module:function]``."""

import pytest

from ctu.domains import get_domain
from ctu.episode.env import system_prompt


def test_a_module_function_loads_as_a_domain_with_its_own_instruction():
    domain = get_domain("tests.support.word_domain:load")
    assert domain.name == "word" and len(domain.split("train")) == 32 and len(domain.split("test")) == 8
    prompt = system_prompt(domain)
    assert "You work in a fruit shop." in prompt and "generate valid JSON" not in prompt
    assert "generate valid JSON" in system_prompt(get_domain("retail"))  # tau2's instruction otherwise


@pytest.mark.parametrize("spec, message", [
    ("tests.no_such_module:load", "cannot load 'load' from module 'tests.no_such_module'"),
    ("tests.support.word_domain:nothing", "cannot load 'nothing' from module 'tests.support.word_domain'"),
    ("tests.support.word_domain:FRUITS", "FRUITS is not callable"),
    ("tests.support.toy_domain:make_toy_domain", "takes 0 positional arguments"),
])
def test_bad_specs_name_what_failed(spec, message):
    with pytest.raises((KeyError, TypeError), match=message):
        get_domain(spec)
