"""An offline generator of ALFWorld-style games, built from the data files that ship in the `alfworld` wheel.

The `alfworld` 0.4.2 wheel has no games (`alfworld-download` fetches them from GitHub), but it ships everything needed
to make new ones: the PDDL domain (`alfworld/data/alfred.pddl`), the text grammar (`alfred.twl2`), the object and
receptacle lists of the 120 AI2-THOR floor plans (`alfworld/gen/layouts/FloorPlan*-objects.json` and
`-openable.json`), which objects fit in which receptacle and which can be heated, cooled, cleaned or switched on
(`alfworld/gen/constants.py`), and the PDDL goal and sentence templates of every task type
(`alfworld/gen/goal_library.py`). From these, `generate_game` writes a game in the official format (`game.tw-pddl`:
a JSON with `pddl_domain`, `grammar`, `pddl_problem`, `solvable`, `walkthrough`) plus a minimal `traj_data.json`
(`task_type`, `pddl_params`, `scene`), in a folder laid out like one trial of the official data, so the official
loader and our adapter can play it (`envs/alfworld/README.md`, "Generation": every generated game is checked by
playing its expert plan).

What is ALFWorld-*style* here and not the benchmark:

- the floor plan, its receptacle types (and, where the layout lists them, its receptacle instances) are THOR's, but
  **object placement is sampled** (which objects exist, how many, in which receptacle), not taken from THOR physics
  or from ALFRED's recorded trajectories;
- the games are not the benchmark's train / valid_seen / valid_unseen split (3553 / 140 / 134 games), and their
  numbers are not comparable with published ALFWorld results; `floor_plans="unseen"` only mirrors the benchmark's
  idea of held-out rooms by drawing from ALFRED's test floor plans (`constants.TEST_SCENE_NUMBERS`).

Every game is solved when it is generated: `shortest_plan` (an exact search over the task-relevant state, see
`_Search`) finds a shortest plan from the facts of the loaded game, and the plan is then played in TextWorld's
`PddlEnv` and must win; otherwise the sample is redrawn. The plan is stored as the game's `walkthrough`. ALFWorld's
PLANNER expert (fast-downward through `PddlState.replan`, `planner_plan` here) finds plans of the same length, but
its search has no heuristic and took from 0.01 s to over 15 s per game on generated kitchens with many drawers and
cabinets, so it is only the tests' cross-check.

Example:
    >>> import os, tempfile
    >>> os.environ["TRL_AGENTS_CACHE"] = tempfile.mkdtemp()
    >>> game_dir = generate_game(seed=3, task_type="pick_clean_then_place_in_recep")
    >>> sorted(path.name for path in game_dir.iterdir())
    ['game.tw-pddl', 'traj_data.json']
    >>> import json
    >>> json.loads((game_dir / "traj_data.json").read_text())["task_type"]
    'pick_clean_then_place_in_recep'
    >>> del os.environ["TRL_AGENTS_CACHE"]
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import itertools
import json
import math
import numbers
import os
import random
import re
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..fileio import atomic_write
from .cache import cache_dir

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Which floor plans a game is drawn from: ALFRED's training scenes, or its held-out test scenes.
FLOOR_PLAN_SETS: tuple[str, ...] = ("train", "unseen")
# Bump when a change to the generator changes the games of existing seeds (it is part of the cache path).
GENERATOR_VERSION = 1
DEFAULT_NUM_DISTRACTOR_TYPES = 8
MAX_DISTRACTOR_TYPES = 30

INSTALL_HINT = 'pip install "trl-agents[envs]"'
_MAX_ATTEMPTS = 25
# Receptacle types a desk lamp or floor lamp is put on (THOR has lamps standing on these; the goal needs the lamp
# "in" a receptacle the agent can stand at, as in the official games).
_LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser", "Shelf", "DiningTable", "CoffeeTable", "TVStand")
_LAMP_TYPES = ("DeskLamp", "FloorLamp")
# Receptacle types the generator creates when a floor plan's object list names them but its openable list has no
# instance: one each, except the four burners of a THOR stove (our choice).
_SYNTHETIC_RECEPTACLE_COUNT = {"StoveBurner": 4}
# Goal receptacle types a task may not use: the appliance that does the task's state change (ALFRED's tasks put the
# object elsewhere after heating / cooling / cleaning it).
_EXCLUDED_PARENTS = {
    "pick_clean_then_place_in_recep": {"SinkBasin", "BathtubBasin"},
    "pick_heat_then_place_in_recep": {"Microwave"},
    "pick_cool_then_place_in_recep": {"Fridge"},
}
_REQUIRED_APPLIANCE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}


# ---- the alfworld / textworld packages -------------------------------------------------------------------------


def default_alfworld_data() -> Path:
    """Where `ALFWORLD_DATA` points when the user has not set it.

    `import alfworld` creates `$ALFWORLD_DATA` (default `~/.cache/alfworld`). When the variable is unset we point it at
    an existing `~/.cache/alfworld` (where `alfworld-download` puts the official data; nothing is created) or else
    at `cache_dir("alfworld", "alfworld_data")`, so importing alfworld never creates folders in a user's home.
    """
    official_default = Path(os.path.expanduser("~"), ".cache", "alfworld")
    return official_default if official_default.is_dir() else cache_dir("alfworld", "alfworld_data")


def import_alfworld() -> Any:
    """Import and return `alfworld.gen.constants`, after setting `ALFWORLD_DATA` if unset (see `default_alfworld_data`).

    Raises ImportError with the install command when alfworld, textworld or fast-downward is missing.
    """
    if not os.environ.get("ALFWORLD_DATA"):
        os.environ["ALFWORLD_DATA"] = str(default_alfworld_data())
    try:
        import fast_downward  # noqa: F401
        import textworld.envs  # noqa: F401
        from alfworld.gen import constants
    except ImportError as err:
        raise ImportError(
            f"The ALFWorld environment needs the packages alfworld, textworld and fast-downward-textworld "
            f"({err}). Install them with: {INSTALL_HINT}"
        ) from err
    return constants


_TRANSLATION_LOCK = threading.RLock()
_TRANSLATIONS: OrderedDict[tuple[str, bool], Any] = OrderedDict()
TRANSLATION_CACHE_SIZE = 16  # games whose PDDL -> SAS translation is kept in memory (about 2-6 MB each)


@contextlib.contextmanager
def cached_pddl_translation():
    """Within this block, TextWorld's PDDL loads reuse earlier PDDL -> SAS translations of the same problem.

    `PddlEnv.load()` and every `PddlEnv.reset()` translate the problem twice with fast-downward's Python translator
    (0.3-2 s on ALFWorld-sized problems), although the result only depends on the domain and problem text. Replay
    snapshots reset the game often, so we memoise `fast_downward.pddl2sas` (keyed by a hash of both texts, LRU of
    `TRANSLATION_CACHE_SIZE` entries): a reset then costs ~0.1 s. The translation is a pure function of its inputs and
    TextWorld only reads the cached task, so sharing it is safe. The patch is scoped (and serialised by a lock), and
    `sys.argv`, which the translator overwrites, is restored afterwards.
    """
    import fast_downward

    with _TRANSLATION_LOCK:
        original, argv = fast_downward.pddl2sas, sys.argv

        def translate(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
            key = (hashlib.sha256(f"{domain}\0{problem}".encode()).hexdigest(), bool(optimize))
            result = _TRANSLATIONS.get(key)
            if result is None:
                result = _TRANSLATIONS[key] = original(domain, problem, verbose=verbose, optimize=optimize)
                while len(_TRANSLATIONS) > 2 * TRANSLATION_CACHE_SIZE:  # two translations per game
                    _TRANSLATIONS.popitem(last=False)
            else:
                _TRANSLATIONS.move_to_end(key)
            return result

        fast_downward.pddl2sas = translate
        try:
            yield
        finally:
            fast_downward.pddl2sas = original
            sys.argv = argv


def new_pddl_env() -> Any:
    """A TextWorld `PddlEnv` wrapped in ALFWorld's `AlfredDemangler` (object ids -> names like "apple 1"), as the
    official `AlfredTWEnv` plays games (its `AlfredInfos` wrapper only adds the game path to the infos, so we skip
    it). Each `PddlEnv` loads a private copy of fast-downward's library, so instances do not interfere. The library
    is never unloaded: `fast_downward.close_lib` makes the interpreter crash at exit, so reuse instances instead."""
    import_alfworld()
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    return AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)), shuffle=False)


def load_game(pddl_env: Any, game_data: dict[str, Any]) -> None:
    """Load a game (the content of a `game.tw-pddl`) into a wrapped `PddlEnv`, reusing cached translations."""
    with cached_pddl_translation():
        pddl_env.load(game_data)


def reset_game(pddl_env: Any) -> Any:
    """Reset the loaded game; returns TextWorld's GameState."""
    with cached_pddl_translation():
        return pddl_env.reset()


