"""Judges: score texts with a language model, from a chat prompt, on a small integer scale.

A judge is any callable `judge(prompts) -> scores`: `prompts` is a list of chats (each a list of
`{"role": ..., "content": ...}` messages, the OpenAI chat format), the answer one score per chat, a number or None
when the judge gave no usable score (an error, a timeout, an answer without a number on the scale). Methods that
learn from judged text (GRSD's reflections, a process scorer) call one judge per batch and count the Nones.

Built in:

* `EndpointJudge`: an OpenAI-compatible server (`vllm serve`, or any service speaking `/v1/chat/completions` or
  `/v1/completions`), temperature 0, a few tokens, a timeout per request, requests in parallel, retried with
  exponential backoff on 429, 5xx and dropped connections; `probe()` checks the server answers (`GET /v1/models`)
  before a run starts.
* `LocalJudge`: a transformers model loaded from a path or Hub id, greedy decoding.
* `GeneratorJudge`: any function that turns chats into answer texts (a trainer's own generator: the policy judging).
* `CallableJudge`: wraps a user's function, whose answers may be numbers, texts to parse, or None.

Scores are parsed with `parse_score`: the first number in the answer, kept when it is a whole number on the scale.

Process scorers (PATR, arXiv 2607.15610; docs/methods/patr.md): `scorer(trajectories) -> q`, one q ∈ [0, 1] (or None)
per partial trajectory, which the `patr` topology calls after every turn. `SolverProgressScorer` (the environment's
exact cost-to-go, `solver_progress`, offline), `JudgeScorer` (a judge above on our 0-3 rubric, `judge_messages`),
`RewardModelScorer` (a local sequence classifier over `node_transcript`) and `CallableScorer` (a user's function,
its answers checked by `coerce_q`).

Example:
    >>> judge = CallableJudge(lambda prompts: ["Score: 2", "seven", 3], low=0, high=3)
    >>> judge([[{"role": "user", "content": "x"}]] * 3)
    [2.0, None, 3.0]
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import math
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from .trajectory import Trajectory

Messages = list[dict[str, str]]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
logger = logging.getLogger(__name__)


def parse_score(text: Any, low: int = 0, high: int = 3) -> float | None:
    """The score in a judge's answer: its first number, when that is a whole number in [low, high]; else None.

    >>> [parse_score(t) for t in ("2", "Score: 3/3", " 1.", "7", "2.5", "no idea", None)]
    [2.0, 3.0, 1.0, None, None, None, None]
    """
    if not isinstance(text, str):
        return None
    match = _NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group(0))
    if value != int(value) or not low <= value <= high:
        return None
    return value


def coerce_score(value: Any, low: int = 0, high: int = 3) -> float | None:
    """A judge's answer as a score: a number on the scale (a whole one), a text parsed by `parse_score`, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        value = float(value)
        return value if math.isfinite(value) and value == int(value) and low <= value <= high else None
    return parse_score(value, low, high)


