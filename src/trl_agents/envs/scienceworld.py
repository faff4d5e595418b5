"""ScienceWorld: 30 elementary-science tasks (boil water, grow a plant, build a circuit...) in a text simulator.

A thin adapter over the `scienceworld` package (Apache-2.0), whose simulator is a Scala program running in a Java
virtual machine that ships in the wheel. Each env instance starts one JVM on its first reset (0.4-1.8 s) and keeps
it for every later task (loading another task takes 0.02-0.3 s); `close()` shuts it down. The JVM runs with
`DETERMINISTIC_JVM_OPTIONS`: without them the simulator's object order (in descriptions, questions and even which
electrical part updates first) depends on what the JVM did before, so the same task could play differently after
other tasks in the same JVM.

Fast path (envs/scienceworld/README.md, "Measured"): the package's `step()` enumerates every valid action after each
command to fill `info["valid"]` (~100-200 ms); this adapter sends commands to the simulator directly (a few ms) and
enumerates the valid actions only when `admissible_actions()` is called.

Example:
    >>> from trl_agents.envs.scienceworld import ScienceWorld
    >>> env = ScienceWorld()
    >>> env.reset({"task_name": "find-non-living-thing", "variation": 0}).splitlines()[0].strip()
    'This room is called the hallway. In it, you see:'
    >>> env.task_description()[:43]
    'Your task is to find a(n) non-living thing.'
    >>> observation, reward, done, info = env.step("<action>open door to kitchen</action>")
    >>> observation.splitlines()[0], round(reward, 3), info["score"]
    ('The door is now open.', 0.083, 8)
    >>> env.close()
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import numbers
import re
import shutil
import subprocess
import threading
from functools import lru_cache
from typing import Any, ClassVar

from ..fileio import atomic_write
from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .cache import cache_dir
from .parsing import extract_answer
from .registry import register_env
from .replay import replay_snapshots

_INSTALL_HINT = 'ScienceWorld needs the `scienceworld` package: pip install "trl-agents[envs]"'
JAVA_HINT = (
    "ScienceWorld runs its simulator in a Java virtual machine and needs Java >= 11 on PATH "
    "(for example `apt-get install openjdk-17-jre-headless`)"
)
# ScienceWorld's simplifications (`get_possible_simplifications()`), and "easy" = all of them.
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)
# Our split names -> the package's variation splits ("unseen" is ScienceWorld's test split: held-out variations).
SPLITS = {"train": "train", "eval": "dev", "unseen": "test"}

# The simulator keeps objects in hash sets keyed by Java identity hashes, which a JVM hands out in sequence: the order
# of objects (in descriptions, in "which action?" questions, in which electrical part updates first) then depends on
# everything the JVM did before, so the same task played twice in one JVM can differ. With every identity hash equal
# (a HotSpot option), the sets iterate in insertion order and a task plays the same however many came before it.
DETERMINISTIC_JVM_OPTIONS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
_launch_lock = threading.Lock()
logger = logging.getLogger(__name__)

_NO_MATCH = ("No known action matches that input.", "Unknown action.")
_AMBIGUOUS = "Ambiguous request"
_OPTION_LINE = re.compile(r"^(\d+):\s*(.*)$")


def _import_scienceworld():
    try:
        import scienceworld
        from scienceworld import ScienceWorldEnv
        from scienceworld.constants import ID2TASK
        from scienceworld.utils import infer_task
    except ImportError as err:
        raise ImportError(_INSTALL_HINT) from err
    return scienceworld, ScienceWorldEnv, ID2TASK, infer_task


@lru_cache(maxsize=1)
def java_major_version() -> int | None:
    """Major version of the `java` on PATH (8 for "1.8.0_292", 17 for "17.0.15"), None when there is none."""
    java = shutil.which("java")
    if java is None:
        return None
    try:
        result = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@lru_cache(maxsize=8)
def jvm_accepts(options: tuple[str, ...]) -> bool:
    """Whether the `java` on PATH starts with these options (`java <options> -version` succeeds)."""
    java = shutil.which("java")
    if java is None:
        return False
    try:
        return (
            subprocess.run([java, *options, "-version"], check=False, capture_output=True, timeout=60).returncode == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _check_java() -> None:
    version = java_major_version()
    if version is None:
        raise RuntimeError(f"{JAVA_HINT}; no working `java` was found.")
    if version < 11:
        raise RuntimeError(f"{JAVA_HINT}; found Java {version}.")


def _launch_simulator(java_options: tuple[str, ...]):
    """A `ScienceWorldEnv` whose JVM runs with `java_options`. The package has no argument for JVM options, so its
    module's `launch_gateway` (py4j's, used only by that constructor) gets them for the duration of the call."""
    import scienceworld.scienceworld as package_module

    launch = package_module.launch_gateway
    with _launch_lock:
        package_module.launch_gateway = functools.partial(launch, javaopts=list(java_options))
        try:
            return package_module.ScienceWorldEnv("")
        finally:
            package_module.launch_gateway = launch


def task_names() -> list[str]:
    """The 30 ScienceWorld task names, in the package's order (e.g. `"boil"`, `"find-living-thing"`)."""
    _, _, ID2TASK, _ = _import_scienceworld()
    return list(ID2TASK.values())