def planner_plan(pddl_env: Any) -> list[str]:
    """ALFWorld's PLANNER expert from the current state of a loaded `PddlEnv`: TextWorld's `PddlState.replan`,
    fast-downward's uniform-cost search (shortest plans). `[]` when won or unsolvable. It leaves the state unchanged.

    Exact but slow where many receptacles open (measured 0.02 s to over 15 s per call on generated kitchens: the
    search has no heuristic and branches on every open/close), so the env's `optimal_plan()` uses `shortest_plan`
    and the tests use this one as a cross-check."""
    game = pddl_env.unwrapped
    return list(game._pddl_state.replan(game._entity_infos))


_CHECK_ENV: Any = None
_CHECK_LOCK = threading.Lock()


def solve_and_check(game_data: dict[str, Any], goal: Goal) -> list[str] | None:
    """Plan a game from its start with `shortest_plan`, then play the plan in the real game engine (TextWorld's
    `PddlEnv`): the plan if every command is admissible and the last one wins, else None. Uses one shared `PddlEnv`
    for all checks (see `new_pddl_env` on why instances are reused)."""
    global _CHECK_ENV
    with _CHECK_LOCK:
        if _CHECK_ENV is None:
            _CHECK_ENV = new_pddl_env()
        load_game(_CHECK_ENV, game_data)
        state = reset_game(_CHECK_ENV)
        if state["won"]:
            return None
        plan = shortest_plan(GameFacts.from_propositions(state["_facts"]), goal, entity_names(_CHECK_ENV))
        if not plan:
            return None
        for command in plan:
            if command not in state["admissible_commands"]:
                return None
            state, _, _ = _CHECK_ENV.step(command)
        return plan if state["won"] else None


