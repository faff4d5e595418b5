"""TextArena adapter: any offline TextArena game (Sokoban, Minesweeper, Rush Hour, TicTacToe, ...) as an `AgentEnv`.

A task row is `{"game": "Sokoban-v0", "seed": 0}` (or pass `game=` to the constructor and give rows with a seed).
The adapter plays the game's raw TextArena environment (without TextArena's observation wrappers) and builds
history-free observations itself: the messages the acting player received since its last move, then the current
board. Two-player games map to roles `player_0`/`player_1` with `current_role()`; the same policy plays both.

TextArena draws from Python's global `random` module (and reseeds it on every reset). The adapter gives each
environment its own random state and swaps it in around every call into TextArena, so episodes are deterministic
given the seed even when many run interleaved, and the caller's global random state is left untouched. The swap is
process-wide, so calls into TextArena are serialised by a lock: environments stepped on threads stay deterministic
(the games are pure Python and fast, so threads would not run them faster anyway).

Example:
    >>> from trl_agents.envs.adapters.textarena import TextArenaEnv
    >>> env = TextArenaEnv()
    >>> env.reset({"game": "TowerOfHanoi-v0", "seed": 0}).splitlines()[1:4]
    ['A: [3, 2, 1]', 'B: []', 'C: []']
    >>> observation, reward, done, info = env.step("[A C]")
    >>> print(observation.splitlines()[0])
    You moved disk 1 from A to C.
    >>> info["valid"], env.step("[B C]")[3]["valid"]
    (True, False)
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib
import importlib.resources
import importlib.util
import io
import numbers
import os
import random
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..base import INFO_ROLE_REWARDS, INFO_SUCCESS, INFO_VALID, AgentEnv
from ..parsing import extract_answer
from ..registry import register_env
from ..validation import check_int

_INSTALL_HINT = 'pip install "trl-agents[envs]" (or textarena==0.7.4)'
_GAME_ID = -1  # TextArena's sender id of game messages (ta.GAME_ID)
_GLOBAL_RANDOM_LOCK = threading.RLock()  # held while TextArena runs with an episode's global-`random` state

# Games that cannot run in every installation, by the folder name of their TextArena module, with what they need.
# Checked before importing the game, because some of these modules try a network download at import time.
_NLTK_DATA = {"words": "corpora/words", "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng"}
_NEEDS_NLTK: dict[str, tuple[str, ...]] = {
    "Wordle": ("words", "averaged_perceptron_tagger_eng"),
    "Codenames": ("words", "averaged_perceptron_tagger_eng"),
    "DontSayIt": ("words", "averaged_perceptron_tagger_eng"),
    "Hangman": ("words",),
    "WordLadder": ("words",),
    "WordSearch": ("words",),
    "WordChains": ("words",),
    "SpellingBee": ("words",),
    "LetterAuction": ("words",),
}
_NEEDS_OPENROUTER = ("GuessWho", "TwentyQuestions", "Debate", "ScenarioPlanning")
_NEEDS_PY312 = ("Chess", "Checkers", "IteratedStagHunt", "Klondike", "ReverseTicTacToe", "UltimateTexasHoldem")
_NEEDS_MODULE = {"BabyAiText": "gym"}
# Data files some games read that textarena 0.7.4's wheel does not ship (a packaging bug).
_NEEDS_DATA_FILE = {"UsedCarNegotiation": "instructions/blue_book.txt"}

_NUM_PLAYERS_CACHE: dict[str, int] = {}


class TextArenaGameUnavailable(ValueError):
    """The requested TextArena game cannot run in this installation (the message says why and what would fix it)."""


def _import_textarena():
    try:
        import textarena
    except ImportError as err:
        raise ImportError(f"The TextArena adapter needs the textarena package: {_INSTALL_HINT}") from err
    return textarena


def _game_folder(entry_point: Any) -> str:
    """`"textarena.envs.Sokoban.env:SokobanEnv"` -> `"Sokoban"`."""
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else entry_point.__module__
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["textarena", "envs"] else parts[-1]


def _check_available(game: str, folder: str) -> None:
    """Raise `TextArenaGameUnavailable` naming the missing requirement of a known problematic game."""
    if folder in _NEEDS_NLTK:
        import nltk

        missing = []
        for resource in _NEEDS_NLTK[folder]:
            try:
                nltk.data.find(_NLTK_DATA[resource])
            except LookupError:
                missing.append(resource)
        if missing:
            names = ", ".join(repr(m) for m in missing)
            raise TextArenaGameUnavailable(
                f"TextArena game {game!r} needs the NLTK data {names}, which is not installed (TextArena downloads it "
                f'at import time, which fails offline). With network access run: python -c "import nltk; '
                f'nltk.download([{names}])", then retry.'
            )
    if folder in _NEEDS_OPENROUTER and not os.environ.get("OPENROUTER_API_KEY"):
        raise TextArenaGameUnavailable(
            f"TextArena game {game!r} asks an LLM through OpenRouter (network and an OPENROUTER_API_KEY), so it cannot "
            "run offline; pick another game."
        )
    if folder in _NEEDS_PY312 and sys.version_info < (3, 12):
        raise TextArenaGameUnavailable(
            f"TextArena game {game!r} uses Python 3.12 syntax (PEP 701 f-strings) and does not import on Python "
            f"{sys.version_info.major}.{sys.version_info.minor}; use Python >= 3.12 or pick another game."
        )
    module = _NEEDS_MODULE.get(folder)
    if module is not None and importlib.util.find_spec(module) is None:
        raise TextArenaGameUnavailable(f"TextArena game {game!r} needs the {module!r} package, which is not installed.")
    data_file = _NEEDS_DATA_FILE.get(folder)
    if (
        data_file is not None
        and not importlib.resources.files(f"textarena.envs.{folder}").joinpath(data_file).is_file()
    ):
        raise TextArenaGameUnavailable(
            f"TextArena game {game!r} reads {data_file}, which the installed textarena package does not ship "
            "(a packaging bug of textarena 0.7.4); pick another game."
        )


@dataclass(frozen=True)
class _GameSpec:
    game: str
    game_kwargs: dict[str, Any]  # what the user asked for (over the registered kwargs)
    env_class: type
    kwargs: dict[str, Any]  # registered kwargs updated with game_kwargs
    bracket_actions: bool  # TextArena's default wrappers add [ ] around actions that have none


def _load_game(game: str, game_kwargs: dict[str, Any]) -> _GameSpec:
    textarena = _import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(game)
    if spec is None:
        close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"Unknown TextArena game {game!r}.{hint} Game ids look like 'Sokoban-v0' (see the README).")
    folder = _game_folder(spec.entry_point)
    _check_available(game, folder)
    entry_point = spec.entry_point
    if isinstance(entry_point, str):
        module_name, class_name = entry_point.split(":")
        try:
            env_class = getattr(importlib.import_module(module_name), class_name)
        except SyntaxError as err:
            raise TextArenaGameUnavailable(
                f"TextArena game {game!r} does not import on this Python version ({err.msg}); it needs a newer Python."
            ) from err
        except LookupError as err:
            raise TextArenaGameUnavailable(f"TextArena game {game!r} needs data that is not installed: {err}") from err
        except ImportError as err:
            raise TextArenaGameUnavailable(f"TextArena game {game!r} does not import: {err}") from err
    else:
        env_class = entry_point
    wrappers = spec.default_wrappers or []
    bracket = any(w is textarena.wrappers.ActionFormattingWrapper for w in wrappers)
    return _GameSpec(game, dict(game_kwargs), env_class, {**spec.kwargs, **game_kwargs}, bracket)


@dataclass
class _Episode:
    """Everything that changes during an episode; deep-copied as a whole by `snapshot`/`restore`."""

    spec: _GameSpec
    num_players: int
    rng_state: Any  # the episode's own state of Python's global `random` module
    game_env: Any = None
    prompts: dict[int, str] = field(default_factory=dict)
    boards: dict[int, str] = field(default_factory=dict)  # the latest board each player was shown
    news: dict[int, list[str]] = field(default_factory=dict)  # messages each player received since its last move
    transcript: dict[int, list[str]] = field(default_factory=dict)  # all it received (observation="full")
    done: bool = False
    final_rewards: dict[int, float] = field(default_factory=dict)


@register_env
class TextArenaEnv(AgentEnv):
    """A TextArena game (`textarena==0.7.4`) as an `AgentEnv`.

    A task row is `{"game": id, "seed": s}`; `game` may instead come from the constructor, and a row may add
    `game_kwargs` (merged over the constructor's). Unknown ids raise `ValueError`; games that cannot run here (NLTK
    data, OpenRouter, Python 3.12 syntax) raise `TextArenaGameUnavailable` saying why.

    Args:
        game: Default TextArena game id (e.g. `"Sokoban-v0"`, `"TicTacToe-v0"`).
        game_kwargs: Keyword arguments for the game's constructor (override its registered ones).
        observation: `"latest"` (default: the messages since the acting player's last move, then the current board;
            history-free for board games) or `"full"` (everything the player was told since the reset, like
            TextArena's `LLMObservationWrapper`; suits dialogue games).
        error_allowance: Invalid moves in a row that TextArena tolerates before ending the game with its penalty.
            None keeps each game's own (1: the second invalid move in a row loses). Our choice to expose it: a large
            value makes every invalid move a no-op with feedback, as in the built-in environments.
        num_players: Players to start the game with; default: 1 if the game accepts it, else 2.
        bracket_actions: Wrap an answer that has no `[` `]` in brackets (TextArena's `ActionFormattingWrapper`);
            default: as the game's registered wrappers do.
        max_action_chars: Longer answers are cut to this many characters before TextArena sees them.
    """

    name = "textarena"
    requires = ("textarena",)
    task_keys = ("seed",)
    instructions = (
        "You are playing a text game. Follow the game's rules and answer with exactly one move in the format the "
        "game asks for (usually in square brackets, e.g. [up] or [3 4])."
    )

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "eval": 100}

    def __init__(
        self,
        game: str | None = None,
        game_kwargs: dict[str, Any] | None = None,
        observation: str = "latest",
        error_allowance: int | None = None,
        num_players: int | None = None,
        bracket_actions: bool | None = None,
        max_action_chars: int = 2000,
    ):
        if game is not None and not isinstance(game, str):
            raise ValueError(f"`game` must be a TextArena game id such as 'Sokoban-v0', got {game!r}")
        if game_kwargs is not None and not isinstance(game_kwargs, dict):
            raise ValueError(f"`game_kwargs` must be a dict of the game's constructor arguments, got {game_kwargs!r}")
        if observation not in ("latest", "full"):
            raise ValueError(f"`observation` must be 'latest' or 'full', got {observation!r}")
        if error_allowance is not None:
            error_allowance = check_int("error_allowance", error_allowance, 0)
        if num_players is not None:
            num_players = check_int("num_players", num_players, 1)
        if bracket_actions not in (None, True, False):
            raise ValueError(f"`bracket_actions` must be None (the game's default) or a bool, got {bracket_actions!r}")
        _import_textarena()
        self.game = game
        self.game_kwargs = dict(game_kwargs or {})
        self.observation = observation
        self.error_allowance = error_allowance
        self.num_players = num_players
        self.bracket_actions = bracket_actions
        self.max_action_chars = check_int("max_action_chars", max_action_chars, 1)
        self.roles: tuple[str, ...] = ()  # set per game: player_0, player_1, ... for multi-player games
        self._spec: _GameSpec | None = None
        self._episode: _Episode | None = None
        if game is not None:  # fail early on an unknown or unavailable game, and know the roles up front
            self._spec = _load_game(game, self.game_kwargs)
            self.roles = _role_names(self._players_for(self._spec))

    # ---- random state isolation ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _in_game(self, episode: _Episode):
        """Run TextArena code with this episode's own global-`random` state, then put the caller's state back.

        Some games also print debugging lines ("Generated puzzle in 2 attempts"); they are silenced.
        """
        with _GLOBAL_RANDOM_LOCK:
            outer = random.getstate()
            random.setstate(episode.rng_state)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    yield
            finally:
                episode.rng_state = random.getstate()
                random.setstate(outer)

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Start the task's game with its seed and return the first player's observation."""
        game = task.get("game") or self.game  # a dataset fills missing keys with None
        if not isinstance(game, str):
            raise ValueError(
                f"A TextArena task needs a 'game' id (e.g. 'Sokoban-v0'), in the row or as the `game=` constructor "
                f"argument; got {game!r}"
            )
        seed = task.get("seed")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"A TextArena task needs an integer 'seed', got {seed!r} (keys {sorted(task)})")
        game_kwargs = task.get("game_kwargs") or {}
        if not isinstance(game_kwargs, dict):
            raise ValueError(f"Task field 'game_kwargs' must be a dict, got {game_kwargs!r}")
        kwargs = {**self.game_kwargs, **game_kwargs}
        if self._spec is None or (self._spec.game, self._spec.game_kwargs) != (game, kwargs):
            self._spec = _load_game(game, kwargs)
        spec = self._spec
        players = self._players_for(spec)
        self.roles = _role_names(players)
        episode = _Episode(spec, players, random.Random(int(seed)).getstate())
        for pid in range(players):
            episode.prompts[pid], episode.boards[pid], episode.news[pid], episode.transcript[pid] = "", "", [], []
        with self._in_game(episode):
            game_env = spec.env_class(**spec.kwargs)
            game_env.reset(num_players=players, seed=int(seed))
            if self.error_allowance is not None:
                game_env.state.error_allowance = self.error_allowance
        episode.game_env = game_env
        self._episode = episode
        self._collect_messages(episode)
        return self._observation(episode, self._acting_player(episode))

    def _players_for(self, spec: _GameSpec) -> int:
        if self.num_players is not None:
            return self.num_players
        cached = _NUM_PLAYERS_CACHE.get(spec.game)
        if cached is None:
            cached = _NUM_PLAYERS_CACHE[spec.game] = _infer_num_players(spec)
        return cached

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        episode = self._require_episode()
        if episode.done:
            raise RuntimeError("The game is over; call reset() first")
        game_env = episode.game_env
        state = game_env.state
        acting = self._acting_player(episode)
        action = extract_answer(action_text)[: self.max_action_chars]
        bracket = episode.spec.bracket_actions if self.bracket_actions is None else self.bracket_actions
        if bracket and "[" not in action and "]" not in action:
            action = f"[{action}]"
        errors_before = getattr(state, "error_count", 0)
        flagged_before = bool(state.game_info.get(acting, {}).get("invalid_move", False))
        with self._in_game(episode):
            done, step_info = game_env.step(action)
        state = game_env.state
        flagged = bool(state.game_info.get(acting, {}).get("invalid_move", False))
        valid = not (getattr(state, "error_count", 0) > errors_before or (flagged and not flagged_before))
        self._collect_messages(episode)
        info: dict[str, Any] = {INFO_VALID: valid, INFO_SUCCESS: False, "action": action, "turn": state.turn}
        if step_info:
            info["textarena_info"] = dict(step_info)
        if self.roles:
            info["role"] = self.roles[acting]
        reward = 0.0
        if done:
            reward = self._finish(episode, acting, info)
        observation = self._observation(episode, acting if done else self._acting_player(episode))
        if done:
            observation += "\n\nGame over." + (f" {info['reason']}" if info.get("reason") else "")
        return observation, reward, bool(done), info

    def _finish(self, episode: _Episode, acting: int, info: dict[str, Any]) -> float:
        """Read TextArena's final rewards (guarding against non-numeric ones) and fill the end-of-episode info."""
        episode.done = True
        rewards, game_info = episode.game_env.close()
        final: dict[int, float] = {}
        for pid in range(episode.num_players):
            raw = (rewards or {}).get(pid, 0.0)
            value = _numeric_reward(raw)
            if value is None:
                # TextArena bug (Countdown, Cryptarithm, Slitherlink call set_invalid_move(progress, reason) against
                # the signature (reason, reward)): the "reward" is the reason text. The game ended on an invalid
                # move, so we score it 0 and report the move as invalid.
                info["reward_error"] = f"TextArena returned a non-numeric reward {raw!r}; counted as 0.0"
                info[INFO_VALID] = False
                value = 0.0
            final[pid] = value
        episode.final_rewards = final
        ended_by_invalid = any(g.get("invalid_move") for g in (game_info or {}).values() if isinstance(g, dict))
        if episode.num_players == 1:
            success = final[0] >= 1.0 and not ended_by_invalid
        else:
            success = max(final.values()) > 0 and not ended_by_invalid
        info[INFO_SUCCESS] = bool(success)
        reasons = [g.get("reason") for g in (game_info or {}).values() if isinstance(g, dict) and g.get("reason")]
        if reasons:
            info["reason"] = str(reasons[0])
        if self.roles:
            info[INFO_ROLE_REWARDS] = {self.roles[pid]: value for pid, value in final.items()}
        # Our choice for the single-policy return: the reward of the player who made the final move.
        return final.get(acting, 0.0)

    # ---- observations ----------------------------------------------------------------------------------------------

    @staticmethod
    def _acting_player(episode: _Episode) -> int:
        return int(episode.game_env.state.current_player_id)

    def _collect_messages(self, episode: _Episode) -> None:
        """Move the messages TextArena queued for every player into the per-player views."""
        queues = episode.game_env.state.observations
        for pid in range(episode.num_players):
            for record in queues.get(pid, []):
                line = _message_line(record, pid, episode.game_env.state.role_mapping)
                if line is None:
                    continue
                kind, text, own_move = line
                episode.transcript[pid].append(text)
                if own_move:
                    continue
                if kind == "PROMPT":
                    episode.prompts[pid] = (episode.prompts[pid] + "\n\n" + text).strip()
                elif kind == "GAME_BOARD":
                    episode.boards[pid] = text
                else:
                    episode.news[pid].append(text)
            queues[pid] = []

    def _observation(self, episode: _Episode, pid: int) -> str:
        if self.observation == "full":
            text = "\n".join(episode.transcript[pid])
        else:
            parts = []
            if episode.num_players > 1 and episode.prompts[pid]:
                parts.append(episode.prompts[pid])  # each player's prompt is private: it can't be the task text
            if episode.news[pid]:
                parts.append("\n".join(episode.news[pid]))
            if episode.boards[pid]:
                parts.append(episode.boards[pid])
            text = "\n\n".join(parts)
        if not episode.done:
            episode.news[pid] = []  # what this player has now been shown is no longer news
        return text.strip() or "Make your move."

    def task_description(self) -> str:
        """The game's prompt (rules and move format) in single-player games with `observation="latest"`."""
        episode = self._require_episode()
        if episode.num_players == 1 and self.observation == "latest":
            return episode.prompts.get(0, "")
        return ""

    def current_role(self) -> str:
        """`player_<id>` of the player to move in multi-player games, empty for single-player ones."""
        if not self.roles or self._episode is None:
            return self.roles[0] if self.roles else ""
        return self.roles[self._acting_player(self._episode)]

    def supports(self, capability: str) -> bool:
        """As `AgentEnv.supports`, plus `"roles"` once the game (given or last played) has several players: the
        roles depend on the game, so the class-level `capabilities()` cannot list them."""
        if capability == "roles":
            return bool(self.roles)
        return super().supports(capability)

    def _require_episode(self) -> _Episode:
        if self._episode is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._episode

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> _Episode:
        """A deep copy of the TextArena game, its random state and the per-player views."""
        return copy.deepcopy(self._require_episode())

    def restore(self, snapshot: _Episode) -> None:
        if not isinstance(snapshot, _Episode):
            raise TypeError(f"TextArenaEnv.restore() expects a snapshot from TextArenaEnv.snapshot(), got {snapshot!r}")
        self._episode = copy.deepcopy(snapshot)  # the snapshot stays reusable
        self.roles = _role_names(snapshot.num_players)

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows for the game named by `game=` (required): `"train"` seeds from 0, `"eval"` from 1,000,000."""
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown TextArena split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        game = env_kwargs.get("game")
        if not isinstance(game, str):
            raise ValueError("TextArenaEnv.task_split needs the game id: task_split('train', game='Sokoban-v0')")
        cls(**env_kwargs)  # validate the arguments (and that the game runs here)
        count = cls.SPLIT_DEFAULT_COUNT[split] if count is None else check_int("count", count, 0)
        if count > 1_000_000:
            raise ValueError("`count` must be <= 1_000_000 so that split seed ranges stay disjoint")
        start = cls.SPLIT_SEED_START[split]
        return [
            {"env": cls.name, "task_id": f"{cls.name}-{game}-{split}-{s}", "game": game, "seed": s}
            for s in range(start, start + count)
        ]


# ---- helpers -------------------------------------------------------------------------------------------------------


def _role_names(players: int) -> tuple[str, ...]:
    return tuple(f"player_{pid}" for pid in range(players)) if players > 1 else ()


def _infer_num_players(spec: _GameSpec) -> int:
    """1 if the game starts with one player, else 2 (TextArena's states assert their player count at reset)."""
    errors = []
    with _GLOBAL_RANDOM_LOCK:
        outer = random.getstate()
        try:
            for players in (1, 2):
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        spec.env_class(**spec.kwargs).reset(num_players=players, seed=0)
                    return players
                except Exception as err:  # noqa: BLE001 - each game reports a wrong player count its own way
                    errors.append(f"{players} player(s): {type(err).__name__}: {err}")
        finally:
            random.setstate(outer)
    raise ValueError(
        f"TextArena game {spec.game!r} started neither with 1 nor with 2 players ({'; '.join(errors)}); pass "
        "num_players= explicitly."
    )


def _message_line(record: Any, recipient: int, role_mapping: dict) -> tuple[str, str, bool] | None:
    """`(kind, text, own_move)` for one queued TextArena message, or None for a record that is not a message.

    Moves are labelled with the player's name (`[Player 1] [4]`); `own_move` marks the recipient's own move echoed
    back, which the "latest" view drops (the policy wrote it) and the "full" transcript keeps. Some games queue
    malformed records (Countdown passes its arguments in the wrong order); they are skipped.
    """
    if not isinstance(record, (tuple, list)) or len(record) != 3:
        return None
    sender, text, kind = record
    kind_name = getattr(kind, "name", None)
    if not isinstance(text, str) or not text.strip() or kind_name is None:
        return None
    if kind_name == "PLAYER_ACTION":
        own = sender in (recipient, _GAME_ID) or not isinstance(sender, int)
        name = role_mapping.get(recipient if own else sender, f"Player {sender}")
        return kind_name, f"[{name}] {text.strip()}", own
    return kind_name, text.strip("\n"), False


def _numeric_reward(value: Any) -> float | None:
    """A float for numeric rewards (and numeric strings), None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None

