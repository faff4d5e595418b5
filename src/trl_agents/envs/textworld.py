"""TextWorld: parser-based text adventures generated locally with TextWorld's own game generator (`tw-make`).

A task row names a generator challenge and a seed (`{"challenge": "tw-coin_collector", "seed": 3, "level": 5}`),
or a game the user made (`{"game_file": "games/my_game.z8"}`). Generated games are compiled once with Inform 7
(one to a few seconds each, up to ~14 s for big games on 2 cores, envs/textworld/README.md) and cached under
`cache_dir("textworld", "games")`, keyed by the challenge, seed, settings and TextWorld version, so every process
plays the same byte-identical game.

The adapter asks TextWorld for the admissible commands, the quest tracker's policy (the expert plan), the score
and win/loss flags, and accepts only admissible commands (our choice, see `TextWorld`).

Example:
    >>> import os, shutil, tempfile
    >>> os.environ["TRL_AGENTS_CACHE"] = tempfile.mkdtemp()  # where the compiled game goes
    >>> from trl_agents.envs.textworld import TextWorld
    >>> env = TextWorld()
    >>> observation = env.reset({"challenge": "tw-coin_collector", "seed": 1, "level": 1})
    >>> env.optimal_plan()
    ['take coin']
    >>> observation, reward, done, info = env.step("<action>take coin</action>")
    >>> reward, done, info["success"]
    (1.0, True, True)
    >>> env.close(); shutil.rmtree(os.environ.pop("TRL_AGENTS_CACHE"))
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import numbers
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .cache import cache_dir
from .parsing import extract_answer
from .registry import register_env

_INSTALL_HINT = 'TextWorld needs the `textworld` package: pip install "trl-agents[envs]"'

CUSTOM = "custom"  # tw-make's own generator (random world and quest), not a registered challenge
# Our defaults for the settings `tw-make` requires (it has none for these) and for the custom generator.
DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "tw-coin_collector": {"level": 5},
    "tw-treasure_hunter": {"level": 5},
    "tw-simple": {"rewards": "dense", "goal": "detailed"},
    "tw-cooking": {},
    CUSTOM: {"world_size": 5, "nb_objects": 10, "quest_length": 5, "quest_breadth": 1},
}
_CUSTOM_MINIMUM = {"world_size": 1, "nb_objects": 0, "quest_length": 1, "quest_breadth": 1}

_generation_lock = threading.Lock()
# The prompt line Inform prints after every command: "> " followed by the status bar ("-= Kitchen =-0/3").
_PROMPT_LINE = re.compile(r"\n>[^\n]*\s*$")
_RESTART_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"
_BANNER_LINE = re.compile(r"^[\s_|\\$/<>]*$")  # the ASCII-art "TEXTWORLD" title printed before the first turn


def _import_textworld():
    try:
        import textworld
        import textworld.challenges
        import textworld.generator
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return textworld


# ---- challenge settings ------------------------------------------------------------------------------------------


def challenge_names() -> list[str]:
    """The generators a task row may name: TextWorld's registered challenges (`tw-*`) and `"custom"`."""
    textworld = _import_textworld()
    return sorted(textworld.challenges.CHALLENGES) + [CUSTOM]


def _canonical_challenge(name: Any) -> str:
    names = challenge_names()
    if isinstance(name, str):
        if name in names:
            return name
        if f"tw-{name}" in names:  # "coin_collector" for "tw-coin_collector"
            return f"tw-{name}"
    raise ValueError(f"Unknown TextWorld `challenge` {name!r}; choose one of {names}")


def _settings_spec(challenge: str) -> dict[str, tuple[str, Any, tuple | None, bool]]:
    """Setting name -> (kind: "int" | "bool" | "str", tw-make default, allowed values or None, required)."""
    if challenge == CUSTOM:
        return {key: ("int", value, None, True) for key, value in DEFAULT_SETTINGS[CUSTOM].items()}
    textworld = _import_textworld()
    _, _, add_arguments = textworld.challenges.CHALLENGES[challenge]
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    spec = {}
    for action in parser._actions:
        if isinstance(action, argparse._StoreTrueAction):
            spec[action.dest] = ("bool", False, None, False)
        else:
            kind = "int" if action.type is int else "str"
            choices = tuple(action.choices) if action.choices else None
            spec[action.dest] = (kind, action.default, choices, action.required)
    return spec