# ---- scenes --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scene:
    """What a floor plan offers: receptacle instances (THOR id, type), pickable object types and lamp types."""

    number: int
    scene_type: str
    receptacles: tuple[tuple[str, str], ...]
    object_types: tuple[str, ...]
    lamp_types: tuple[str, ...]

    @property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(kind for _, kind in self.receptacles)


def _layouts_dir(constants: Any) -> Path:
    return Path(constants.__file__).parent / "layouts"


def _receptacle_type(thor_id: str) -> str:
    # THOR names sink and bathtub basins "Sink|x|y|z|SinkBasin"; ALFWorld's demangler turns them into "sinkbasin N".
    return thor_id.rsplit("|", 1)[-1] if thor_id.endswith("Basin") else thor_id.split("|", 1)[0]


def _synthetic_id(rng: random.Random, kind: str, taken: set[str]) -> str:
    """A THOR-style object id (`Type|+x.xx|+y.yy|-z.zz`) at a sampled position, unique among `taken`."""
    prefix = "Sink" if kind == "SinkBasin" else "Bathtub" if kind == "BathtubBasin" else kind
    while True:
        x, y, z = rng.uniform(-4, 4), rng.uniform(0, 2), rng.uniform(-4, 4)
        thor_id = f"{prefix}|{x:+06.2f}|{y:+06.2f}|{z:+06.2f}"
        if kind in ("SinkBasin", "BathtubBasin"):
            thor_id += f"|{kind}"
        if thor_id not in taken:
            taken.add(thor_id)
            return thor_id


@cache
def load_scene(number: int) -> Scene:
    """The receptacles and object types of `FloorPlan{number}` from the wheel's layout files.

    Receptacle instances come from `-openable.json` (THOR's ids). Static receptacle types that `-objects.json` lists
    but `-openable.json` has no instance of (stove burners, toasters, toilets, ...) get synthetic instances, placed
    from a generator seeded by the floor plan, so a floor plan always has the same receptacles.
    """
    constants = import_alfworld()
    folder = _layouts_dir(constants)
    listed = json.loads((folder / f"FloorPlan{number}-objects.json").read_text())
    points = json.loads((folder / f"FloorPlan{number}-openable.json").read_text())
    static = constants.RECEPTACLES - constants.MOVABLE_RECEPTACLES_SET
    receptacles = sorted((thor_id, _receptacle_type(thor_id)) for thor_id in points)
    receptacles = [(thor_id, kind) for thor_id, kind in receptacles if kind in static]
    have = {kind for _, kind in receptacles}
    taken = {thor_id for thor_id, _ in receptacles}
    rng = random.Random(f"alfworld-scene/{number}")
    for kind in sorted(set(listed) & static - have):
        for _ in range(_SYNTHETIC_RECEPTACLE_COUNT.get(kind, 1)):
            receptacles.append((_synthetic_id(rng, kind, taken), kind))
    kinds = {kind for _, kind in receptacles}
    placeable = {obj for kind, fits in constants.VAL_RECEPTACLE_OBJECTS.items() if kind in kinds for obj in fits}
    object_types = sorted(t for t in set(listed) if t in placeable and t not in static and "Sliced" not in t)
    lamp_types = sorted(t for t in _LAMP_TYPES if t in listed and kinds & set(_LAMP_RECEPTACLES))
    scene_type = next(name for name, numbers_ in constants.SCENE_TYPE.items() if number in numbers_)
    return Scene(number, scene_type, tuple(sorted(receptacles)), tuple(object_types), tuple(lamp_types))


def floor_plan_numbers(floor_plans: str) -> list[int]:
    """ALFRED's training floor plans (`"train"`) or its held-out test floor plans (`"unseen"`) that have layouts."""
    constants = import_alfworld()
    numbers_ = constants.TRAIN_SCENE_NUMBERS if floor_plans == "train" else constants.TEST_SCENE_NUMBERS
    folder = _layouts_dir(constants)
    return sorted(n for n in numbers_ if (folder / f"FloorPlan{n}-objects.json").is_file())


# ---- task sampling -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskParams:
    """ALFRED's `pddl_params` of a game: the object type, the goal receptacle type, and the lamp type."""

    task_type: str
    object_target: str
    parent_target: str  # "" for look_at_obj_in_light
    toggle_target: str  # "" unless look_at_obj_in_light


def _fits(constants: Any, receptacle_type: str, object_type: str) -> bool:
    return object_type in constants.VAL_RECEPTACLE_OBJECTS.get(receptacle_type, ())


