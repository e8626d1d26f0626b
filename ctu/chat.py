"""Chat templating and the one tokenization path (token-in-token-out).

An episode's token sequence is only ever appended to: the prompt's ids, then each
assistant turn's sampled ids verbatim (loss mask 1, the end-of-turn token included),
then the ids of the messages that follow it (tool results, user replies; mask 0). Those
observation ids come from rendering a fixed base conversation plus the new messages and
slicing off everything up to the base assistant turn's end-of-turn token, so the ids
are exactly what the template puts between two assistant turns — never a re-tokenized
history. Every render goes through :meth:`ChatFormat.render`, which passes
``enable_thinking`` (Qwen3) every time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERMES_TEMPLATE = Path(__file__).parent / "templates" / "hermes.jinja"
_BASE_MARKER = "ctu-base-assistant-turn"
_BASE = ({"role": "system", "content": "ctu"}, {"role": "user", "content": "ctu"},
         {"role": "assistant", "content": _BASE_MARKER})


class TemplateError(ValueError):
    """A chat template that cannot be used token-in-token-out; the message names the template."""


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: string content, tool-call arguments as objects."""
    out = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass  # rendered as the string the model wrote
            calls.append({"type": "function", "function": {"name": fn.get("name", ""), "arguments": args}})
        out["tool_calls"] = calls
    for key in ("name", "tool_call_id", "reasoning_content"):
        if key in message:
            out[key] = message[key]
    return out


class ChatFormat:
    """Renders conversations with one template and turns them into token ids."""

    def __init__(self, tokenizer, template: str | None = None, enable_thinking: bool = False):
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.template, self.template_name = self._choose_template(tokenizer, template)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*([im_end] if im_end is not None else []), *eos]))
        if not self.stop_token_ids:
            raise TemplateError(f"tokenizer has neither an EOS token nor <|im_end|>: cannot end turns ({self.template_name})")
        self.end_of_turn = tokenizer.decode([self.stop_token_ids[0]])
        self._observation_cache: dict[str, list[int]] = {}

    @staticmethod
    def _choose_template(tokenizer, template: str | None) -> tuple[str, str]:
        if template is not None:
            path = Path(template)
            if not path.is_file():
                raise TemplateError(f"chat template file {template} does not exist")
            return path.read_text(), str(path)
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, str) and "tools" in own and "tool_call" in own:
            return own, "the tokenizer's own template"
        return HERMES_TEMPLATE.read_text(), "ctu hermes template"

    # -- rendering -------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                [normalize_message(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt, chat_template=self.template,
                enable_thinking=self.enable_thinking)
        except Exception as exc:  # jinja errors: say which template and what was rendered
            raise TemplateError(f"{self.template_name} failed to render {len(messages)} message(s): {exc}") from exc

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """The first prompt: the conversation so far and the generation prompt."""
        if not messages:
            raise ValueError("a prompt needs at least one message (the episode has not been reset?)")
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def _after_base_turn(self, text: str) -> str:
        marker = text.find(_BASE_MARKER)
        end = text.find(self.end_of_turn, marker) if marker >= 0 else -1
        if end < 0:
            raise TemplateError(f"{self.template_name}: cannot find the end of the assistant turn "
                                f"({self.end_of_turn!r}) after its content")
        return text[end + len(self.end_of_turn):]

    def observation_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        full = self.render([*_BASE, *messages], add_generation_prompt=True)
        return self._after_base_turn(full)

    def observation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids of non-assistant messages that follow an assistant turn, with the next generation prompt.

        They start right after the end-of-turn token the model sampled (e.g. the newline after
        ``<|im_end|>``) and end with the assistant header the model continues from.
        """
        for m in messages:
            if m.get("role") == "assistant":
                raise ValueError("observation_ids takes tool/user messages only; assistant turns are sampled ids")
        key = json.dumps([normalize_message(m) for m in messages], sort_keys=True)
        cached = self._observation_cache.get(key)
        if cached is None:
            cached = self.encode(self.observation_text(messages))
            if len(self._observation_cache) < 4096:
                self._observation_cache[key] = cached
        return list(cached)

    def render_assistant_text(self, message: Mapping[str, Any]) -> str:
        """The exact text the template gives an assistant turn, through its end-of-turn token."""
        prompt = self.render(_BASE[:2], add_generation_prompt=True)
        full = self.render([*_BASE[:2], message], add_generation_prompt=False)
        if not full.startswith(prompt):
            # templates that render the last assistant turn differently from the generation prompt
            # (none of ours) cannot provide SFT targets that match sampling
            raise TemplateError(f"{self.template_name}: an assistant turn does not extend the generation prompt")
        turn = full[len(prompt):]
        end = turn.find(self.end_of_turn)
        if end < 0:
            raise TemplateError(f"{self.template_name}: no end-of-turn token in a rendered assistant turn")
        return turn[: end + len(self.end_of_turn)]

    def decode_generated(self, ids: Sequence[int]) -> str:
        """The raw text of one sampled turn, without its end-of-turn/EOS tokens (special tokens kept)."""
        ids = list(ids)
        while ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@dataclass
class TokenSequence:
    """An episode's tokens, built by appending only."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    _spans: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def start(cls, prompt_ids: Sequence[int]) -> TokenSequence:
        return cls(list(prompt_ids))

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} generated ids but {len(logprobs)} logprobs")
        start = len(self.response_ids)
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        if ids:
            self._spans.append((start, len(self.response_ids)))

    def add_observation(self, ids: Sequence[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def assistant_spans(self) -> list[tuple[int, int]]:
        """(start, end) of each sampled turn within ``response_ids``."""
        return list(self._spans)
