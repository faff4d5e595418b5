"""Turning environment text into the token ids the policy sees, in both row formats.

* Step format (verl-agent style, the default): every turn is a fresh two-message chat, the environment's rules as
  the system message and, as the user message, the task, the last `history_length` (observation, action) pairs and
  the current observation. The prompt length stays flat however long the episode is.
* Conversation format: one growing chat per episode (system, user obs 0, assistant action 0, user obs 1, ...). Each
  turn's context is the previous context + the action tokens + the environment's reply tokens, built by appending
  token ids (never re-tokenising what the model generated), so the tokens trained on are exactly those sampled.

Example:
    >>> from trl_agents.testing import build_tiny_tokenizer
    >>> from trl_agents.rollout.prompts import PromptRenderer
    >>> renderer = PromptRenderer(build_tiny_tokenizer(), history_length=1)
    >>> text = renderer.step_text("Reach G.", "", [("P F\\nF G", "right")], "S P\\nF G")
    >>> print(text.split("<|im_start|>user\\n")[1].split("<|im_end|>")[0])
    Recent history:
    Observation:
    P F
    F G
    Action: right
    Current observation:
    S P
    F G
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


class PromptTooLongError(ValueError):
    """A prompt does not fit in `max_prompt_length` even with no history (step format), or the first prompt of a
    conversation does not fit in it."""


def model_context_length(model: Any) -> int | None:
    """The longest sequence `model` was built for: its (text) config's `max_position_embeddings` (or `n_positions`
    / `max_sequence_length` / `seq_length`), None when it has none. Wrappers (PEFT, DDP) are looked through."""
    config = getattr(model, "config", None)
    if config is None and getattr(model, "module", None) is not None:
        config = getattr(model.module, "config", None)
    if config is None:
        return None
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_length_limit(max_prompt_length: int | None, model: Any, max_completion_length: int | None
                        ) -> tuple[int | None, str]:
    """(the longest prompt of a run in tokens, where that bound comes from, for messages).

    `max_prompt_length` when it is set. Otherwise our default: the model's context length
    (`model_context_length`, i.e. `config.max_position_embeddings`) minus `max_completion_length`, so that a prompt
    and the turn generated after it fit in the context the model was built for; without it, one huge observation
    (say 1 MB of text, 500k tokens) reached generation whole and the run grew past the machine's memory. None (no
    limit) only when the model's context length is unknown (e.g. an evaluation through a vLLM server).

    Example:
        >>> from trl_agents.testing import build_tiny_model, build_tiny_tokenizer
        >>> model = build_tiny_model(build_tiny_tokenizer(["a b"]), hidden_size=32, num_layers=1)
        >>> prompt_length_limit(None, model, 4)
        (4092, "the default: the model's context of 4096 tokens (max_position_embeddings) minus max_completion_length=4")
        >>> prompt_length_limit(512, model, 4)
        (512, '')
    """
    if max_prompt_length is not None:
        return max_prompt_length, ""
    context = model_context_length(model)
    if context is None:
        return None, ""
    completion = max_completion_length or 0
    if completion >= context:
        raise ValueError(
            f"max_completion_length={completion} leaves no room for a prompt in the model's context of {context} "
            "tokens (max_position_embeddings): lower max_completion_length, or set max_prompt_length."
        )
    return context - completion, (f"the default: the model's context of {context} tokens (max_position_embeddings) "
                                  f"minus max_completion_length={completion}")


class PromptRenderer:
    """Renders chat prompts for an episode's turns and tokenises them with the tokenizer's chat template.

    Args:
        tokenizer: A tokenizer with a chat template.
        history_length: Number of past (observation, action) pairs shown in step-format prompts.
        max_prompt_length: Longest prompt in tokens; step-format prompts drop their oldest history entries to fit,
            and a prompt that does not fit even without history (or the first prompt of a conversation that does
            not fit) raises `PromptTooLongError`, which fails that episode only. None = no limit (see
            `prompt_length_limit` for the default a trainer or an evaluation sets).
        chat_template_kwargs: Extra keyword arguments for `apply_chat_template` (e.g. `enable_thinking=False`).
        max_prompt_length_origin: Where `max_prompt_length` comes from, named in the error (e.g. "the default: ...").
    """

    def __init__(
        self,
        tokenizer: Any,
        history_length: int = 2,
        max_prompt_length: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_prompt_length_origin: str = "",
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "The tokenizer has no chat template, and trl-agents renders every turn as a chat. Use an instruct "
                "model, or set one, e.g. `tokenizer.chat_template = trl.chat_template_utils.qwen2_5_chat_template`."
            )
        self.tokenizer = tokenizer
        self.history_length = history_length
        self.max_prompt_length = max_prompt_length
        self.max_prompt_length_origin = max_prompt_length_origin
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._env_turn_cache: dict[str, list[int]] = {}

    # ---- step format ---------------------------------------------------------------------------------------------

    @staticmethod
    def step_user_message(task: str, history: Sequence[tuple[str, str]], observation: str) -> str:
        """The user message of a step-format turn: task, recent (observation, action) pairs, current observation."""
        parts = [task] if task else []
        if not history:  # nothing to tell apart: the observation alone keeps prompts short
            return "\n".join([*parts, observation])
        parts.append("Recent history:")
        for past_observation, past_action in history:
            parts.append(f"Observation:\n{past_observation}\nAction: {past_action}")
        parts.append(f"Current observation:\n{observation}")
        return "\n".join(parts)

    @staticmethod
    def step_messages(
        system: str, task: str, history: Sequence[tuple[str, str]], observation: str
    ) -> list[dict[str, str]]:
        """The chat of a step-format turn (system message = the environment's rules, when not empty)."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": PromptRenderer.step_user_message(task, history, observation)})
        return messages

    def step_text(self, system: str, task: str, history: Sequence[tuple[str, str]], observation: str,
                  tools: Sequence[str | dict] = ()) -> str:
        recent = list(history[-self.history_length :]) if self.history_length > 0 else []
        return self._apply(self.step_messages(system, task, recent, observation), tokenize=False, tools=tools)

    def step_prompt_ids(
        self, system: str, task: str, history: Sequence[tuple[str, str]], observation: str,
        tools: Sequence[str | dict] = (),
    ) -> list[int]:
        """Token ids of a step-format prompt; the oldest history entries are dropped if it is too long."""
        return self.step_prompt(system, task, history, observation, tools)[0]

    def step_prompt(
        self, system: str, task: str, history: Sequence[tuple[str, str]], observation: str,
        tools: Sequence[str | dict] = (),
    ) -> tuple[list[int], list[tuple[str, str]]]:
        """`step_prompt_ids`, and the history entries the prompt kept (the last `history_length` that fit).
        `tools`: the environment's tool schemas (dicts or JSON text), rendered by the chat template (`tools=`)."""
        keep = min(self.history_length, len(history)) if self.history_length > 0 else 0
        while True:
            recent = list(history[len(history) - keep :]) if keep else []
            ids = self._apply(self.step_messages(system, task, recent, observation), tokenize=True, tools=tools)
            if self.max_prompt_length is None or len(ids) <= self.max_prompt_length:
                return ids, recent
            if keep == 0:
                raise self.too_long(f"The prompt of this turn has {len(ids)} tokens without any history")
            keep -= 1

    def too_long(self, what: str) -> PromptTooLongError:
        """The error for a prompt over `max_prompt_length`: `what` (its length), the bound and where it comes from,
        and the fix."""
        origin = f" ({self.max_prompt_length_origin})" if self.max_prompt_length_origin else ""
        return PromptTooLongError(
            f"{what}, more than max_prompt_length={self.max_prompt_length}{origin}. Raise `max_prompt_length` or "
            "shorten the environment's observations / system prompt."
        )

    # ---- conversation format -------------------------------------------------------------------------------------

    @staticmethod
    def conversation_user_message(task: str, observation: str) -> str:
        """The first user message of a conversation: the task (when not empty) and the first observation."""
        return f"{task}\n{observation}" if task else observation

    def conversation_prompt_ids(self, system: str, task: str, observation: str,
                                tools: Sequence[str | dict] = ()) -> list[int]:
        """Token ids of the first turn of a conversation (system + task + first observation, and the tool schemas
        `tools`); `PromptTooLongError` when they do not fit in `max_prompt_length`."""
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": self.conversation_user_message(task, observation)})
        ids = self._apply(messages, tokenize=True, tools=tools)
        if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
            raise self.too_long(f"The first prompt of this conversation has {len(ids)} tokens")
        return ids

    def messages_ids(self, messages: list[dict[str, str]], tools: Sequence[str | dict] = ()) -> list[int]:
        """Token ids of a chat ending with a generation prompt (no length limit), e.g. a privileged view."""
        return self._apply(messages, tokenize=True, tools=tools)

    def env_turn_ids(self, observation: str) -> list[int]:
        """Tokens that follow an assistant turn's EOS: the template's end-of-turn text, the observation as a user
        message, and the next generation prompt. Obtained by diffing two renderings of a dummy chat (the same
        trick TRL uses for tool responses), so any chat template works."""
        cached = self._env_turn_cache.get(observation)
        if cached is not None:
            return list(cached)
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        prefix = self._apply(base, tokenize=True, add_generation_prompt=False)
        full = self._apply(base + [{"role": "user", "content": observation}], tokenize=True)
        eos_positions = [i for i, token in enumerate(prefix) if token == self.tokenizer.eos_token_id]
        if eos_positions:  # align on the EOS the model generates, not on what the template prints after it
            prefix = prefix[: eos_positions[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "The chat template is not prefix-preserving (rendering one more message changes earlier tokens), "
                "so conversation rows cannot be built by appending tokens. Use row_format='step'."
            )
        suffix = full[len(prefix) :]
        if len(self._env_turn_cache) < 4096 and len(observation) <= 4096:  # (huge observations are not kept)
            self._env_turn_cache[observation] = suffix
        return list(suffix)

    # ---- shared --------------------------------------------------------------------------------------------------

    def _apply(self, messages, tokenize: bool, add_generation_prompt: bool = True, tools: Sequence[str | dict] = ()):
        extra = dict(self.chat_template_kwargs)
        if tools:  # the way TRL offers tools: the template renders their schemas (and how to call them)
            extra["tools"] = tool_schemas(tools)
        out = self.tokenizer.apply_chat_template(
            messages,
            tokenize=tokenize,
            add_generation_prompt=add_generation_prompt,
            return_dict=False,
            **extra,
        )
        return list(out) if tokenize else out


def tool_schemas(tools: Sequence[str | dict]) -> list[dict]:
    """Tool schemas as dicts (`PromptParts.tools` keeps them as JSON text, so that parts stay hashable)."""
    return [json.loads(tool) if isinstance(tool, str) else dict(tool) for tool in tools]


def tool_texts(tools: Sequence[str | dict] | None) -> tuple[str, ...]:
    """Tool schemas as JSON text (for `PromptParts.tools`); () for None. Keys keep their order: the chat template
    renders them in it, and the warm start's `tools` column does the same."""
    return tuple(tool if isinstance(tool, str) else json.dumps(tool) for tool in tools or ())


def tools_column(tools: Sequence[str | dict]) -> str:
    """Tool schemas as one JSON list: the `tools` column TRL's SFTTrainer passes to the chat template (warm-start
    demonstrations, trajectory records).

    >>> tools_column(('{"type": "function"}',))
    '[{"type": "function"}]'
    """
    return "[" + ", ".join(tool_texts(tools)) + "]"