def task_candidates(scene: Scene, task_type: str) -> list[TaskParams]:
    """Every (object, goal receptacle, lamp) combination of `task_type` this scene supports, in a fixed order.

    Rules, after ALFRED's sampler (`constants.GOALS_VALID`, `VAL_ACTION_OBJECTS`, `VAL_RECEPTACLE_OBJECTS`): the room
    type must allow the task type; heat / cool / clean need a heatable / coolable / cleanable object and a microwave /
    fridge / sink basin, and the goal receptacle is not that appliance; the goal receptacle must be able to hold the
    object, and some other receptacle must be able to hold it too (the object must not start in place);
    look_at_obj_in_light needs a desk or floor lamp and any pickable object.
    """
    constants = import_alfworld()
    if scene.scene_type not in constants.GOALS_VALID[task_type]:
        return []
    kinds = scene.receptacle_types
    if task_type == "look_at_obj_in_light":
        return [
            TaskParams(task_type, obj, "", lamp)
            for lamp in scene.lamp_types
            for obj in scene.object_types
            if any(_fits(constants, kind, obj) for kind in kinds)
        ]
    appliance, ability = _REQUIRED_APPLIANCE.get(task_type, (None, None))
    if appliance is not None and appliance not in kinds:
        return []
    excluded = _EXCLUDED_PARENTS.get(task_type, set())
    found = []
    for obj in scene.object_types:
        if ability is not None and obj not in constants.VAL_ACTION_OBJECTS[ability]:
            continue
        for parent in sorted(kinds - excluded):
            starts = [kind for kind in kinds if kind != parent and _fits(constants, kind, obj)]
            if _fits(constants, parent, obj) and starts:
                found.append(TaskParams(task_type, obj, parent, ""))
    return found


def default_task_type(seed: int) -> str:
    """The task type of a seeded row that does not name one (uniform over the six, fixed per seed)."""
    return TASK_TYPES[random.Random(f"alfworld-task-type/{seed}").randrange(len(TASK_TYPES))]


# ---- PDDL ----------------------------------------------------------------------------------------------------------

_MANGLE = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}


def mangle(thor_id: str) -> str:
    """ALFRED's PDDL-safe spelling of a THOR id (`Apple|+01.00|...` -> `Apple_bar__plus_01_dot_00_bar_...`)."""
    return re.sub(r"[-|+.,]", lambda m: _MANGLE[m.group(0)], thor_id)


@dataclass
class _World:
    """A sampled game: receptacles (id, type), objects (id, type, receptacle id) and lamps (id, type, receptacle id)."""

    params: TaskParams
    scene: Scene
    objects: list[tuple[str, str, str]]
    lamps: list[tuple[str, str, str]]


def _sample_world(rng: random.Random, scene: Scene, params: TaskParams, num_distractor_types: int) -> _World | None:
    constants = import_alfworld()
    taken = {thor_id for thor_id, _ in scene.receptacles}

    def spots(obj_type: str, avoid: str = "") -> list[str]:
        return [r for r, kind in scene.receptacles if kind != avoid and _fits(constants, kind, obj_type)]

    objects = []
    target_spots = spots(params.object_target, avoid=params.parent_target)
    if not target_spots:
        return None
    low = 2 if params.task_type == "pick_two_obj_and_place" else 1
    for _ in range(rng.randint(low, 3)):  # ALFRED makes up to 3 instances of an object (MAX_NUM_OF_OBJ_INSTANCES)
        objects.append(
            (_synthetic_id(rng, params.object_target, taken), params.object_target, rng.choice(target_spots))
        )
    others = [t for t in scene.object_types if t != params.object_target and spots(t)]
    for obj_type in sorted(rng.sample(others, min(num_distractor_types, len(others)))):
        for _ in range(rng.randint(1, 3)):
            objects.append((_synthetic_id(rng, obj_type, taken), obj_type, rng.choice(spots(obj_type))))
    lamps = []
    lamp_spots = [r for r, kind in scene.receptacles if kind in _LAMP_RECEPTACLES]
    for lamp_type in scene.lamp_types:
        lamps.append((_synthetic_id(rng, lamp_type, taken), lamp_type, rng.choice(lamp_spots)))
    return _World(params, scene, objects, lamps)


def _problem_text(world: _World, name: str) -> str:
    """The PDDL problem of a sampled world, in ALFWorld's `initial_state.pddl` vocabulary.

    One location per receptacle plus the agent's start location (which has no receptacle: "You are in the middle of
    a room"). Receptacles of an openable type start closed. `canContain` covers every receptacle type x object type of
    the scene. No `:metric`: fast-downward then counts every action as 1, so the planner's plans are shortest in
    commands.
    """
    constants = import_alfworld()
    params, scene = world.params, world.scene
    things = world.objects + world.lamps
    object_types = sorted({kind for _, kind, _ in things} | {"Knife", "ButterKnife"})  # named by the domain's actions
    receptacle_types = sorted(scene.receptacle_types | {"SinkBasin", "Microwave", "Fridge"})
    location = {thor_id: f"loc_bar_{i}" for i, (thor_id, _) in enumerate(scene.receptacles)}

    declarations = ["agent1 - agent", "loc_bar_start - location"]
    declarations += [f"{kind}Type - otype" for kind in object_types]
    declarations += [f"{kind}Type - rtype" for kind in receptacle_types]
    declarations += [f"{location[r]} - location" for r, _ in scene.receptacles]
    declarations += [f"{mangle(r)} - receptacle" for r, _ in scene.receptacles]
    declarations += [f"{mangle(o)} - object" for o, _, _ in things]

    facts = ["(atLocation agent1 loc_bar_start)"]
    for receptacle, kind in scene.receptacles:
        r = mangle(receptacle)
        facts += [f"(receptacleType {r} {kind}Type)", f"(receptacleAtLocation {r} {location[receptacle]})"]
        if kind in constants.OPENABLE_CLASS_SET:
            facts.append(f"(openable {r})")
    abilities = (
        ("heatable", "Heatable"),
        ("coolable", "Coolable"),
        ("cleanable", "Cleanable"),
        ("sliceable", "Sliceable"),
    )
    for thing, kind, receptacle in things:
        o = mangle(thing)
        facts += [
            f"(objectType {o} {kind}Type)",
            f"(inReceptacle {o} {mangle(receptacle)})",
            f"(objectAtLocation {o} {location[receptacle]})",
        ]
        if kind in _LAMP_TYPES:
            facts.append(f"(toggleable {o})")  # lamps are switched on where they stand, never carried
            continue
        facts.append(f"(pickupable {o})")
        facts += [f"({predicate} {o})" for predicate, group in abilities if kind in constants.VAL_ACTION_OBJECTS[group]]
        if kind in constants.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {o})")
    for receptacle_kind in sorted(scene.receptacle_types):
        facts += [
            f"(canContain {receptacle_kind}Type {kind}Type)"
            for kind in object_types
            if _fits(constants, receptacle_kind, kind)
        ]

    from alfworld.gen import goal_library

    goal = goal_library.gdict[params.task_type]["pddl"].format(
        obj=params.object_target, recep=params.parent_target, toggle=params.toggle_target, mrecep=""
    )
    goal = goal.replace("#", "-")  # the goal library writes typed variables as "?r # receptacle"
    indent = "\n        "
    return (
        f"(define (problem {name})\n    (:domain alfred)\n    (:objects{indent}{indent.join(declarations)}\n    )\n"
        f"    (:init{indent}{indent.join(facts)}\n    )\n{goal}"
    )