def _canonical_task(name: Any) -> str:
    _, _, _, infer_task = _import_scienceworld()
    names = task_names()
    if isinstance(name, str) and infer_task(name) in names:
        return infer_task(name)  # also maps task ids ("1-1") and paper names to the task name
    raise ValueError(f"Unknown ScienceWorld `task_name` {name!r}; choose one of {names}")


def _check_simplifications(value: Any, field: str) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(value)
    if not isinstance(value, str):  # bad input of any kind is a ValueError in trl-agents
        raise ValueError(f"ScienceWorld `{field}` must be a string or a list of names, got {value!r}")  # noqa: TRY004
    parts = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [part for part in parts if part not in SIMPLIFICATIONS]
    if unknown:
        raise ValueError(f"Unknown ScienceWorld `{field}` {unknown}; choose from {list(SIMPLIFICATIONS)}")
    return ",".join(parts)


def variation_splits() -> dict[str, dict[str, list[int]]]:
    """Task name -> {"train" | "dev" | "test": variation indices}, ScienceWorld's own split of every task's
    variations. Asking the simulator needs a JVM and all 30 tasks loaded (~3 s), so the answer is cached in memory
    and under `cache_dir("scienceworld")`, per package version."""
    return json.loads(_variation_splits_json())


@lru_cache(maxsize=1)
def _variation_splits_json() -> str:
    scienceworld, ScienceWorldEnv, _, _ = _import_scienceworld()
    path = cache_dir("scienceworld") / f"variation-splits-{scienceworld.__version__}.json"
    if path.exists():
        return path.read_text()
    _check_java()
    simulator = ScienceWorldEnv("")
    try:
        splits = {}
        for name in task_names():
            simulator.load(name, 0, "")
            splits[name] = {
                "train": simulator.get_variations_train(),
                "dev": simulator.get_variations_dev(),
                "test": simulator.get_variations_test(),
            }
    finally:
        simulator.close()
    text = json.dumps(splits)
    # A cache (asked again when lost, so no fsync) that parallel environment workers may fill at the same time.
    atomic_write(path, text, fsync=False)
    return text


