"""A domain whose system prompt and tools alone exceed env.max_context_tokens would score every episode 0 at
turn 0: warned once, naming the domain, the prompt's tokens and the limit."""

from ctu.app.cli import main
from ctu.domains import get_domain
from ctu.episode.env import system_prompt
from ctu.rollout.loop import prompt_budget_warnings


def test_only_a_domain_whose_prompt_does_not_fit_is_named(chat_format):
    telecom, mini = get_domain("telecom"), get_domain("mini")
    tokens = len(chat_format.prompt_ids([{"role": "system", "content": system_prompt(telecom)}],
                                        telecom.openai_tools()))
    assert tokens > 1024
    assert prompt_budget_warnings(chat_format, [mini, telecom], 1024) == [
        f"domain telecom: the system prompt and tools are {tokens} tokens, at or over env.max_context_tokens=1024: "
        "every episode ends at turn 0 and scores 0; raise env.max_context_tokens or use a shorter template"]
    assert prompt_budget_warnings(chat_format, [mini, telecom], tokens + 1) == []


def test_eval_warns_once_before_scoring_everything_zero(tmp_path, capsys):
    assert main(["eval", "configs/quickstart.yaml", "model.path=tiny-random", "env.domains=[telecom]",
                 f"run.dir={tmp_path}", "eval.max_tasks=3"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "env.max_context_tokens" in line]
    assert len(warnings) == 1 and warnings[0].startswith("ctu: warning: domain telecom: the system prompt and tools "
                                                         "are ") and "env.max_context_tokens=1024" in warnings[0]
    assert "telecom: success 0.000 over 3 episodes" in captured.out


def test_plan_notes_size_each_domains_prompt_per_task_where_it_depends_on_the_task(chat_format, tau2_bench_data):
    from ctu.domains.banking_knowledge import load
    from ctu.rollout.loop import prompt_notes, prompt_tokens

    golden, full = load(tau2_bench_data, "golden_retrieval"), load(tau2_bench_data, "full_kb")
    sizes = prompt_tokens(chat_format, golden)
    assert len(sizes) == 97 and max(sizes) > 2 * min(sizes)  # each task inlines its own documents
    [note] = prompt_notes(chat_format, [golden], 65536)
    assert note == (f"domain banking_knowledge: system prompt and tools {min(sizes):,} to {max(sizes):,} (per task) "
                    "tokens of env.max_context_tokens=65,536")
    [note] = prompt_notes(chat_format, [full], 32768)
    assert note.endswith("tokens of env.max_context_tokens=32,768: episodes end at turn 0 and score 0")
    assert prompt_budget_warnings(chat_format, [golden], max(sizes))  # the largest task's prompt is the one checked
