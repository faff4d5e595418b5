"""ALFWorld (text): household tasks in the ALFRED rooms, played through TextWorld's PDDL engine as ALFWorld does.

Two kinds of tasks, one environment:

- `{"seed": s, "task_type": ...}` plays an **ALFWorld-style game generated offline** from the data in the `alfworld`
  wheel (`alfworld_gen.generate_game`: THOR floor plans, sampled object placement, ALFRED's goals and sentences; not
  the benchmark split). Each game is generated once and cached under `cache_dir("alfworld", "games")`.
- `{"game_file": path}` plays a **real ALFWorld game** (`game.tw-pddl` with its `traj_data.json` beside it), e.g.
  from `alfworld-download`; `ALFWorld.task_split(split, source="official")` lists them.

Both load the game file into TextWorld's `PddlEnv` with ALFWorld's `AlfredDemangler`, as the official
`AlfredTWEnv` does, so observations, commands and admissible actions are ALFWorld's own. On top of that: actions are
matched to the admissible commands (case and spacing ignored), an exact full-knowledge expert gives
`optimal_plan()` / `solver_value()`, `verify()` reports the task's success condition as VICT atoms with witness
steps, and `privileged_context()` gives a teacher the object positions and the expert plan.

Example:
    >>> import os, tempfile
    >>> os.environ["TRL_AGENTS_CACHE"] = tempfile.mkdtemp()
    >>> env = ALFWorld()
    >>> observation = env.reset({"seed": 0, "task_type": "pick_heat_then_place_in_recep"})
    >>> env.task_description()
    'Your task is to: heat some tomato and put it in sinkbasin.'
    >>> plan = env.optimal_plan()
    >>> plan[:2]
    ['go to countertop 1', 'take tomato 1 from countertop 1']
    >>> for action in plan:
    ...     observation, reward, done, info = env.step(f"<action>{action}</action>")
    >>> observation.split("\\n")[0], reward, done, info["success"]
    ('You move the tomato 1 to the sinkbasin 1.', 1.0, True, True)
    >>> [(atom.name, atom.status, atom.witness_step) for atom in env.verify()]
    [('holding(tomato)', 'sat', 1), ('heated(tomato)', 'sat', 3), ('in(tomato, sinkbasin)', 'sat', 5)]
    >>> del os.environ["TRL_AGENTS_CACHE"]
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from . import alfworld_gen as gen
from .base import INFO_SUCCESS, INFO_VALID, AgentEnv, VerifierAtom
from .parsing import extract_answer
from .registry import register_env
from .replay import replay_snapshots

State = frozenset  # the dynamic facts of one state, as `GameFacts.dynamic`

# Property atoms of the three state-change tasks: (fact, atom verb).
_PROPERTY_ATOM = {
    "pick_clean_then_place_in_recep": ("isclean", "cleaned"),
    "pick_heat_then_place_in_recep": ("ishot", "heated"),
    "pick_cool_then_place_in_recep": ("iscool", "cooled"),
}
# The official data's split folders (`$ALFWORLD_DATA/json_2.1.1/<folder>`) behind our split names.
OFFICIAL_SPLIT_FOLDERS = {"train": "train", "eval": "valid_seen", "unseen": "valid_unseen"}


@lru_cache(maxsize=64)
def _read_game(game_file: str, modified: tuple[float, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A game file's JSON and its `traj_data.json` (cached per path and both files' modification times)."""
    game = json.loads(Path(game_file).read_text())
    traj_data = json.loads((Path(game_file).parent / "traj_data.json").read_text())
    return game, traj_data


def _normalize(command: str) -> str:
    # "Go to  CounterTop 1." and "go to countertop 1" are the same command.
    return " ".join(command.lower().replace("\n", " ").split()).rstrip(".").strip()


def _held(state: State) -> str | None:
    return next((fact[2] for fact in state if fact[0] == "holds"), None)


def _receptacle(state: State, obj: str) -> str | None:
    return next((fact[2] for fact in state if fact[0] == "inreceptacle" and fact[1] == obj), None)