def prompt_text(messages: Messages) -> str:
    """One chat as plain text (`role: content` blocks), for judges that take a single string."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


class JudgeUnavailable(ValueError):
    """The judge cannot be reached or loaded (raised before a run starts, with a one-line message)."""


def load_pretrained(name: str, tokenizer: Any, model_class: Any, what: str, kind: str = "model") -> tuple[Any, Any]:
    """(`model_class.from_pretrained(name)`, the given tokenizer or `name`'s), or a one-line `JudgeUnavailable`
    naming `what` failed to load (a judge or scorer model given by path or Hub id)."""
    from .loading import load_tokenizer

    try:
        tokenizer = tokenizer or load_tokenizer(name)
        return model_class.from_pretrained(name), tokenizer
    except (OSError, ValueError) as err:
        raise JudgeUnavailable(
            f"{what} {name!r} could not be loaded ({type(err).__name__}: {str(err).splitlines()[0][:160]}); give a "
            f"{kind} directory or Hub id"
        ) from None


class CallableJudge:
    """A user's judge function, its answers coerced to scores (`coerce_score`).

    Args:
        fn: `fn(prompts) -> answers`, one answer per chat: a number, a text or None.
        low, high: The scale (inclusive); answers outside it are None.
    """

    def __init__(self, fn: Callable[[list[Messages]], Sequence[Any]], low: int = 0, high: int = 3):
        if not callable(fn):
            raise TypeError(f"a judge must be callable (prompts -> scores), got {type(fn).__name__}")
        self.fn, self.low, self.high = fn, low, high

    def __call__(self, prompts: Sequence[Messages]) -> list[float | None]:
        prompts = [list(p) for p in prompts]
        answers = list(self.fn(prompts)) if prompts else []
        if len(answers) != len(prompts):
            raise ValueError(f"the judge returned {len(answers)} answers for {len(prompts)} prompts")
        return [coerce_score(a, self.low, self.high) for a in answers]


class GeneratorJudge(CallableJudge):
    """A judge whose answers come from `generate_texts(prompts) -> texts` (e.g. the policy through the trainer's
    generator, greedy, a few tokens). It is called with no prompt too: a collective generator (vLLM server mode
    under several processes) needs every process at every call."""

    def __call__(self, prompts: Sequence[Messages]) -> list[float | None]:
        prompts = [list(p) for p in prompts]
        answers = list(self.fn(prompts))
        if len(answers) != len(prompts):
            raise ValueError(f"the judge returned {len(answers)} answers for {len(prompts)} prompts")
        return [coerce_score(a, self.low, self.high) for a in answers]


# ---- retries of the endpoint judge ------------------------------------------------------------------------------

RETRY_STATUSES = frozenset({429, *range(500, 600)} - {501, 505})
"""HTTP statuses worth another try: 429 Too Many Requests and the server errors that waiting can heal (all of 5xx but
501 Not Implemented and 505 HTTP Version Not Supported)."""


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """The seconds a `Retry-After` header asks to wait: its delay-seconds, or the time from `now` (default: the clock)
    to its HTTP-date (0 when that is past); None when there is no header or it cannot be read.

    >>> parse_retry_after("7"), parse_retry_after(" 0 "), parse_retry_after("soon"), parse_retry_after(None)
    (7.0, 0.0, None, None)
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=datetime(2015, 10, 21, 7, 27, 50, tzinfo=timezone.utc))
    10.0
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is in GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def backoff_delay(retry: int, base: float, cap: float, retry_after: float | None = None,
                  jitter: float | None = None) -> float:
    """Seconds to wait before retry number `retry` (0: the first), at most `cap`: the server's `Retry-After` when it
    sent one, else `d = min(cap, base * 2**retry)` with "equal jitter", a point of [d/2, d] (`jitter` in [0, 1] picks
    it, uniformly at random when None), so that requests refused together do not come back together.

    >>> [backoff_delay(r, 1.0, 30.0, jitter=0.0) for r in range(7)]  # d/2: 1/2, 2/2, 4/2, ..., then 30/2
    [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    >>> backoff_delay(2, 1.0, 30.0, jitter=0.5), backoff_delay(9, 1.0, 30.0, jitter=1.0)  # 4·0.75, min(30, 512)
    (3.0, 30.0)
    >>> backoff_delay(0, 1.0, 30.0, retry_after=7.0), backoff_delay(0, 1.0, 30.0, retry_after=120.0)
    (7.0, 30.0)
    """
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    delay = min(cap, base * 2.0 ** retry)
    return delay / 2 * (1 + (random.random() if jitter is None else jitter))


def is_transient(err: BaseException) -> bool:
    """Whether a failed request is worth another try: an HTTP answer in `RETRY_STATUSES`, or a connection that was
    refused, reset or cut short. Not a timeout: `timeout` bounds the wait for one answer, and sending again to a server
    too slow to answer would multiply both its load and the wait."""
    if isinstance(err, urllib.error.HTTPError):
        return err.code in RETRY_STATUSES
    if isinstance(err, urllib.error.URLError):
        err = err.reason
    return isinstance(err, ConnectionError | http.client.IncompleteRead)


