"""`ctu train` attached to a served engine whose server accepts connections and never answers: it waited 5 x 300 s
without a word; now `engine.timeout` bounds each request and the command ends in one line naming the URL."""

import time

from ctu.app.cli import main
from tests.fakes.chat_server import SilentServer


def test_train_on_a_server_that_never_answers_ends_in_one_line_naming_it(tmp_path, capsys):
    with SilentServer() as server:
        root = server.base_url[: -len("/v1")]
        started = time.monotonic()
        code = main(["train", "model.path=tiny-random", "engine.kind=served", f"engine.base_url={server.base_url}",
                     "engine.timeout=0.5", "engine.max_retries=1", "lora.enabled=true", f"run.dir={tmp_path / 'run'}",
                     "trainer.max_steps=1"])
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 1 and took < 60, (code, took, err)
    (line,) = [x for x in err.splitlines() if x.startswith("ctu: error:")]
    assert f"{root}/health failed after 2 attempts (last error: ReadTimeout)" in line, err