def goal_sentence(rng: random.Random, params: TaskParams) -> str:
    """The task sentence from ALFRED's templates for the task type, e.g. "put a hot apple in countertop"."""
    from alfworld.gen import goal_library

    template = rng.choice(goal_library.gdict[params.task_type]["templates"])
    return template.format(
        obj=params.object_target.lower(),
        recep=params.parent_target.lower(),
        toggle=params.toggle_target.lower(),
        mrecep="",
    )


# ---- the full-knowledge expert ---------------------------------------------------------------------------------

# Dynamic predicates: the only facts that actions change (and the only ones verify() and the expert look at).
DYNAMIC_PREDICATES = ("atlocation", "holds", "inreceptacle", "opened", "ishot", "iscool", "isclean", "istoggled")
# Which predicate a task's state change sets, and the action (command verb) that sets it.
TASK_PROPERTY = {
    "pick_clean_then_place_in_recep": ("isclean", "cleanable", "clean", "sinkbasin"),
    "pick_heat_then_place_in_recep": ("ishot", "heatable", "heat", "microwave"),
    "pick_cool_then_place_in_recep": ("iscool", "coolable", "cool", "fridge"),
}


def _type_name(type_id: str) -> str:
    # PDDL type constants are lower-cased by fast-downward: "AppleType" -> "appletype" -> "apple".
    return type_id.removesuffix("type")


@dataclass(frozen=True)
class GameFacts:
    """A game state read from TextWorld's PDDL facts (ids are fast-downward's lower-cased PDDL names).

    Static: receptacle types and locations, openable receptacles, object types and abilities, `canContain` pairs.
    Dynamic (`dynamic` holds them as a set of tuples, e.g. `("holds", "agent1", "apple_bar_...")`): the agent's
    location, the held object, which receptacle holds each object, opened receptacles, hot / cool / clean objects and
    switched-on lamps. TextWorld leaves the agent's start location out of the first state, so `agent_location` is
    None there ("in the middle of the room").
    """

    receptacle_type: dict[str, str]
    receptacle_location: dict[str, str]
    openable: frozenset[str]
    object_type: dict[str, str]
    abilities: dict[str, frozenset[str]]  # "pickupable" / "heatable" / ... -> objects
    can_contain: frozenset[tuple[str, str]]  # (receptacle type, object type)
    dynamic: frozenset[tuple[str, ...]]

    @classmethod
    def from_propositions(cls, propositions: Any) -> GameFacts:
        receptacle_type, receptacle_location, object_type = {}, {}, {}
        openable, can_contain, dynamic = set(), set(), set()
        abilities: dict[str, set[str]] = {
            k: set() for k in ("pickupable", "heatable", "coolable", "cleanable", "toggleable")
        }
        for fact in propositions:
            name, args = fact.name, [variable.name for variable in fact.arguments]
            if name in DYNAMIC_PREDICATES:
                dynamic.add((name, *args))
            elif name == "receptacletype":
                receptacle_type[args[0]] = _type_name(args[1])
            elif name == "receptacleatlocation":
                receptacle_location[args[0]] = args[1]
            elif name == "objecttype":
                object_type[args[0]] = _type_name(args[1])
            elif name == "openable":
                openable.add(args[0])
            elif name == "cancontain":
                can_contain.add((_type_name(args[0]), _type_name(args[1])))
            elif name in abilities:
                abilities[name].add(args[0])
        return cls(
            receptacle_type,
            receptacle_location,
            frozenset(openable),
            object_type,
            {k: frozenset(v) for k, v in abilities.items()},
            frozenset(can_contain),
            frozenset(dynamic),
        )

    def with_dynamic(self, propositions: Any) -> GameFacts:
        """The same game with the dynamic facts of another state (static facts never change)."""
        dynamic = frozenset(
            (fact.name, *(v.name for v in fact.arguments)) for fact in propositions if fact.name in DYNAMIC_PREDICATES
        )
        return GameFacts(
            self.receptacle_type,
            self.receptacle_location,
            self.openable,
            self.object_type,
            self.abilities,
            self.can_contain,
            dynamic,
        )

    # ---- reading the dynamic state ----

    @property
    def agent_location(self) -> str | None:
        return next((fact[2] for fact in self.dynamic if fact[0] == "atlocation"), None)

    @property
    def held(self) -> str | None:
        return next((fact[2] for fact in self.dynamic if fact[0] == "holds"), None)

    def receptacle_of(self) -> dict[str, str]:
        return {fact[1]: fact[2] for fact in self.dynamic if fact[0] == "inreceptacle"}

    def having(self, predicate: str) -> frozenset[str]:
        return frozenset(fact[1] for fact in self.dynamic if fact[0] == predicate)

    def objects_of_type(self, kind: str) -> list[str]:
        return sorted(o for o, t in self.object_type.items() if t == kind)

    def receptacles_of_type(self, kind: str) -> list[str]:
        return sorted(r for r, t in self.receptacle_type.items() if t == kind)