def resolve_settings(challenge: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every setting of `challenge`: tw-make's defaults, then ours (`DEFAULT_SETTINGS`), then `overrides` (keys that
    are not settings of this challenge are ignored). Raises ValueError naming a bad value."""
    spec = _settings_spec(challenge)
    settings = {key: default for key, (_, default, _, _) in spec.items()}
    settings.update(DEFAULT_SETTINGS.get(challenge, {}))
    settings.update({key: value for key, value in overrides.items() if key in spec})
    for key, (kind, _, choices, required) in spec.items():
        value = settings[key]
        if value is None:
            if required:
                raise ValueError(f"TextWorld {challenge} needs the setting `{key}`")
            continue
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"TextWorld {challenge} setting `{key}` must be a bool, got {value!r}")
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"TextWorld {challenge} setting `{key}` must be an integer, got {value!r}")
            settings[key] = value = int(value)
            if challenge == CUSTOM and value < _CUSTOM_MINIMUM[key]:
                raise ValueError(f"TextWorld custom setting `{key}` must be >= {_CUSTOM_MINIMUM[key]}, got {value}")
        if choices is not None and value not in choices:
            raise ValueError(f"TextWorld {challenge} setting `{key}` must be one of {list(choices)}, got {value!r}")
    return settings


# ---- game generation and cache -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _inform_home():
    """Point HOME at the cache while Inform 7 compiles: its `ni` compiler writes `$HOME/Inform/` (documentation
    index and telemetry), and an environment may only write under `cache_dir`. Callers hold `_generation_lock`."""
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(cache_dir("textworld", "inform-home"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved


def game_path(challenge: str, seed: int, settings: dict[str, Any]) -> Path:
    """Where the game of (challenge, seed, settings) is cached: the key also holds the TextWorld version, because
    another generator version may make another game from the same seed."""
    textworld = _import_textworld()
    key = json.dumps(
        {"challenge": challenge, "seed": seed, "settings": settings, "textworld": textworld.__version__}, sort_keys=True
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir("textworld", "games") / f"{challenge}-{seed}-{digest}.z8"


def generate_game(challenge: str, seed: int, settings: dict[str, Any]) -> Path:
    """The compiled game (`.z8` plus TextWorld's `.json` next to it) of a challenge, seed and full settings;
    generated and compiled on the first call, read from the cache afterwards.

    Files are built in a scratch folder of the cache and moved in place (`.json` first, `.z8` last), so a `.z8` in
    the cache is always complete, even with several processes generating at once.
    """
    target = game_path(challenge, seed, settings)
    if target.exists():
        return target
    textworld = _import_textworld()
    with _generation_lock:
        if target.exists():
            return target
        scratch = Path(tempfile.mkdtemp(dir=cache_dir("textworld", "tmp")))
        try:
            options = textworld.GameOptions()
            options.seeds = seed
            options.path = str(scratch / "game.z8")
            with _inform_home():
                if challenge == CUSTOM:
                    options.nb_rooms = settings["world_size"]
                    options.nb_objects = settings["nb_objects"]
                    options.quest_length = settings["quest_length"]
                    options.quest_breadth = settings["quest_breadth"]
                    try:
                        game = textworld.generator.make_game(options)
                    except textworld.generator.QuestGenerationError as err:
                        raise ValueError(
                            f"TextWorld cannot make a custom quest with {settings} (seed {seed}): lower "
                            "`quest_length`/`quest_breadth` or raise `world_size`/`nb_objects`."
                        ) from err
                else:
                    _, make, _ = textworld.challenges.CHALLENGES[challenge]
                    game = make(settings=dict(settings), options=options)
                compiled = Path(textworld.generator.compile_game(game, options))
            os.replace(compiled.with_suffix(".json"), target.with_suffix(".json"))
            os.replace(compiled, target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def _user_game(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"TextWorld `game_file` must be a path, got {path!r}")  # noqa: TRY004 - bad input: ValueError
    game = Path(path).expanduser()
    if game.suffix == ".ulx":
        raise ValueError(
            f"TextWorld `game_file` {game} is a Glulx game: TextWorld 1.7 plays only .z8 games (make it again with "
            "`tw-make ... --format z8`, or with this env's generator)"
        )
    if game.suffix != ".z8":
        raise ValueError(f"TextWorld `game_file` must be a .z8 game made by TextWorld, got {game}")
    if not game.is_file():
        raise ValueError(f"TextWorld `game_file` {game} does not exist")
    if not game.with_suffix(".json").is_file():
        raise ValueError(
            f"TextWorld `game_file` {game} has no {game.with_suffix('.json').name} next to it: the admissible "
            "commands, score and expert plan come from the .json that tw-make writes with the game"
        )
    return game.resolve()


# ---- observation text --------------------------------------------------------------------------------------------


def clean_feedback(text: str) -> str:
    """Inform's output without the interpreter's chrome: the title banner, the `>` prompt with its status bar,
    the restart question after the end, blank-line runs and indentation."""
    text = _PROMPT_LINE.sub("", text or "").replace(_RESTART_QUESTION, "")
    lines = [line.strip() for line in text.splitlines()]
    while lines and _BANNER_LINE.match(lines[0]):
        lines.pop(0)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _squash(text: str) -> str:
    return " ".join(text.split())


# ---- the environment ---------------------------------------------------------------------------------------------


@register_env
class TextWorld(AgentEnv):
    """TextWorld text adventures (Côté et al. 2018), generated locally and played through TextWorld's Inform 7 /
    Jericho backend.

    Task rows:

    - `{"challenge": name, "seed": s, <settings>}`: a generated game. `name` is `tw-coin_collector`,
      `tw-treasure_hunter`, `tw-simple`, `tw-cooking` (the `tw-` prefix may be left out) or `custom`; the settings
      are `tw-make`'s for that challenge (`level`; `rewards`, `goal`, `test`; `recipe`, `take`, `go`, `open`,
      `cook`, `cut`, `drop`, `recipe_seed`, `split`) or, for `custom`, `world_size`, `nb_objects`, `quest_length`,
      `quest_breadth`. A row without `challenge` uses the constructor's challenge and settings.
    - `{"game_file": path}`: a `.z8` game made by TextWorld, with its `.json` next to it.

    Commands: only the admissible commands TextWorld lists for the current state are accepted (our choice: the game
    parser also answers other text, but without a list the model cannot know TextWorld's exact phrasing, and a
    rejected command must leave the state unchanged). Matching ignores case, extra spaces, a trailing period and a
    leading `>`. Anything else gives `info["valid"] = False`, reward 0 and an unchanged game.

    Args:
        challenge: Challenge of rows that do not name one.
        challenge_settings: Settings of that challenge (missing ones take `DEFAULT_SETTINGS`, then tw-make's).
        reward: `"normalized"` (default, our choice): score gained / the game's max score, so a won game returns 1
            whatever its point scale; `"score"`: the raw score gained (TextWorld's points).
        observation: `"full"` (default): the game's response, then the room description (when the response does not
            already contain it) and the inventory, so every observation shows the current state (history-free, our
            choice); `"feedback"`: the game's response only, as in TextWorld.
        show_admissible: End every observation with the list of admissible commands (default True).
    """

    name = "textworld"
    task_keys = ("challenge", "game_file", "seed")
    requires = ("textworld", "jericho")
    thread_safe = False  # textworld.start() parses the game's logic with a module-level parser (shared with ALFWorld)
    instructions = (
        "You are playing a text adventure game. Read the observation, then act to complete the goal.\n"
        "Reply with exactly one command, written as in the list of valid commands (for example: go north, "
        "take coin, open wooden door)."
    )

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000, "unseen": 2_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "eval": 100, "unseen": 100}

    def __init__(
        self,
        challenge: str = "tw-coin_collector",
        challenge_settings: dict[str, Any] | None = None,
        reward: str = "normalized",
        observation: str = "full",
        show_admissible: bool = True,
    ):
        textworld = _import_textworld()
        self.challenge = _canonical_challenge(challenge)
        if challenge_settings is not None and not isinstance(challenge_settings, dict):
            raise ValueError(f"`challenge_settings` must be a dict, got {challenge_settings!r}")
        self.challenge_settings = dict(challenge_settings or {})
        unknown = set(self.challenge_settings) - set(_settings_spec(self.challenge))
        if unknown:
            raise ValueError(
                f"`challenge_settings` has keys {sorted(unknown)} that {self.challenge} does not take; its settings "
                f"are {sorted(_settings_spec(self.challenge))}"
            )
        resolve_settings(self.challenge, self.challenge_settings)
        if reward not in ("normalized", "score"):
            raise ValueError(f"`reward` must be 'normalized' or 'score', got {reward!r}")
        if observation not in ("full", "feedback"):
            raise ValueError(f"`observation` must be 'full' or 'feedback', got {observation!r}")
        if show_admissible not in (True, False):
            raise ValueError(f"`show_admissible` must be a bool, got {show_admissible!r}")
        self.reward = reward
        self.observation = observation
        self.show_admissible = show_admissible
        self._request_infos = textworld.EnvInfos(
            admissible_commands=True,
            policy_commands=True,
            score=True,
            max_score=True,
            won=True,
            lost=True,
            objective=True,
            description=True,
            inventory=True,
        )
        self._env = None
        self._game_file: Path | None = None
        self._view: dict[str, Any] | None = None  # what the last state showed (see `_read_state`)

    # ---- tasks -----------------------------------------------------------------------------------------------------

    def game_file_for(self, task: dict[str, Any]) -> Path:
        """The compiled game a task row plays (generated and cached on first use)."""
        if task.get("game_file") is not None:
            return _user_game(task["game_file"])
        if task.get("seed") is None:
            raise ValueError(f"A TextWorld task needs a 'seed' (or a 'game_file'), got keys {sorted(task)}")
        seed = task["seed"]
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"TextWorld task 'seed' must be an integer >= 0, got {seed!r}")
        if task.get("challenge") is None:
            challenge, overrides = self.challenge, {**self.challenge_settings, **task}
        else:
            challenge = _canonical_challenge(task["challenge"])
            base = self.challenge_settings if challenge == self.challenge else {}
            overrides = {**base, **task}
        return generate_game(challenge, int(seed), resolve_settings(challenge, overrides))

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        game_file = self.game_file_for(task)
        if self._env is None or game_file != self._game_file:
            textworld = _import_textworld()
            self.close()
            self._env = textworld.start(str(game_file), request_infos=self._request_infos)
            self._game_file = game_file
        state = self._env.reset()
        self._read_state(state, previous_score=None)
        return self._render(clean_feedback(state["feedback"]) if self.observation == "feedback" else None)

    def task_description(self) -> str:
        return self._require_view()["objective"]

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        view = self._require_view()
        if view["done"]:
            raise RuntimeError("The episode is over; call reset() first")
        command = self._normalise(action_text)
        if command not in view["admissible"]:
            shown = command if command else "(nothing)"
            feedback = f'Invalid command "{shown}". Reply with exactly one of the valid commands.'
            return self._render(feedback, invalid=True), 0.0, False, self._info(False, command or None)
        state, _, _ = self._env.step(command)
        gained = self._read_state(state, previous_score=view["score"])
        reward = gained if self.reward == "score" else gained / max(1, self._view["max_score"])
        observation = self._render(clean_feedback(state["feedback"]))
        return observation, float(reward), self._view["done"], self._info(True, command)

    @staticmethod
    def _normalise(action_text: str) -> str:
        return " ".join(extract_answer(action_text).split()).lower().lstrip("> ").rstrip(".")

    def _read_state(self, state, previous_score: int | None) -> int:
        """Keep what we need from TextWorld's state (a copied env does not carry it); return the score gained."""
        facts = sorted(str(fact) for fact in state["_facts"])
        won, lost = bool(state["won"]), bool(state["lost"])
        score = int(state["score"] or 0)
        self._view = {
            "admissible": list(state["admissible_commands"] or []),
            "policy": list(state["policy_commands"] or []),
            "score": score,
            "max_score": int(state["max_score"] or 0),
            "won": won,
            "lost": lost,
            "done": won or lost,
            "objective": state["objective"] or "",
            "description": clean_feedback(state["description"] or ""),
            "inventory": clean_feedback(state["inventory"] or ""),
            "facts_digest": hashlib.sha1("\n".join(facts).encode()).hexdigest(),
        }
        return 0 if previous_score is None else score - previous_score

    def _render(self, feedback: str | None, invalid: bool = False) -> str:
        """The observation: the game's response; in "full" mode then the room description (unless the response
        holds it) and the inventory; then the admissible commands (`show_admissible`, or after an invalid command)."""
        view = self._view
        parts = [feedback] if feedback else []
        if self.observation == "full":
            if view["description"] and _squash(view["description"]) not in _squash(feedback or ""):
                parts.append(view["description"])
            if view["inventory"]:
                parts.append(view["inventory"])
        if (self.show_admissible or invalid) and not view["done"]:
            parts.append("Valid commands: " + ", ".join(view["admissible"]))
        return "\n\n".join(parts)

    def _info(self, valid: bool, command: str | None) -> dict[str, Any]:
        view = self._view
        return {
            INFO_VALID: valid,
            INFO_SUCCESS: view["won"],
            "action": command,
            "score": view["score"],
            "max_score": view["max_score"],
            "lost": view["lost"],
        }

    def _require_view(self) -> dict[str, Any]:
        if self._view is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._view

    def admissible_actions(self) -> list[str]:
        return list(self._require_view()["admissible"])

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._game_file = None

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        """A copy of the running game (`env.copy()`: the Z-machine state plus TextWorld's quest tracker; ~20 ms for
        small games, up to ~0.5 s for big ones) and of what the adapter read from the last state."""
        self._require_view()
        return self._env.copy(), self._game_file, dict(self._view)

    def restore(self, snapshot: tuple) -> None:
        env, game_file, view = snapshot
        old = self._env
        self._env = env.copy()  # copy again: the snapshot stays valid for further restores
        self._game_file, self._view = game_file, dict(view)
        if old is not None:
            old.close()

    def state_key(self) -> str:
        """Digest of the world's logical facts (room of the player and of every object, open/closed/locked...),
        which TextWorld tracks; equal digests mean the same world state, however it was reached."""
        return self._require_view()["facts_digest"]

    def optimal_plan(self) -> list[str] | None:
        """The expert plan from the current state: TextWorld's quest-tracker policy (`policy_commands`), i.e. the
        game's walkthrough, with undo steps for detours and shortcuts the tracker finds. It wins the game but is not
        guaranteed shortest. `[]` once won, None once lost or when the quest can no longer be completed."""
        view = self._require_view()
        if view["won"]:
            return []
        if view["lost"] or not view["policy"]:
            return None
        return list(view["policy"])

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def split_settings(cls, split: str, challenge: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Settings of a split (our choice): train and eval play the given settings; for tw-cooking the food split
        follows the split (train/valid/test), and "unseen" is harder: level + 10 (coin collector up to 100, treasure
        hunter up to 30), tw-simple's test distribution, custom quests 3 actions longer in 5 more rooms."""
        settings = dict(settings)
        if challenge == "tw-cooking":
            settings["split"] = {"train": "train", "eval": "valid", "unseen": "test"}[split]
        if split != "unseen":
            return settings
        if challenge == "tw-coin_collector":
            settings["level"] = min(100, settings["level"] + 10)
        elif challenge == "tw-treasure_hunter":
            settings["level"] = min(30, settings["level"] + 10)
        elif challenge == "tw-simple":
            settings["test"] = True
        elif challenge == CUSTOM:
            settings["quest_length"] += 3
            settings["world_size"] += 5
        return settings

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows: `"train"` (seeds from 0), `"eval"` (from 1_000_000) and `"unseen"` (from 2_000_000,
        harder settings, see `split_settings`) of the env's challenge. Rows carry the challenge and every setting, so
        any env instance plays the same games. No game is generated here: each is compiled on its first reset."""
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown TextWorld split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        env = cls(**env_kwargs)  # validates every argument
        if count is None:
            count = cls.SPLIT_DEFAULT_COUNT[split]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 0 <= count <= 1_000_000:
            raise ValueError(f"`count` must be an integer in [0, 1_000_000], got {count!r}")
        settings = resolve_settings(env.challenge, env.challenge_settings)
        settings = resolve_settings(env.challenge, cls.split_settings(split, env.challenge, settings))
        start = cls.SPLIT_SEED_START[split]
        return [
            {
                "env": cls.name,
                "task_id": f"{cls.name}-{env.challenge}-{split}-{seed}",
                "challenge": env.challenge,
                "seed": seed,
                **settings,
            }
            for seed in range(start, start + count)
        ]