def _location(state: State) -> str | None:
    return next((fact[2] for fact in state if fact[0] == "atlocation"), None)


def official_data_root(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding `json_2.1.1` of the official data: `data_dir`, else `$ALFWORLD_DATA`, else alfworld's
    default `~/.cache/alfworld`."""
    if data_dir is not None:
        return Path(data_dir)
    return Path(os.environ.get("ALFWORLD_DATA") or Path(os.path.expanduser("~"), ".cache", "alfworld"))


def official_games(folder: Path) -> list[tuple[Path, str]]:
    """(game file, task type) of every playable game under `folder`, in sorted order, with `AlfredTWEnv`'s filter:
    a `traj_data.json` of one of the six task types next to a `game.tw-pddl` marked `"solvable": true`; folders
    with movable receptacles or sliced objects are skipped (ALFWorld does not support them)."""
    found = []
    for root, _dirs, files in sorted(os.walk(folder)):
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in root or "Sliced" in root:
            continue
        task_type = json.loads(Path(root, "traj_data.json").read_text()).get("task_type")
        if task_type not in gen.TASK_TYPES:
            continue
        if not json.loads(Path(root, "game.tw-pddl").read_text()).get("solvable"):
            continue
        found.append((Path(root, "game.tw-pddl"), task_type))
    return found


@register_env
@replay_snapshots
class ALFWorld(AgentEnv):
    """ALFWorld's text games: generated ALFWorld-style games (`{"seed": s}`) or official ones (`{"game_file": p}`).

    A seeded task row may set `task_type` (one of the six; default: fixed by the seed), `floor_plans` (`"train"`,
    default, or `"unseen"` for ALFRED's held-out rooms) and `num_distractor_types` (overrides the constructor's).
    Other keys (`env`, `task_id`, `prompt`, ...) are ignored.

    Actions: the answer region of the reply (`extract_answer`: the last `<action>...</action>` or ``` block, else the
    text without `<think>` blocks) must be one of the admissible commands, compared case- and space-insensitively
    (a final period is ignored). Anything else is invalid: ALFWorld itself would answer "Nothing happens.", and the
    observation keeps that text, says the command is not admissible, and the state does not change; unlike
    ALFWorld, `info["valid"]` is False (our choice, so the trainer's invalid-action penalty applies, as verl-agent's
    does; docs/concepts/verl_agent_conventions.md#invalid-actions-and-their-penalty).

    Args:
        show_admissible_actions: Append the admissible actions to every observation (without "help"), as
            verl-agent's ALFWorld prompt lists them (our choice: the trainer's prompt has no slot for them).
        num_distractor_types: Object types a generated game places besides the task's object (1-3 instances each).
            More is closer to ALFWorld's cluttered rooms and slower (each step derives every admissible command).
        max_solver_expansions: State budget of the expert's search per call.
    """

    name = "alfworld"
    task_keys = ("seed", "game_file")
    requires = ("alfworld", "textworld", "fast_downward")
    thread_safe = False  # TextWorld parses PDDL and text grammars with module-level parsers, in loads, resets and steps
    instructions = (
        "You are an agent in a household (ALFWorld, the text version of the ALFRED benchmark). The room has "
        "receptacles (countertops, cabinets, drawers, a fridge, a microwave, a sink basin, ...) with objects in and on "
        "them, and you must complete the task you are given.\n"
        "Commands: go to <receptacle>, open <receptacle>, close <receptacle>, take <object> from <receptacle>, "
        "move <object> to <receptacle>, heat <object> with <microwave>, cool <object> with <fridge>, "
        "clean <object> with <sinkbasin>, use <lamp>, examine <something>, look, inventory.\n"
        "You carry at most one object. Open a closed receptacle before taking from or putting into it. To look at "
        "an object under a lamp, hold the object and turn on the lamp where it stands.\n"
        "Each turn reply with exactly one admissible action (they are listed after each observation), for example "
        "<action>go to countertop 1</action>. You may reason first inside <think>...</think>."
    )

    # Seed ranges of the generated splits: train [0, 1e6), eval [1e6, 2e6), unseen [2e6, 3e6) (ALFRED test rooms).
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000, "unseen": 2_000_000}
    # The official split sizes (3553 train, 140 valid_seen, 134 valid_unseen games).
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 3553, "eval": 140, "unseen": 134}

    def __init__(
        self,
        show_admissible_actions: bool = True,
        num_distractor_types: int = gen.DEFAULT_NUM_DISTRACTOR_TYPES,
        max_solver_expansions: int = 200_000,
    ):
        if show_admissible_actions not in (True, False):
            raise ValueError(f"`show_admissible_actions` must be a bool, got {show_admissible_actions!r}")
        gen.check_generation_args(0, None, "train", num_distractor_types)
        if (
            isinstance(max_solver_expansions, bool)
            or not isinstance(max_solver_expansions, numbers.Integral)
            or max_solver_expansions < 1
        ):
            raise ValueError(f"`max_solver_expansions` must be an integer >= 1, got {max_solver_expansions!r}")
        gen.import_alfworld()  # fail now, with the install command, if the packages are missing
        self.show_admissible_actions = show_admissible_actions
        if not show_admissible_actions:  # the system prompt must not promise a list the observations do not have
            self.instructions = type(self).instructions.replace(
                "(they are listed after each observation)", "(use the command forms above)"
            )
        self.num_distractor_types = int(num_distractor_types)
        self.max_solver_expansions = int(max_solver_expansions)
        self._game: Any = None  # the wrapped PddlEnv, created at the first reset and reused
        self._loaded: tuple[str, float] | None = None  # (game file, modification time) of the loaded game
        self._facts: gen.GameFacts | None = None
        self._done = False

    # ---- episode ---------------------------------------------------------------------------------------------------

    def _resolve(self, task: dict[str, Any]) -> Path:
        """The game file of a task row (generating the game if needed); ValueError naming the field on bad rows."""
        if not isinstance(task, dict):
            # a ValueError like every other bad task row (the trainer reports those as bad input)
            raise ValueError(f"An ALFWorld task must be a dict (a dataset row), got {type(task).__name__}")  # noqa: TRY004
        game_file = task.get("game_file")
        if game_file is not None:
            if not isinstance(game_file, (str, os.PathLike)):
                raise ValueError(f"`game_file` must be a path to a game.tw-pddl file, got {game_file!r}")
            path = Path(game_file)
            if not path.is_file() or not path.name.endswith(".tw-pddl"):
                raise ValueError(f"`game_file` must be an existing .tw-pddl file, got {str(path)!r}")
            if not (path.parent / "traj_data.json").is_file():
                raise ValueError(
                    f"`game_file` {str(path)!r} has no traj_data.json beside it; official ALFWorld game folders "
                    "hold both (run `alfworld-download`, or point at a generated game folder)"
                )
            return path
        if task.get("seed") is None:
            raise ValueError(
                "An ALFWorld task needs 'seed' (a generated ALFWorld-style game) or 'game_file' (an official game), "
                f"got keys {sorted(task)}"
            )
        seed, task_type = task["seed"], task.get("task_type")
        floor_plans = task.get("floor_plans") or "train"
        distractors = task.get("num_distractor_types")
        distractors = self.num_distractor_types if distractors is None else distractors
        if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and task_type is None and seed >= 0:
            task_type = gen.default_task_type(int(seed))
        gen.check_generation_args(seed, task_type, floor_plans, distractors)
        folder = gen.generate_game(int(seed), task_type, floor_plans, int(distractors))
        return folder / "game.tw-pddl"

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's game (generating it on first use) and return ALFWorld's intro: the room and the task."""
        path = self._resolve(task)
        modified = path.stat().st_mtime
        game_data, traj_data = _read_game(str(path), (modified, (path.parent / "traj_data.json").stat().st_mtime))
        if traj_data.get("task_type") not in gen.TASK_TYPES or "pddl_params" not in traj_data:
            raise ValueError(
                f"{str(path.parent / 'traj_data.json')!r} must name one of the six task types "
                f"({', '.join(gen.TASK_TYPES)}) and hold `pddl_params`"
            )
        self._goal = gen.Goal.from_traj_data(traj_data)
        if self._game is None:
            self._game = gen.new_pddl_env()
        if self._loaded != (str(path), modified):  # loading translates the PDDL; resetting the same game does not
            self._loaded = None
            gen.load_game(self._game, game_data)
            self._loaded = (str(path), modified)
            self._names = gen.entity_names(self._game)
        state = gen.reset_game(self._game)
        self._facts = gen.GameFacts.from_propositions(state["_facts"])
        self._history: list[State] = [self._facts.dynamic]  # the dynamic facts after reset and after every step
        self._actions: list[str | None] = []  # the command applied at each step (None: invalid)
        self._admissible = list(state["admissible_commands"])
        self._feedback = state.feedback.strip()
        intro = self._feedback
        start = intro.rfind("Your task is to:")
        self._task_text = intro[start:].strip() if start >= 0 else ""
        self._won = bool(state["won"])
        self._done = self._won
        return self._render(self._feedback)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._facts is None:
            raise RuntimeError("Call reset() before step()")
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        command = extract_answer(action_text)
        match = {_normalize(c): c for c in self._admissible}.get(_normalize(command))
        if match is None:
            self._history.append(self._history[-1])
            self._actions.append(None)
            shown = command if len(command) <= 80 else command[:77] + "..."
            why = f"{shown!r} is not an admissible action here" if command else "no action found in the reply"
            feedback = f"Nothing happens. ({why}; reply with one of the admissible actions.)"
            return self._render(feedback), 0.0, False, self._info(valid=False, command=None)
        state, _score, _done = self._game.step(match)
        self._facts = self._facts.with_dynamic(state["_facts"])
        self._history.append(self._facts.dynamic)
        self._actions.append(match)
        self._admissible = list(state["admissible_commands"])
        self._feedback = state.feedback.strip()
        self._won = bool(state["won"])
        self._done = self._won
        reward = 1.0 if self._won else 0.0
        return self._render(self._feedback), reward, self._done, self._info(valid=True, command=match)

    def _render(self, feedback: str) -> str:
        if not self.show_admissible_actions:
            return feedback
        shown = [c for c in self._admissible if c != "help"]  # verl-agent leaves "help" out of its list too
        return f"{feedback}\n\nAdmissible actions: {', '.join(shown)}"

    def _info(self, valid: bool, command: str | None) -> dict[str, Any]:
        return {
            INFO_VALID: valid,
            INFO_SUCCESS: self._won,
            "won": self._won,
            "command": command,
            "task_type": self._goal.task_type,
        }

    def task_description(self) -> str:
        """The task line of the intro, e.g. "Your task is to: put a hot apple in countertop."."""
        return self._task_text if self._facts is not None else ""

    def admissible_actions(self) -> list[str] | None:
        """The game's admissible commands in the current state (sorted, as ALFWorld lists them)."""
        return list(self._admissible) if self._facts is not None else None

    def close(self) -> None:
        # fast-downward's library copy stays loaded until the process exits (unloading it crashes at exit).
        self._game, self._loaded = None, None

    # ---- capabilities ------------------------------------------------------------------------------------------

    def state_key(self) -> str:
        """The current observation as the game printed it (GiGPO's ALFWorld anchor: verl-agent's `anchor` is the raw
        text observation). It is the feedback of the last *applied* command: an invalid action leaves it unchanged,
        so all "Nothing happens." steps do not alias into one anchor state (our choice)."""
        self._require_reset()
        return self._feedback

    def optimal_plan(self) -> list[str] | None:
        """A shortest command list from the current state to success (the full-knowledge expert, `shortest_plan`:
        an exact search over the task-relevant state), `[]` when solved, None when unreachable. Milliseconds."""
        self._require_reset()
        if self._won:
            return []
        return gen.shortest_plan(self._facts, self._goal, self._names, self.max_solver_expansions)

    def solver_value(self) -> float:
        """Commands an optimal agent still needs from here (`len(optimal_plan())`; `math.inf` if unreachable)."""
        plan = self.optimal_plan()
        return math.inf if plan is None else len(plan)

    def privileged_context(self) -> str:
        """What a teacher may see and the agent may not: where the task's objects are, the goal receptacles, the
        appliance or lamp to use, and the expert plan from the current state."""
        self._require_reset()
        facts, goal, names = self._facts, self._goal, self._names
        where, opened = facts.receptacle_of(), facts.having("opened")

        def place(receptacle: str) -> str:
            closed = receptacle in facts.openable and receptacle not in opened
            return names[receptacle] + (" (closed)" if closed else "")

        lines = ["Privileged information (the agent does not see this).", f"Task type: {goal.task_type}."]
        targets = facts.objects_of_type(goal.object_type)
        spots = [
            f"{names[o]} is held by you" if o == facts.held else f"{names[o]} is in/on {place(where[o])}"
            for o in targets
            if o == facts.held or o in where
        ]
        lines.append(f"Every {goal.object_type}: " + ("; ".join(spots) if spots else "none in this room") + ".")
        if goal.parent_type:
            parents = facts.receptacles_of_type(goal.parent_type)
            lines.append(f"Goal receptacles ({goal.parent_type}): {', '.join(place(r) for r in parents)}.")
        if goal.task_type in _PROPERTY_ATOM:
            appliance = gen.TASK_PROPERTY[goal.task_type][3]
            found = [names[r] for r in facts.receptacles_of_type(appliance)]
            lines.append(f"Use: {', '.join(found) or 'none'}.")
        if goal.toggle_type:
            lamps = [f"{names[x]} on {names[where[x]]}" for x in facts.objects_of_type(goal.toggle_type) if x in where]
            lines.append(f"Lamps ({goal.toggle_type}): {', '.join(lamps) or 'none'}.")
        plan = self.optimal_plan()
        if plan is None:
            lines.append("Expert plan: the goal cannot be reached from here.")
        else:
            lines.append(f"Expert plan from here ({len(plan)} actions): " + ("; ".join(plan) if plan else "done."))
        return "\n".join(lines)

    def verify(self) -> list[VerifierAtom]:
        """The task's success condition as VICT atoms, checked on this episode's states.

        Atoms (object and receptacle *types*, as in the task sentence) and dependency edges:

        - pick_and_place_simple: `holding(O)` -> `in(O, R)`;
        - clean / heat / cool: `holding(O)` -> `cleaned|heated|cooled(O)` -> `in(O, R)` (the object in R must have
          the property);
        - pick_two_obj_and_place: `holding(O#1)` -> `in(O#1, R)`; `holding(O#2)` -> `in(O#2, R)`, and `in(O#2, R)`
          also depends on `in(O#1, R)` (both in the same receptacle; #1 is the one placed first);
        - look_at_obj_in_light: `holding(O)`, `toggled(L)`, and `in_light(O, L)` (holding it where a lamp that is
          on stands) depending on both.

        The last atom of each chain is checked in the current state; an earlier one in the state just before the
        step that made the next one true (a put needs the object in hand). `witness_step` is the 0-based index of
        the step (invalid ones count) whose action made the atom true there, None if it held from the start or is
        unsat. Among several objects of the type, the one that got furthest is reported. `unknown`: the room has no
        object of the task's type.
        """
        self._require_reset()
        goal, facts, history = self._goal, self._facts, self._history
        targets = facts.objects_of_type(goal.object_type)
        obj, parent = goal.object_type, goal.parent_type
        if goal.task_type == "look_at_obj_in_light":
            atoms = self._verify_look(targets)
            return atoms if targets else [VerifierAtom(a.name, "unknown", None, a.depends_on) for a in atoms]
        if not targets:  # no object of the task's type in the room: nothing to check
            holding = f"holding({obj})"
            return [VerifierAtom(holding, "unknown"), VerifierAtom(f"in({obj}, {parent})", "unknown", None, [holding])]
        parents = set(facts.receptacles_of_type(parent))
        prop = _PROPERTY_ATOM.get(goal.task_type)

        def chain_for(o: str, destination: Callable[[State], bool]) -> list[Callable[[State], bool]]:
            preds = [lambda s: _held(s) == o]
            if prop:
                preds.append(lambda s: (prop[0], o) in s)
                return [*preds, lambda s: destination(s) and (prop[0], o) in s]
            return [*preds, destination]

        if goal.task_type != "pick_two_obj_and_place":
            results = [self._chain(chain_for(o, lambda s, o=o: _receptacle(s, o) in parents)) for o in targets]
            best = max(
                range(len(targets)),
                key=lambda i: (results[i][-1][0] == "sat", sum(r[0] == "sat" for r in results[i]), -i),
            )
            names = [f"holding({obj})"] + ([f"{prop[1]}({obj})"] if prop else []) + [f"in({obj}, {parent})"]
            return [
                VerifierAtom(n, status, witness, [names[i - 1]] if i else [])
                for i, (n, (status, witness)) in enumerate(zip(names, results[best]))
            ]

        # pick_two: the goal receptacle holding the most objects of the type now; slots by placement order.
        now = history[-1]
        placed: dict[str, list[str]] = {}
        for o in targets:
            r = _receptacle(now, o)
            if r in parents:
                placed.setdefault(r, []).append(o)
        chosen = max(sorted(placed), key=lambda r: len(placed[r]), default=None)

        def in_chosen(o: str) -> Callable[[State], bool]:
            return lambda s: chosen is not None and _receptacle(s, o) == chosen

        in_place = placed.get(chosen, [])

        def placed_at(o: str) -> int:
            witness = self._chain(chain_for(o, in_chosen(o)))[-1][1]
            return -1 if witness is None else witness

        slots = sorted(in_place, key=lambda o: (placed_at(o), o))[:2]
        rest = [o for o in targets if o not in slots]
        rest.sort(key=lambda o: (_held(now) != o, o))  # an object in hand got further than one lying somewhere
        slots += rest[: 2 - len(slots)]
        atoms = []
        for k, o in enumerate(slots, start=1):
            (hold_status, hold_witness), (in_status, in_witness) = self._chain(chain_for(o, in_chosen(o)))
            depends = [f"holding({obj}#{k})"] + ([f"in({obj}#1, {parent})"] if k == 2 else [])
            atoms.append(VerifierAtom(f"holding({obj}#{k})", hold_status, hold_witness))
            atoms.append(VerifierAtom(f"in({obj}#{k}, {parent})", in_status, in_witness, depends))
        if len(slots) < 2:  # a single object of the type in the room: the second placement cannot happen
            atoms += [
                VerifierAtom(f"holding({obj}#2)", "unknown"),
                VerifierAtom(
                    f"in({obj}#2, {parent})", "unknown", None, [f"holding({obj}#2)", f"in({obj}#1, {parent})"]
                ),
            ]
        return atoms

    def _verify_look(self, targets: list[str]) -> list[VerifierAtom]:
        goal, facts = self._goal, self._facts
        where = facts.receptacle_of()
        lamps = [lamp for lamp in facts.objects_of_type(goal.toggle_type) if lamp in where]
        lamp_location = {lamp: facts.receptacle_location.get(where[lamp]) for lamp in lamps}

        def holding(s: State) -> bool:
            return _held(s) in targets

        def toggled(s: State) -> bool:
            return any(("istoggled", lamp) in s for lamp in lamps)

        def in_light(s: State) -> bool:
            here = _location(s)
            return holding(s) and any(("istoggled", lamp) in s and lamp_location[lamp] == here for lamp in lamps)

        o, lamp = goal.object_type, goal.toggle_type
        atoms = []
        for name, pred in (
            (f"holding({o})", holding),
            (f"toggled({lamp})", toggled),
            (f"in_light({o}, {lamp})", in_light),
        ):
            status, witness = self._chain([pred])[0]
            depends = [f"holding({o})", f"toggled({lamp})"] if name.startswith("in_light") else []
            atoms.append(VerifierAtom(name, status, witness, depends))
        return atoms

    def _chain(self, predicates: list[Callable[[State], bool]]) -> list[tuple[str, int | None]]:
        """(status, witness step) of each predicate of a dependency chain; see `verify` for the rule."""
        history = self._history
        reference = len(history) - 1  # check the last atom in the current state
        results: list[tuple[str, int | None]] = []
        for predicate in reversed(predicates):
            if reference is None:  # the next atom held from the start: nothing to say about this one
                results.append(("unknown", None))
                continue
            if not predicate(history[reference]):
                results.append(("unsat", None))
                continue
            witness = next(
                (i for i in range(reference - 1, -1, -1) if predicate(history[i + 1]) and not predicate(history[i])),
                None,
            )
            results.append(("sat", witness))
            reference = witness  # the earlier atom must hold just before this one's step
        return results[::-1]

    def _require_reset(self) -> None:
        if self._facts is None:
            raise RuntimeError("Call reset() first")

    # ---- splits --------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(
        cls,
        split: str,
        count: int | None = None,
        source: str = "generated",
        data_dir: str | os.PathLike | None = None,
        **env_kwargs: Any,
    ) -> list[dict[str, Any]]:
        """Task rows of `split` ("train", "eval" or "unseen"), at most `count` (default: ALFWorld's split sizes).

        `source="generated"` (default): seeded ALFWorld-style games, seeds `SPLIT_SEED_START[split] + i`, task types
        cycling through the six so every split is balanced; "unseen" rows draw from ALFRED's held-out floor plans
        (`floor_plans="unseen"`). A `num_distractor_types` among `env_kwargs` travels with the rows. Rows hold seeds
        only; games are generated at their first reset.

        `source="official"`: the official games under `<data_dir or $ALFWORLD_DATA>/json_2.1.1/<train | valid_seen |
        valid_unseen>` (eval = valid_seen, unseen = valid_unseen), filtered as ALFWorld's loader does; rows are
        `{"game_file": ...}`.
        """
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown ALFWorld split {split!r}; use 'train', 'eval' or 'unseen'")
        if count is None:
            count = cls.SPLIT_DEFAULT_COUNT[split]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 0 <= count <= 1_000_000:
            raise ValueError(f"`count` must be an integer in [0, 1000000], got {count!r}")
        if source == "official":
            folder = official_data_root(data_dir) / "json_2.1.1" / OFFICIAL_SPLIT_FOLDERS[split]
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"No official ALFWorld games at {str(folder)!r}. Download them with `alfworld-download` (needs "
                    "network access to github.com), then set ALFWORLD_DATA or pass data_dir=<the folder holding "
                    "json_2.1.1>; or use source='generated' for offline ALFWorld-style games."
                )
            rows = []
            for game_file, task_type in official_games(folder)[:count]:
                relative = game_file.parent.relative_to(folder).as_posix()
                rows.append(
                    {
                        "env": cls.name,
                        "task_id": f"alfworld-{split}-{relative}",
                        "game_file": str(game_file),
                        "task_type": task_type,
                    }
                )
            return rows
        if source != "generated":
            raise ValueError(f"`source` must be 'generated' or 'official', got {source!r}")
        settings = {}
        if env_kwargs.get("num_distractor_types") is not None:
            gen.check_generation_args(0, None, "train", env_kwargs["num_distractor_types"])
            settings["num_distractor_types"] = int(env_kwargs["num_distractor_types"])
        if split == "unseen":
            settings["floor_plans"] = "unseen"
        start = cls.SPLIT_SEED_START[split]
        return [
            {
                "env": cls.name,
                "task_id": f"alfworld-{split}-{start + i}",
                "seed": start + i,
                "task_type": gen.TASK_TYPES[i % len(gen.TASK_TYPES)],
                **settings,
            }
            for i in range(count)
        ]