@dataclass(frozen=True)
class Goal:
    """A task's success condition in ALFRED's terms (lower-case type names, "" when unused)."""

    task_type: str
    object_type: str
    parent_type: str = ""
    toggle_type: str = ""

    @classmethod
    def from_traj_data(cls, traj_data: dict[str, Any]) -> Goal:
        params = traj_data["pddl_params"]
        return cls(
            traj_data["task_type"],
            str(params.get("object_target") or "").lower(),
            str(params.get("parent_target") or "").lower(),
            str(params.get("toggle_target") or "").lower(),
        )

    @property
    def required_count(self) -> int:
        return 2 if self.task_type == "pick_two_obj_and_place" else 1


class _Search:
    """A* over the task-relevant part of the state: the agent's location, the held object, where each object of the
    goal type is, which relevant receptacles are open, which goal objects have the task's property, which lamps are
    on. Every command costs 1, so plans are shortest in commands.

    Only actions that can be part of a shortest plan are generated (so the search is exact): going to a location with
    a relevant receptacle (one holding a goal object, a goal receptacle, the task's appliance, a lamp, or, while the
    agent holds something else, a place to put it down); opening a relevant receptacle; taking a goal object; putting
    a goal object into a goal receptacle (or the held other object anywhere it fits); the task's heat / cool / clean
    on a held goal object; switching on a lamp of the goal type. Never useful: close, look, examine, inventory, moving
    other objects, going where nothing relevant is (there are no capacity limits in the domain).
    """

    def __init__(self, facts: GameFacts, goal: Goal, max_expansions: int):
        self.facts, self.goal, self.max_expansions = facts, goal, max_expansions
        self.targets = facts.objects_of_type(goal.object_type)
        self.parents = set(facts.receptacles_of_type(goal.parent_type)) if goal.parent_type else set()
        prop = TASK_PROPERTY.get(goal.task_type)
        self.prop_predicate = prop[0] if prop else None
        self.prop_able = facts.abilities.get(prop[1], frozenset()) if prop else frozenset()
        self.prop_verb = prop[2] if prop else None
        self.appliances = set(facts.receptacles_of_type(prop[3])) if prop else set()
        where = facts.receptacle_of()
        self.lamps = (
            {
                lamp: where[lamp]
                for lamp in facts.objects_of_type(goal.toggle_type)
                if lamp in facts.abilities["toggleable"] and lamp in where
            }
            if goal.task_type == "look_at_obj_in_light"
            else {}
        )
        held = facts.held
        relevant = {where[o] for o in self.targets if o in where} | self.parents | self.appliances
        relevant |= set(self.lamps.values())
        self.drop_spots: set[str] = set()
        if held is not None and held not in self.targets:
            kind = facts.object_type.get(held, "")
            self.drop_spots = {r for r, t in facts.receptacle_type.items() if (t, kind) in facts.can_contain}
            relevant |= self.drop_spots
        # Goal objects may later sit in any goal receptacle, so those are relevant too (already in `parents`).
        self.relevant = sorted(r for r in relevant if r in facts.receptacle_location)
        self.at_location: dict[str, list[str]] = {}
        for r in self.relevant:
            self.at_location.setdefault(facts.receptacle_location[r], []).append(r)

    def start(self) -> tuple:
        f = self.facts
        where = f.receptacle_of()
        positions = tuple(where.get(o, "") for o in self.targets)  # "" = held (or nowhere)
        opened = frozenset(r for r in f.having("opened") if r in self.relevant)
        props = (
            frozenset(o for o in f.having(self.prop_predicate) if o in self.targets)
            if self.prop_predicate
            else frozenset()
        )
        toggled = frozenset(lamp for lamp in f.having("istoggled") if lamp in self.lamps)
        return (f.agent_location, f.held, positions, opened, props, toggled)

    def is_goal(self, state: tuple) -> bool:
        location, held, positions, _opened, props, toggled = state
        g = self.goal
        if g.task_type == "look_at_obj_in_light":
            lit_here = any(
                self.facts.receptacle_location.get(r) == location for lamp, r in self.lamps.items() if lamp in toggled
            )
            return held in self.targets and lit_here
        return self._best_count(positions, props) >= g.required_count

    def _best_count(self, positions: tuple, props: frozenset) -> int:
        counts: dict[str, int] = {}
        for o, r in zip(self.targets, positions):
            if r in self.parents and (self.prop_predicate is None or o in props):
                counts[r] = counts.get(r, 0) + 1
        return max(counts.values(), default=0)

    def heuristic(self, state: tuple) -> int:
        _location, held, positions, _opened, props, toggled = state
        if self.goal.task_type == "look_at_obj_in_light":
            return (0 if held in self.targets else 1) + (0 if toggled else 1)
        remaining = max(0, self.goal.required_count - self._best_count(positions, props))
        holding_target = 1 if remaining and held in self.targets else 0
        return remaining + remaining - holding_target  # a put per missing object, a take per one not in hand

    def _accessible(self, r: str, opened: frozenset) -> bool:
        return r not in self.facts.openable or r in opened

    def successors(self, state: tuple):
        location, held, positions, opened, props, toggled = state
        f, names = self.facts, self.targets
        for loc in sorted(self.at_location):
            if loc != location:
                yield ("go to", self.at_location[loc][0]), (loc, held, positions, opened, props, toggled)
        here = self.at_location.get(location, [])
        for r in here:
            if r in f.openable and r not in opened:
                yield ("open", r), (location, held, positions, opened | {r}, props, toggled)
        if held is None:
            for i, (o, r) in enumerate(zip(names, positions)):
                if r in here and self._accessible(r, opened) and o in f.abilities["pickupable"]:
                    moved = positions[:i] + ("",) + positions[i + 1 :]
                    yield ("take", o, r), (location, o, moved, opened, props, toggled)
        else:
            kind = f.object_type.get(held, "")
            if held in names:
                i = names.index(held)
                spots = [r for r in here if r in self.parents]
                if self.prop_verb and held in self.prop_able and held not in props:
                    for r in here:
                        if r in self.appliances:
                            yield (
                                (self.prop_verb, held, r),
                                (location, held, positions, opened, props | {held}, toggled),
                            )
            else:
                i, spots = -1, [r for r in here if r in self.drop_spots]
            for r in spots:
                if self._accessible(r, opened) and (f.receptacle_type[r], kind) in f.can_contain:
                    moved = positions if i < 0 else positions[:i] + (r,) + positions[i + 1 :]
                    yield ("move", held, r), (location, None, moved, opened, props, toggled)
        for lamp, r in self.lamps.items():
            if r in here:
                yield ("use", lamp), (location, held, positions, opened, props, toggled | {lamp})

    def run(self) -> list[tuple] | None:
        start = self.start()
        counter = itertools.count()
        frontier = [(self.heuristic(start), 0, next(counter), start)]
        best = {start: 0}
        parent: dict[tuple, tuple[tuple, tuple]] = {}
        expansions = 0
        while frontier:
            _, cost, _, state = heapq.heappop(frontier)
            if cost > best[state]:
                continue
            if self.is_goal(state):
                actions = []
                while state in parent:
                    state, action = parent[state]
                    actions.append(action)
                return actions[::-1]
            expansions += 1
            if expansions > self.max_expansions:
                return None
            for action, child in self.successors(state):
                if cost + 1 < best.get(child, math.inf):
                    best[child] = cost + 1
                    parent[child] = (state, action)
                    heapq.heappush(frontier, (cost + 1 + self.heuristic(child), cost + 1, next(counter), child))
        return None