class EndpointJudge:
    """An OpenAI-compatible server as a judge (e.g. `vllm serve <model>`).

    Args:
        url: The server's base URL, e.g. `http://localhost:8000` (a trailing `/v1` is accepted).
        model: The served model's name; None = the first one `GET /v1/models` lists (read by `probe`).
        api: `"chat"` (POST /v1/chat/completions with the messages) or `"completions"` (POST /v1/completions with
            `prompt_text(messages)`).
        timeout: Seconds one request may take; past it (or on any HTTP/JSON error retries did not cure) that answer
            is None.
        max_tokens: Token budget of an answer (16: one score).
        workers: Requests sent at once.
        api_key: Sent as a bearer token when given.
        low, high: The scale.
        attempts: Tries of one request (1: no retry). A loaded server's 429 or 5xx, or a refused, reset or cut
            connection, is tried again after `backoff_delay(retry, backoff, max_backoff, Retry-After)` seconds:
            `backoff`, 2·`backoff`, 4·`backoff`, ... (each jittered down by up to half), or what the answer's
            `Retry-After` header asks; never more than `max_backoff`. Timeouts and other answers are not retried.
            With the defaults a request gives up after 4 tries and 3.5-7 s of waiting in all (up to 90 s when the
            server's `Retry-After` asks for longer).
        backoff, max_backoff: The first wait and the longest one, in seconds.

    A request that still fails is None and its reason goes to `last_errors` (ending "(after N attempts)" when it was
    retried); `answers` logs one warning per call that had failures, and `last_retries` counts the retries.
    `probe` tries once: a wrong URL or a server not started fails the run at once.

    Hugging Face Inference Providers are OpenAI-compatible judges too:
    `EndpointJudge("https://router.huggingface.co/v1", "<model id>:<provider>", api_key=<HF token>)`.

    Why hand-written retries: `huggingface_hub.utils.http_backoff` and `huggingface_hub.InferenceClient` (a
    dependency already) send through the Hub's shared client, which refuses every request, to localhost too, when
    `HF_HUB_OFFLINE=1` is set (the setting of an offline cluster with a local `vllm serve` judge, and of our tests);
    they also retry timeouts by default, add a second to every `Retry-After` and do not jitter. urllib3's `Retry` is
    no dependency of this package (it comes through `requests`) and counts a read timeout and a reset connection as
    the same kind of error. What is needed (which errors, which waits) is the three small functions above this
    class, tested against a loopback server.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        *,
        api: str = "chat",
        timeout: float = 60.0,
        max_tokens: int = 16,
        workers: int = 16,
        api_key: str | None = None,
        low: int = 0,
        high: int = 3,
        attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ):
        if not url or not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise JudgeUnavailable(f"the judge URL must start with http:// or https://, got {url!r}")
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"attempts must be a whole number >= 1 (1: no retry), got {attempts!r}")
        if not 0 <= backoff <= max_backoff:
            raise ValueError(f"the backoff must satisfy 0 <= backoff <= max_backoff, got {backoff!r}, {max_backoff!r}")
        base = url.rstrip("/")
        self.base_url = base.removesuffix("/v1")
        self.model, self.api, self.timeout = model, api, float(timeout)
        self.max_tokens, self.workers, self.api_key = int(max_tokens), max(1, int(workers)), api_key
        self.low, self.high = low, high
        self.attempts, self.backoff, self.max_backoff = attempts, float(backoff), float(max_backoff)
        self.last_errors: list[str] = []
        self.last_retries = 0

    def probe(self, timeout: float = 5.0) -> list[str]:
        """`GET /v1/models`: the served model names; fills in `model` when it is None. Raises `JudgeUnavailable`
        (one line) when the server does not answer in `timeout` seconds or answers something else."""
        try:
            body = self._request("GET", "/v1/models", None, timeout)
            names = [str(entry["id"]) for entry in body.get("data", [])]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", None) or err
            raise JudgeUnavailable(
                f"the judge endpoint {self.base_url} did not answer GET /v1/models within {timeout:g} s "
                f"({type(err).__name__}: {str(reason).strip()[:120]}); start the server or fix the URL"
            ) from None
        if self.model is None:
            if not names:
                raise JudgeUnavailable(f"the judge endpoint {self.base_url} serves no model (GET /v1/models is empty)")
            self.model = names[0]
        return names

    def answers(self, prompts: Sequence[Messages]) -> list[str | None]:
        """The raw answer texts (None where a request failed; the reasons are in `last_errors`)."""
        self.last_errors, self.last_retries = [], 0
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.workers, len(prompts))) as pool:
            results = list(pool.map(self._answer, prompts))
        self.last_errors = [error for _, error, _ in results if error]
        self.last_retries = sum(retries for _, _, retries in results)
        if self.last_errors:
            logger.warning("The judge at %s failed %d of %d requests (%d retries in all); their answers are None. "
                           "First reason: %s", self.base_url, len(self.last_errors), len(prompts), self.last_retries,
                           self.last_errors[0])
        return [text for text, _, _ in results]

    def __call__(self, prompts: Sequence[Messages]) -> list[float | None]:
        return [parse_score(text, self.low, self.high) for text in self.answers(prompts)]

    def _answer(self, messages: Messages) -> tuple[str | None, str | None, int]:
        """(the answer text or None, the reason it is None, the retries it took)."""
        payload: dict[str, Any] = {"temperature": 0.0, "max_tokens": self.max_tokens}
        if self.model is not None:
            payload["model"] = self.model
        if self.api == "chat":
            path, payload = "/v1/chat/completions", {**payload, "messages": list(messages)}
        else:
            path, payload = "/v1/completions", {**payload, "prompt": prompt_text(messages)}
        retry = 0
        while True:
            try:
                choice = self._request("POST", path, payload, self.timeout)["choices"][0]
                return str((choice["message"]["content"] if self.api == "chat" else choice["text"]) or ""), None, retry
            # timeouts are OSErrors; a connection cut in the middle of an answer is an http.client.HTTPException
            except (OSError, ValueError, KeyError, IndexError, TypeError, http.client.HTTPException) as err:
                if isinstance(err, urllib.error.HTTPError):
                    retry_after = parse_retry_after(err.headers.get("Retry-After") if err.headers else None)
                    err.close()
                else:
                    retry_after = None
                if not is_transient(err) or retry + 1 >= self.attempts:
                    tries = f" (after {retry + 1} attempts)" if retry else ""
                    return None, f"{type(err).__name__}: {err}{tries}", retry
                wait = backoff_delay(retry, self.backoff, self.max_backoff, retry_after)
                logger.debug("Judge request %d/%d to %s failed (%s: %s); retrying in %.2f s", retry + 1,
                             self.attempts, self.base_url, type(err).__name__, err, wait)
                time.sleep(wait)
                retry += 1

    def _request(self, method: str, path: str, payload: dict | None, timeout: float) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read().decode() or "{}")


class LocalJudge:
    """A transformers causal LM as a judge: chats rendered with its chat template, greedy answers of at most
    `max_tokens` tokens, parsed with `parse_score`.

    Args:
        model: A path or Hub id (loaded here; `JudgeUnavailable` when that fails), or a loaded model.
        tokenizer: Its tokenizer (loaded from `model` when None).
        max_tokens: Token budget of an answer.
        device: Where the model runs (None: where it is loaded, CPU for a path).
        batch_size: Chats per `generate` call.
        low, high: The scale.
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, max_tokens: int = 16, device: Any = None,
                 batch_size: int = 8, low: int = 0, high: int = 3):
        if isinstance(model, str):
            from transformers import AutoModelForCausalLM

            model, tokenizer = load_pretrained(model, tokenizer, AutoModelForCausalLM, "the local judge")
        if tokenizer is None:
            raise ValueError("LocalJudge needs the tokenizer of a loaded model")
        if getattr(tokenizer, "chat_template", None) is None:
            raise JudgeUnavailable("the local judge's tokenizer has no chat template; use an instruct model")
        if device is not None:
            model = model.to(device)
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_tokens, self.batch_size, self.low, self.high = int(max_tokens), max(1, int(batch_size)), low, high

    def answers(self, prompts: Sequence[Messages]) -> list[str]:
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        device = next(self.model.parameters()).device
        texts = []
        for start in range(0, len(prompts), self.batch_size):
            batch = [self.tokenizer.apply_chat_template(list(m), tokenize=True, add_generation_prompt=True,
                                                        return_dict=False)
                     for m in prompts[start : start + self.batch_size]]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + list(ids) for ids in batch], device=device)
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
            with torch.no_grad():
                out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=self.max_tokens,
                                          do_sample=False, pad_token_id=pad)
            texts += self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        return texts

    def __call__(self, prompts: Sequence[Messages]) -> list[float | None]:
        return [parse_score(text, self.low, self.high) for text in self.answers(prompts)] if prompts else []


