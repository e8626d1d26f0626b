"""Chat templating and the one tokenization path (token-in-token-out).

An episode's token sequence is only ever appended to: the prompt's ids, then each
assistant turn's sampled ids verbatim (loss mask 1, the end-of-turn token included),
then the ids of the messages that follow it (tool results, user replies; mask 0). Those
observation ids come from rendering a fixed base conversation (system, user, assistant)
plus the new messages and keeping what follows the base assistant turn's end-of-turn
token: exactly the text the template puts between two assistant turns, starting with
the newline after ``<|im_end|>`` and ending with the next generation prompt. The history
is never re-tokenized. Every render goes through :meth:`ChatFormat.render`, which passes
``enable_thinking`` (Qwen3) every time.

Templates: a built-in name (``hermes``, ``compact``) or a ``.jinja`` file given by path; else the tokenizer's own if it knows tools;
else ctu's hermes template (``ctu/rollout/templates/hermes.jinja``: ChatML with Qwen2.5's tool
format, prefix-preserving). Qwen3-style templates re-render earlier assistant turns
(dropping ``<think>`` blocks before the last user query, and empty ones everywhere but
the final turn); the appended sequence keeps what the model actually saw and sampled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERMES_TEMPLATE = Path(__file__).parent / "templates" / "hermes.jinja"
# built-in templates, by name (model.template: compact): hermes, and hermes with one-line tool signatures
BUILTIN_TEMPLATES = {"hermes": HERMES_TEMPLATE, "compact": HERMES_TEMPLATE.with_name("compact.jinja")}
_BASE_MARKER = "ctu-base-assistant-turn"
_BASE = ({"role": "system", "content": "ctu"}, {"role": "user", "content": "ctu"},
         {"role": "assistant", "content": _BASE_MARKER})
# a longer history, to check that observations render the same whatever precedes them
_LONG_BASE = (*_BASE[:2],
              {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                     "function": {"name": "f", "arguments": {}}}]},
              {"role": "tool", "content": "ctu"}, {"role": "user", "content": "ctu"}, _BASE[2])
_PROBES = ([{"role": "tool", "content": "x"}], [{"role": "user", "content": "x"}],
           [{"role": "tool", "content": "x"}, {"role": "tool", "content": "y"}, {"role": "user", "content": "z"}])


class TemplateError(ValueError):
    """A chat template that cannot be used token-in-token-out; the message names the template."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return str(content)


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: string content, tool-call arguments as objects.

    Arguments that are not valid JSON stay the string the model wrote.
    """
    out = {"role": message["role"], "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass
            calls.append({"type": "function", "function": {"name": fn.get("name", ""), "arguments": args}})
        out["tool_calls"] = calls
    for key in ("name", "tool_call_id", "reasoning_content"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def _tool_aware(template: Any) -> str | None:
    """The tokenizer's own template if it renders tools (a string, or the 'tool_use' entry of several)."""
    if isinstance(template, Mapping):
        template = template.get("tool_use") or template.get("default")
    if isinstance(template, str) and "tools" in template and "tool_call" in template:
        return template
    return None