def shortest_plan(
    facts: GameFacts, goal: Goal, names: dict[str, str], max_expansions: int = 200_000
) -> list[str] | None:
    """The full-knowledge expert: a shortest command list from the state in `facts` to the goal, as admissible
    command text (`names` maps PDDL ids to the game's names, e.g. "apple 1"); `[]` when the goal holds; None when
    it cannot be reached (or the search passes `max_expansions` states). Milliseconds on generated games."""
    search = _Search(facts, goal, max_expansions)
    actions = search.run()
    if actions is None:
        return None
    commands = []
    for verb, *args in actions:
        if verb == "go to":
            commands.append(f"go to {names[args[0]]}")
        elif verb == "open":
            commands.append(f"open {names[args[0]]}")
        elif verb == "take":
            commands.append(f"take {names[args[0]]} from {names[args[1]]}")
        elif verb == "move":
            commands.append(f"move {names[args[0]]} to {names[args[1]]}")
        elif verb == "use":
            commands.append(f"use {names[args[0]]}")
        else:  # heat / cool / clean
            commands.append(f"{verb} {names[args[0]]} with {names[args[1]]}")
    return commands


def entity_names(pddl_env: Any) -> dict[str, str]:
    """PDDL id -> the name the game shows (`AlfredDemangler`'s "apple 1"), for a loaded wrapped `PddlEnv`."""
    return {key: info.name.strip() for key, info in pddl_env.unwrapped._entity_infos.items()}


# ---- generation ----------------------------------------------------------------------------------------------------