def as_judge(judge: Any, low: int = 0, high: int = 3):
    """A judge from what a user passed: a built-in judge as it is, any other callable wrapped in `CallableJudge`."""
    if isinstance(judge, EndpointJudge | LocalJudge | CallableJudge):
        return judge
    return CallableJudge(judge, low=low, high=high)


# ---- process scorers (PATR) ------------------------------------------------------------------------------------------


PROGRESS_MODES = ("slack", "distance")

Scorer = Callable[[list[Trajectory]], Sequence[float | None]]
"""A process scorer: one q ∈ [0, 1] (or None: no score) per partial trajectory (PATR's `patr` topology calls it
after every turn; `rollout/topologies/patr.py`)."""


def _check_progress_mode(mode: str) -> None:
    if mode not in PROGRESS_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, PROGRESS_MODES))}, got {mode!r}")


def solver_progress(trajectory: Trajectory, horizon: int, mode: str = "slack") -> float | None:
    """q(h) from the `solver_value` signal of the steps of `trajectory` (its full path); None without the signal.

    Args:
        trajectory: A partial (or finished) trajectory whose steps carry `signals["solver_value"]`.
        horizon: T, the turn budget of an episode (`max_turns`).
        mode: "slack": q = clip((T − t − N(s_t)) / (T − N(s_0)), 0, 1); "distance": q = clip(1 − N(s_t)/N(s_0), 0, 1).

    N is the solver's exact cost-to-go (`solver_value` signal: `Transition(N(s_t), N(s_t+1))` on every step), t the
    turns played and T the turn budget. "slack" is the share of the initial spare turns T − N(s_0) still left: 1 while
    every step was optimal, 0 once the task can no longer be solved in the turns that remain (N = inf, or T < N(s_0),
    give 0; without spare turns, T = N(s_0), q is 1 while the path is still optimal). A solved state (N(s_t) = 0)
    scores 1 in both ([D]: our formulas).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> def path(*values):  # N(s_0), N(s_1), ...
    ...     return Trajectory(task={}, steps=[Step("s", "a", signals={"solver_value": (values[i], values[i + 1])})
    ...                                       for i in range(len(values) - 1)])
    >>> solver_progress(path(6, 5, 4), horizon=10)  # optimal so far: (10 − 2 − 4) / (10 − 6) = 1
    1.0
    >>> solver_progress(path(6, 6, 7), horizon=10)  # a bump and a step away: (10 − 2 − 7) / 4 = 0.25
    0.25
    >>> round(solver_progress(path(6, 5, 4), horizon=10, mode="distance"), 4)  # 1 − 4/6
    0.3333
    >>> solver_progress(path(6, float("inf")), horizon=10)  # unsolvable now
    0.0
    """
    _check_progress_mode(mode)
    if not trajectory.steps:
        return None
    first, last = trajectory.steps[0].signals.get("solver_value"), trajectory.steps[-1].signals.get("solver_value")
    if first is None or last is None:
        return None
    start, now = float(first[0]), float(last[1])
    if math.isnan(start) or math.isnan(now):
        return None
    if math.isinf(now) or math.isinf(start):
        return 0.0
    if now <= 0:
        return 1.0  # solved
    if mode == "distance":
        if start <= 0:
            return 0.0  # started solved and left it
        return min(max(1.0 - now / start, 0.0), 1.0)  # q = clip(1 − N(s_t)/N(s_0), 0, 1)
    slack0 = horizon - start  # T − N(s_0): spare turns at the start
    slack = horizon - len(trajectory.steps) - now  # T − t − N(s_t)
    if slack0 <= 0:  # no spare turn: 1 while a perfect path is still on track, 0 once it is not (or never was)
        return 1.0 if slack >= 0 else 0.0
    return min(max(slack / slack0, 0.0), 1.0)