class ChatFormat:
    """Renders conversations with one template and turns them into token ids."""

    def __init__(self, tokenizer: Any, template: str | None = None, enable_thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.enable_thinking = bool(enable_thinking)
        self.template, self.template_name = self._choose_template(tokenizer, template)
        vocab = tokenizer.get_vocab()
        stops = [vocab["<|im_end|>"]] if "<|im_end|>" in vocab else []
        if tokenizer.eos_token_id is not None:
            stops.append(tokenizer.eos_token_id)
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(stops))
        if not self.stop_token_ids:
            raise TemplateError(f"{self.template_name}: the tokenizer has neither <|im_end|> nor an EOS token, "
                                "so turns cannot end")
        self.end_of_turn = tokenizer.decode([self.stop_token_ids[0]])
        self._observation_cache: dict[str, list[int]] = {}
        self._context = self.render(_BASE[:2])  # system + user: must open every base render
        self._generation_prompt = self.render(_BASE[:2], add_generation_prompt=True)
        self._base_head = self._after(self.render(_BASE), _BASE_MARKER, keep_head=True)
        self._check_observations()

    @staticmethod
    def _choose_template(tokenizer: Any, template: str | None) -> tuple[str, str]:
        if template in BUILTIN_TEMPLATES:
            return BUILTIN_TEMPLATES[template].read_text(), f"ctu {template} template"
        if template is not None:
            path = Path(template)
            if not path.is_file():
                raise TemplateError(f"chat template file {template} does not exist (built-in names: "
                                    f"{', '.join(BUILTIN_TEMPLATES)})")
            return path.read_text(), str(path)
        own = _tool_aware(getattr(tokenizer, "chat_template", None))
        if own is not None:
            return own, "the tokenizer's own template"
        return HERMES_TEMPLATE.read_text(), "ctu hermes template"

    # -- rendering -------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (thinking flag always passed)."""
        if not messages:
            raise ValueError(f"{self.template_name}: cannot render an empty conversation (no messages yet; "
                             "was the episode reset?)")
        try:
            return self.tokenizer.apply_chat_template(  # type: ignore[no-any-return]
                [normalize_message(m) for m in messages], tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt, chat_template=self.template,
                enable_thinking=self.enable_thinking)
        except Exception as exc:  # jinja errors: say which template and what was rendered
            raise TemplateError(f"{self.template_name} failed to render {len(messages)} message(s): "
                                f"{type(exc).__name__}: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """The first prompt: the conversation so far and the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    # -- observations ----------------------------------------------------------------------
    def _after(self, text: str, marker: str, keep_head: bool = False) -> str:
        """The text after the end-of-turn token that closes the assistant turn holding ``marker``."""
        at = text.find(marker)
        end = text.find(self.end_of_turn, at) if at >= 0 else -1
        if end < 0:
            raise TemplateError(f"{self.template_name}: no end-of-turn token ({self.end_of_turn!r}) after an "
                                "assistant turn's content")
        end += len(self.end_of_turn)
        return text[:end] if keep_head else text[end:]

    def _observation_text(self, base: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]) -> str:
        full = self.render([*base, *messages], add_generation_prompt=True)
        if base is _BASE and full.startswith(self._base_head):
            return full[len(self._base_head):]
        # Qwen3-style templates render an assistant turn differently once messages follow it
        # (its <think> block goes); the base turn itself is thrown away, so only what precedes
        # it must be unchanged.
        if not full.startswith(self._context):
            raise TemplateError(f"{self.template_name}: appending messages changes how the earlier conversation "
                                "renders, so it cannot be used token-in-token-out")
        return self._after(full, _BASE_MARKER)

    def observation_text(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """What the template puts after an assistant turn's end-of-turn token for ``messages``."""
        return self._observation_text(_BASE, messages)

    def _check_observations(self) -> None:
        for probe in _PROBES:
            if self._observation_text(_BASE, probe) != self._observation_text(_LONG_BASE, probe):
                raise TemplateError(f"{self.template_name}: tool results and user turns render differently "
                                    "depending on the earlier conversation; observations cannot be appended")

    def observation_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Ids of non-assistant messages that follow an assistant turn, with the next generation prompt.

        They start right after the end-of-turn token the model sampled (e.g. the newline after
        ``<|im_end|>``) and end with the assistant header the model continues from.
        """
        for m in messages:
            if m.get("role") == "assistant":
                raise ValueError("observation_ids takes tool/user messages only; assistant turns are sampled ids")
        key = json.dumps([normalize_message(m) for m in messages], sort_keys=True, default=str)
        cached = self._observation_cache.get(key)
        if cached is None:
            cached = self.encode(self.observation_text(messages))
            if len(self._observation_cache) < 4096:
                self._observation_cache[key] = cached
        return list(cached)

    # -- assistant turns -------------------------------------------------------------------
    def render_assistant_text(self, message: Mapping[str, Any]) -> str:
        """The exact text the template gives an assistant turn after the generation prompt, through
        its end-of-turn token: what the model must generate (SFT targets, tests)."""
        if message.get("role", "assistant") != "assistant":
            raise ValueError(f"render_assistant_text takes an assistant message, not {message.get('role')!r}")
        full = self.render([*_BASE[:2], {**message, "role": "assistant"}])
        if not full.startswith(self._generation_prompt):
            # e.g. Qwen3 with enable_thinking=False: the prompt holds an empty think block, the
            # message brings its own reasoning
            raise TemplateError(f"{self.template_name}: this assistant message does not extend the generation "
                                f"prompt {self._generation_prompt[len(self._context):]!r} (reasoning while "
                                f"enable_thinking={self.enable_thinking}?)")
        turn = full[len(self._generation_prompt):]
        end = turn.find(self.end_of_turn)
        if end < 0:
            raise TemplateError(f"{self.template_name}: no end-of-turn token in a rendered assistant turn")
        return turn[: end + len(self.end_of_turn)]

    def decode_generated(self, ids: Sequence[int]) -> str:
        """The raw text of one sampled turn, without its end-of-turn/EOS tokens (special tokens kept)."""
        ids = list(ids)
        while ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


@dataclass
class TokenSequence:
    """An episode's tokens, built by appending only."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 on sampled ids (end-of-turn included)
    logprobs: list[float] = field(default_factory=list)  # sampling logprobs where the mask is 1, else 0.0
    _spans: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not len(self.response_ids) == len(self.loss_mask) == len(self.logprobs):
            raise ValueError(f"{len(self.response_ids)} response ids, {len(self.loss_mask)} mask entries, "
                             f"{len(self.logprobs)} logprobs")
        if not self._spans:
            self._spans = _runs(self.loss_mask)

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
        """(start, end) of each sampled turn within ``response_ids`` (empty turns have none)."""
        return list(self._spans)