def check_generation_args(seed: Any, task_type: Any, floor_plans: Any, num_distractor_types: Any) -> None:
    """ValueError naming the bad argument (the same checks guard task rows and `generate_game`)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"`seed` must be an integer >= 0, got {seed!r}")
    if task_type is not None and task_type not in TASK_TYPES:
        raise ValueError(f"`task_type` must be one of {', '.join(TASK_TYPES)} (or None), got {task_type!r}")
    if floor_plans not in FLOOR_PLAN_SETS:
        raise ValueError(f"`floor_plans` must be 'train' or 'unseen', got {floor_plans!r}")
    if (
        isinstance(num_distractor_types, bool)
        or not isinstance(num_distractor_types, numbers.Integral)
        or not 0 <= num_distractor_types <= MAX_DISTRACTOR_TYPES
    ):
        raise ValueError(
            f"`num_distractor_types` must be an integer in [0, {MAX_DISTRACTOR_TYPES}], got {num_distractor_types!r}"
        )


def generated_games_root() -> Path:
    """The cache folder of generated games (`cache_dir("alfworld", "games")`)."""
    return cache_dir("alfworld", "games")


def game_folder(seed: int, task_type: str, floor_plans: str, num_distractor_types: int) -> Path:
    """Where the game of these arguments lives in the cache (it may not exist yet)."""
    settings = f"v{GENERATOR_VERSION}-{floor_plans}-distractors{num_distractor_types}"
    return generated_games_root() / settings / task_type / f"seed-{seed}"


def generate_game(
    seed: int,
    task_type: str | None = None,
    floor_plans: str = "train",
    num_distractor_types: int = DEFAULT_NUM_DISTRACTOR_TYPES,
) -> Path:
    """Generate (once; later calls read the cache) the ALFWorld-style game of `seed` and return its folder.

    The folder holds `game.tw-pddl` and `traj_data.json`, as one trial folder of the official data does. Everything is
    drawn from `random.Random` seeded by the arguments, so a seed gives the same game on every machine.

    Args:
        seed: Any integer >= 0.
        task_type: One of `TASK_TYPES`; None picks one from the seed (`default_task_type`).
        floor_plans: `"train"` (ALFRED's training rooms) or `"unseen"` (its held-out test rooms).
        num_distractor_types: Object types placed besides the task's object (1-3 instances each); more makes the
            rooms richer and the game slower (every step lists the admissible commands).

    Raises:
        ValueError: on a bad argument.
        RuntimeError: if no solvable game was found in a few attempts (not seen in practice).
    """
    task_type = default_task_type(seed) if task_type is None and isinstance(seed, int) else task_type
    check_generation_args(seed, task_type, floor_plans, num_distractor_types)
    seed, num_distractor_types = int(seed), int(num_distractor_types)
    folder = game_folder(seed, task_type, floor_plans, num_distractor_types)
    if (folder / "game.tw-pddl").is_file() and (folder / "traj_data.json").is_file():
        return folder

    import_alfworld()
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    domain, grammar = Path(ALFRED_PDDL_PATH).read_text(), Path(ALFRED_TWL2_PATH).read_text()
    scenes = [load_scene(n) for n in floor_plan_numbers(floor_plans)]
    scenes = [scene for scene in scenes if task_candidates(scene, task_type)]
    for attempt in range(_MAX_ATTEMPTS):
        rng = random.Random(
            f"alfworld/v{GENERATOR_VERSION}/{seed}/{task_type}/{floor_plans}/{num_distractor_types}/{attempt}"
        )
        scene = rng.choice(scenes)
        params = rng.choice(task_candidates(scene, task_type))
        world = _sample_world(rng, scene, params, num_distractor_types)
        if world is None:
            continue
        sentence = goal_sentence(rng, params)
        game = {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", sentence),
            "pddl_problem": _problem_text(world, f"trl_agents_{task_type}_{seed}"),
        }
        plan = solve_and_check(
            game,
            Goal(task_type, params.object_target.lower(), params.parent_target.lower(), params.toggle_target.lower()),
        )
        if not plan:
            continue
        game.update(solvable=True, walkthrough=plan)
        traj_data = {
            "task_type": task_type,
            "task_id": f"trl_agents-{task_type}-{seed}",
            "pddl_params": {
                "object_target": params.object_target,
                "parent_target": params.parent_target,
                "toggle_target": params.toggle_target,
                "mrecep_target": "",
                "object_sliced": False,
            },
            "scene": {"floor_plan": f"FloorPlan{scene.number}", "scene_num": scene.number, "random_seed": seed},
            "turk_annotations": {"anns": [{"task_desc": sentence, "high_descs": [], "assignment_id": "generated"}]},
            "trl_agents": {
                "generator_version": GENERATOR_VERSION,
                "seed": seed,
                "floor_plans": floor_plans,
                "num_distractor_types": num_distractor_types,
                "attempt": attempt,
                "note": "ALFWorld-style game: object placement sampled, not from THOR physics; not the benchmark split",
            },
        }
        # Several workers may generate the same game at once (concurrent: each writes a private temporary file).
        # A cache: a game lost to a power cut is generated again, so no fsync (our choice: generation stays fast).
        atomic_write(folder / "traj_data.json", json.dumps(traj_data, indent=1), fsync=False)
        # written last: its presence marks completion
        atomic_write(folder / "game.tw-pddl", json.dumps(game), fsync=False)
        return folder
    raise RuntimeError(
        f"No solvable ALFWorld-style game found for seed={seed}, task_type={task_type!r}, floor_plans={floor_plans!r} "
        f"in {_MAX_ATTEMPTS} attempts; try another seed."
    )