def judge_q(score: float | None, low: float = 0, high: float = 3) -> float | None:
    """A judge's score on [low, high] as q ∈ [0, 1]: (score − low)/(high − low); None stays None.

    >>> [judge_q(s) for s in (0, 2, 3, None)]
    [0.0, 0.6666666666666666, 1.0, None]
    """
    if score is None:
        return None
    return coerce_q((float(score) - low) / (high - low))


def coerce_q(value: Any) -> float | None:
    """A scorer's answer as q: a finite number clipped to [0, 1], else None.

    >>> [coerce_q(v) for v in (0.5, 1.7, -1, float("nan"), "0.3", None, True)]
    [0.5, 1.0, 0.0, None, None, None, None]
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1.0)


def node_transcript(trajectory: Trajectory, max_turns_shown: int = 8, max_chars: int = 400) -> str:
    """The partial trajectory as text for a judge or reward model: the task, the first observation, then the last
    `max_turns_shown` turns (action, then the observation it led to).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> steps = [Step("P . G", "right", next_observation=". P G")]
    >>> print(node_transcript(Trajectory(task={}, steps=steps, task_text="Reach G.")))
    Task: Reach G.
    Observation 1: P . G
    Action 1: right
    Observation 2: . P G
    """

    def cut(text: Any) -> str:
        text = str(text if text is not None else "").strip()
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."

    lines = [f"Task: {cut(trajectory.task_text)}"] if trajectory.task_text else []
    steps = trajectory.steps
    if steps:
        lines.append(f"Observation 1: {cut(steps[0].observation)}")
    start = max(0, len(steps) - max_turns_shown)
    if start:
        lines.append(f"... ({start} earlier turns)")
    for t in range(start, len(steps)):
        step = steps[t]
        lines.append(f"Action {t + 1}: {cut(step.action_text)}" + ("" if step.valid else " [rejected]"))
        if step.next_observation is not None:
            lines.append(f"Observation {t + 2}: {cut(step.next_observation)}")
    return "\n".join(lines)


PROGRESS_JUDGE_SYSTEM = ("You evaluate an agent that is partway through a task. Judge only whether its trajectory so "
                         "far is making progress toward solving the task.")
PROGRESS_JUDGE_QUESTION = ("Is this trajectory making progress toward solving the task? Answer with one number: 0 "
                           "(stuck, looping or off track), 1 (little progress), 2 (some progress), 3 (clearly on track "
                           "to solve it).")


def judge_messages(trajectory: Trajectory) -> list[dict[str, str]]:
    """A process judge's chat for one partial trajectory (PATR's `JudgeScorer`; our rubric: is it making progress,
    on the 0-3 scale of the repository's judges)."""
    return [{"role": "system", "content": PROGRESS_JUDGE_SYSTEM},
            {"role": "user", "content": f"{node_transcript(trajectory)}\n\n{PROGRESS_JUDGE_QUESTION}"}]


