import pytest


@pytest.fixture(scope="session")
def chat_format():
    from transformers import AutoTokenizer

    from ctu.chat import ChatFormat
    from ctu.models import smollm2_tokenizer_dir

    return ChatFormat(AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()))