@register_env
@replay_snapshots
class ScienceWorld(AgentEnv):
    """ScienceWorld (Wang et al. 2022) through the `scienceworld` package, with a fast step.

    A task row is `{"task_name": name, "variation": v}`, optionally with `"simplifications"` (overriding the
    constructor's). `name` is one of the 30 tasks (`task_names()`; task ids such as "1-1" work too) and `v` one of
    its variations (`variation_splits()` says which are train/dev/test).

    Commands are ScienceWorld's (`open door to kitchen`, `go to kitchen`, `pick up thermometer`, `focus on
    banana`, `use thermometer on water`, `wait`...). When a command could mean several things the simulator lists
    them, numbered, and the next command must be one of the numbers (ScienceWorld's own protocol; its gold paths use
    it). A command the simulator cannot parse, or anything but a listed number after such a question, gives
    `info["valid"] = False`, reward 0 and an unchanged state (the adapter answers those itself, since the simulator
    counts a turn for an unknown answer to a question).

    Reward (our choice): the score change / 100 (ScienceWorld's score runs 0-100 and falls to -100 when the task is
    failed, e.g. by focusing on the wrong object), so a completed episode returns 1. The episode ends when the task
    is completed (`info["success"]`) or failed.

    Args:
        simplifications: ScienceWorld simplifications for every task: "easy" (all of them) or a comma-separated list
            of `teleportAction`, `selfWateringFlowerPots`, `openContainers`, `openDoors`, `noElectricalAction`.
            Default: none.
        observation: `"full"` (default, our choice): the simulator's response, then what the agent sees around
            (ScienceWorld's free "look around", unless the response is that) and the inventory, so each observation
            shows the current state; `"feedback"`: the response only, as ScienceWorld's `step` returns it.
    """

    name = "scienceworld"
    task_keys = ("task_name",)
    requires = ("scienceworld", "py4j")
    instructions = (
        "You are an agent in ScienceWorld, a text simulation of a house and its surroundings, and must complete a "
        "science task. Useful commands: look around, look at <thing>, go to <place>, open <thing>, close <thing>, "
        "pick up <thing>, put down <thing>, move <thing> to <container>, pour <thing> into <container>, "
        "activate <device>, deactivate <device>, use <thing> on <thing>, connect <thing> to <thing>, "
        "mix <container>, focus on <thing> (only on the object the task names: focusing on a wrong one fails the "
        "task), wait, wait1, inventory.\n"
        "When the game asks which action you meant, reply with its number.\n"
        "Reply with exactly one command."
    )

    # Expert plans by (task, variation, simplifications): ScienceWorld's gold path, kept once computed.
    _GOLD_PLANS: ClassVar[dict[tuple[str, int, str], tuple[str, ...] | None]] = {}

    def __init__(self, simplifications: str | list[str] = "", observation: str = "full"):
        _import_scienceworld()
        _check_java()
        self.simplifications = _check_simplifications(simplifications, "simplifications")
        if observation not in ("full", "feedback"):
            raise ValueError(f"`observation` must be 'full' or 'feedback', got {observation!r}")
        self.observation = observation
        self._simulator = None  # the package's ScienceWorldEnv, started on the first reset
        self._fresh_jvm_per_task = False  # True when the JVM lacks DETERMINISTIC_JVM_OPTIONS (see _start_simulator)
        self._task: tuple[str, int, str] | None = None
        self._score = 0.0
        self._done = False
        self._success = False
        self._options: tuple[str, ...] | None = None  # the numbered choices of a pending "which action?" question
        self._history: list[str] = []  # commands the simulator accepted since reset (matched against the gold path)

    # ---- tasks -----------------------------------------------------------------------------------------------------

    def _parse_task(self, task: dict[str, Any]) -> tuple[str, int, str]:
        if task.get("task_name") is None:
            raise ValueError(f"A ScienceWorld task needs a 'task_name' and a 'variation', got keys {sorted(task)}")
        name = _canonical_task(task["task_name"])
        if task.get("variation") is None:
            raise ValueError(f"A ScienceWorld task needs a 'variation' (an integer >= 0), got keys {sorted(task)}")
        variation = task["variation"]
        if isinstance(variation, bool) or not isinstance(variation, numbers.Integral) or variation < 0:
            raise ValueError(f"ScienceWorld task 'variation' must be an integer >= 0, got {variation!r}")
        simplifications = self.simplifications
        if task.get("simplifications") is not None:
            simplifications = _check_simplifications(task["simplifications"], "simplifications")
        return name, int(variation), simplifications

    def _start_simulator(self):
        if self._simulator is None:
            self._fresh_jvm_per_task = not jvm_accepts(DETERMINISTIC_JVM_OPTIONS)
            if self._fresh_jvm_per_task:  # e.g. OpenJ9, which lacks the HotSpot option
                logger.warning(
                    "ScienceWorld: this JVM does not accept %s; it is restarted for every task instead, so that "
                    "tasks stay deterministic (slower resets).",
                    " ".join(DETERMINISTIC_JVM_OPTIONS),
                )
            self._simulator = _launch_simulator(() if self._fresh_jvm_per_task else DETERMINISTIC_JVM_OPTIONS)
        elif self._fresh_jvm_per_task:
            self._simulator.close()
            self._simulator = _launch_simulator(())
        return self._simulator

    def _load(self, task: tuple[str, int, str], gold_path: bool = False) -> str:
        """Load a task in this env's JVM and return the first response ("look around", which takes no time)."""
        name, variation, simplifications = task
        simulator = self._start_simulator()
        most = simulator.get_max_variations(name)
        if variation >= most:
            raise ValueError(f"ScienceWorld task {name!r} has variations 0..{most - 1}, got 'variation' {variation}")
        if "noElectricalAction" in simplifications.split(",") and ("power-component" in name or "conductivity" in name):
            raise ValueError(f"ScienceWorld task {name!r} needs electrical actions: drop 'noElectricalAction'")
        simulator.load(name, variation, simplifications, generateGoldPath=gold_path)
        self._task = task
        self._score, self._done, self._success, self._options = 0.0, False, False, None
        self._history = []
        return simulator.server.step("look around")

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        feedback = self._load(self._parse_task(task))
        return feedback.strip() if self.observation == "feedback" else self._render(feedback, state_only=True)

    def task_description(self) -> str:
        self._require_task()
        return str(self._simulator.server.getTaskDescription()).strip()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        self._require_task()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        command = " ".join(extract_answer(action_text).split()).lower().lstrip("> ").rstrip(".")
        feedback, valid, reward = self._apply(command)
        observation = feedback if self.observation == "feedback" else self._render(feedback)
        info = {
            INFO_VALID: valid,
            INFO_SUCCESS: self._success,
            "action": command or None,
            "score": round(100 * self._score),
            "choices": list(self._options) if self._options else None,
        }
        return observation, reward, self._done, info

    def _apply(self, command: str) -> tuple[str, bool, float]:
        """Send one command (unless it is invalid for sure); return (response, valid, reward)."""
        if self._options is not None and not (command.isdigit() and int(command) < len(self._options)):
            numbered = "\n".join(f"{number}: {option}" for number, option in enumerate(self._options))
            return f"Answer with the number of the action you meant.\n{numbered}", False, 0.0
        if not command:
            return "Invalid action: reply with one command, e.g. look around.", False, 0.0
        server = self._simulator.server
        feedback = str(server.step(command)).strip()
        if feedback.startswith(_NO_MATCH):
            return f"{feedback} (the command was: {command})", False, 0.0
        self._options = None
        if feedback.startswith(_AMBIGUOUS):
            choices = [m.group(2).strip() for m in map(_OPTION_LINE.match, feedback.splitlines()[1:]) if m]
            self._options = tuple(choices) or None
        self._history.append(command)
        score = float(server.getScore())
        reward = score - self._score
        self._score = score
        completed = bool(server.getCompleted())
        self._success = completed and score > 0
        self._done = completed or score < 0
        return feedback, True, float(reward)

    def _render(self, feedback: str, state_only: bool = False) -> str:
        """The "full" observation: the response, then the surroundings (unless the response is them) and inventory."""
        server = self._simulator.server
        look = str(server.freeActionLook()).strip()
        inventory = str(server.freeActionInventory()).strip()
        parts = [] if state_only else [feedback.strip()]
        if " ".join(look.split()) not in " ".join(feedback.split()) or state_only:
            parts.append(look)
        parts.append(inventory)
        return "\n\n".join(part for part in parts if part)

    def _require_task(self) -> None:
        if self._task is None:
            raise RuntimeError("Call reset(task) before using the environment")

    def admissible_actions(self) -> list[str]:
        """Every command valid now (ScienceWorld's action-object combinations; ~50-200 ms, so only on demand)."""
        self._require_task()
        return sorted(set(self._simulator.get_valid_action_object_combinations()))

    def close(self) -> None:
        if self._simulator is not None:
            self._simulator.close()
            self._simulator = None
            self._task = None

    # ---- capabilities (snapshot/restore come from @replay_snapshots) ------------------------------------------------

    def state_key(self) -> str:
        """Digest of what the agent can observe: its surroundings, inventory, score and a pending question. The
        simulator's full world state (rooms the agent is not in) is not exposed cheaply, so two states that look
        the same from where the agent stands share a key."""
        self._require_task()
        server = self._simulator.server
        parts = [
            str(server.freeActionLook()),
            str(server.freeActionInventory()),
            f"{self._score:.6f}",
            "|".join(self._options or ()),
        ]
        return hashlib.sha1("\n".join(parts).encode()).hexdigest()

    def optimal_plan(self) -> list[str] | None:
        """An expert plan from the current state: ScienceWorld's gold path (`generateGoldPath`), with the commands it
        contains that the simulator rejects taken out (they change nothing). ScienceWorld has no planner, so the plan
        is only known on the gold path: it is the rest of the gold path when the commands accepted since reset are
        its beginning, `[]` once the task is completed, else None. Gold paths are not guaranteed shortest.

        The gold path is computed once per (task, variation, simplifications) and process: the simulator reloads the
        task with gold-path generation (0.1-7 s), then this episode is replayed to where it was."""
        self._require_task()
        if self._success:
            return []
        if self._done:
            return None
        gold = self._gold_plan()
        if gold is None or tuple(self._history) != gold[: len(self._history)]:
            return None
        return list(gold[len(self._history) :])

    def _gold_plan(self) -> tuple[str, ...] | None:
        key = self._task
        if key not in self._GOLD_PLANS:
            history = list(self._history)
            self._load(key, gold_path=True)
            raw_gold = [str(a) for a in self._simulator.get_gold_action_sequence()]
            self._load(key)
            accepted = []
            for command in raw_gold:
                if self._done:
                    break
                command = " ".join(command.split()).lower()
                if self._apply(command)[1]:
                    accepted.append(command)
            self._GOLD_PLANS[key] = tuple(accepted) if self._success else None
            self._load(key)  # back to where the episode was: replay its accepted commands
            for command in history:
                self._apply(command)
        return self._GOLD_PLANS[key]

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(
        cls, split: str, count: int | None = None, tasks: list[str] | None = None, **env_kwargs: Any
    ) -> list[dict[str, Any]]:
        """Task rows from ScienceWorld's own variation splits: `"train"` (its train variations), `"eval"` (its dev
        variations) and `"unseen"` (its test variations), for the task names in `tasks` (default: all 30). Rows go
        round-robin over the tasks (first variation of every task, then the second...), so a small `count` still
        covers every task; `count=None` gives the whole split. A `simplifications` argument is copied into the rows.

        The first call in a process asks the simulator for the splits (~3 s, a JVM); they are cached on disk."""
        if split not in SPLITS:
            hint = " (ScienceWorld's test variations are the 'unseen' split)" if split == "test" else ""
            raise ValueError(f"Unknown ScienceWorld split {split!r}; choose one of {sorted(SPLITS)}{hint}")
        env = cls(**env_kwargs)  # validates the arguments; starts no JVM
        if count is not None and (isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0):
            raise ValueError(f"`count` must be an integer >= 0 or None, got {count!r}")
        if tasks is not None and (isinstance(tasks, str) or not tasks):
            raise ValueError(f"`tasks` must be a non-empty list of task names, got {tasks!r}")
        names = [_canonical_task(name) for name in (tasks or task_names())]
        splits = variation_splits()
        queues = [[(name, v) for v in splits[name][SPLITS[split]]] for name in names]
        rows: list[dict[str, Any]] = []
        for depth in range(max(len(queue) for queue in queues)):
            for queue in queues:
                if depth < len(queue) and (count is None or len(rows) < count):
                    name, variation = queue[depth]
                    row = {
                        "env": cls.name,
                        "task_id": f"{cls.name}-{name}-{variation}",
                        "task_name": name,
                        "variation": variation,
                    }
                    if env.simplifications:
                        row["simplifications"] = env.simplifications
                    rows.append(row)
        return rows