class SolverProgressScorer:
    """q from the environment's solver (`solver_progress`), offline: the trainer records the `solver_value` signal.

    Args:
        horizon: T, the turn budget (`max_turns`).
        mode: "slack" or "distance" (`PROGRESS_MODES`).
    """

    kind = "solver"

    def __init__(self, horizon: int, mode: str = "slack"):
        _check_progress_mode(mode)
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1 (max_turns), got {horizon!r}")
        self.horizon, self.mode = horizon, mode

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        return [solver_progress(t, self.horizon, self.mode) for t in trajectories]


class CallableScorer:
    """A user's function `fn(trajectories) -> scores` (one number in [0, 1] or None per partial trajectory), its
    answers checked (`coerce_q`: non-numbers and non-finite values are None, numbers are clipped to [0, 1])."""

    kind = "callable"

    def __init__(self, fn: Scorer):
        if not callable(fn):
            raise TypeError(f"a PATR scorer must be callable (trajectories -> scores), got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        answers = list(self.fn(list(trajectories))) if trajectories else []
        if len(answers) != len(trajectories):
            raise ValueError(f"the PATR scorer returned {len(answers)} scores for {len(trajectories)} trajectories")
        return [coerce_q(a) for a in answers]


class JudgeScorer:
    """A judge of `trl_agents.judges` (EndpointJudge, LocalJudge, CallableJudge) as a scorer: one chat per partial
    trajectory (`judge_messages`), its 0-3 score mapped to [0, 1] (`judge_q`); an unusable answer is None."""

    kind = "judge"

    def __init__(self, judge: Callable[[list], Sequence[float | None]], low: int = 0, high: int = 3):
        if not callable(judge):
            raise TypeError(f"a judge must be callable (prompts -> scores), got {type(judge).__name__}")
        self.judge, self.low, self.high = judge, low, high

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        if not trajectories:
            return []
        scores = list(self.judge([judge_messages(t) for t in trajectories]))
        if len(scores) != len(trajectories):
            raise ValueError(f"the judge returned {len(scores)} scores for {len(trajectories)} trajectories")
        return [judge_q(s, self.low, self.high) for s in scores]


class RewardModelScorer:
    """A process reward model run locally: a transformers sequence classifier over `node_transcript`, q = sigmoid of
    its one logit (or the last label's softmax probability with several labels).

    Args:
        model: A path or Hub id (loaded with `AutoModelForSequenceClassification`; `JudgeUnavailable` when that
            fails), or a loaded classifier.
        tokenizer: Its tokenizer (loaded from `model` when None).
        max_length: Tokens of a transcript kept (its end: the latest turns).
        batch_size: Transcripts per forward.
    """

    kind = "reward_model"

    def __init__(self, model: Any, tokenizer: Any = None, *, max_length: int = 1024, batch_size: int = 8):
        if isinstance(model, str):
            from transformers import AutoModelForSequenceClassification

            model, tokenizer = load_pretrained(model, tokenizer, AutoModelForSequenceClassification,
                                               "the reward model", kind="sequence-classification model")
        if tokenizer is None:
            raise ValueError("RewardModelScorer needs the tokenizer of a loaded model")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_length, self.batch_size = int(max_length), max(1, int(batch_size))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = 0 if pad is None else pad
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.pad_token_id  # sequence classifiers find the last token by it

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        import torch

        device = next(self.model.parameters()).device
        out: list[float | None] = []
        for start in range(0, len(trajectories), self.batch_size):
            texts = [node_transcript(t) for t in trajectories[start : start + self.batch_size]]
            ids = [self.tokenizer(text, add_special_tokens=True)["input_ids"][-self.max_length :] for text in texts]
            width = max(len(i) for i in ids)
            # Right padding: the classifier reads the last non-pad token.
            input_ids = torch.tensor([i + [self.pad_token_id] * (width - len(i)) for i in ids], device=device)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=device)
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits.float()
            values = torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else torch.softmax(logits, -1)[:, -1]
            out += [coerce_q(float(v)) for v in values]
        return out
