"""Worker of tests/training/test_multiprocess.py: two training steps of each case (method and settings) on the same 8 tasks
× G = 2 episodes, run with one process (`python tests/multiprocess_worker.py ...`) or several (`accelerate launch
--config_file configs/accelerate/cpu_2proc.yaml tests/multiprocess_worker.py ...`).

Rollouts must not depend on how tasks are split between processes, so the policy is a deterministic stand-in for
sampling (`DeterministicGenerator`) and the environment a small walk with every capability the methods need. A
process's generation batch is 8 episodes / number of processes, so the global batch is the same in both runs.

Written under `--output_dir/<case>/` (see `CASES`): the trainer's own `trajectories/*.parquet` (one file per rollout
and rank: actions, returns and advantages), `log_history.json` and `parameters.pt` (rank 0, after the last optimizer
step).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from transformers import AutoTokenizer

from trl_agents.envs import AgentEnv, VerifierAtom, register_env
from trl_agents.rollout.generators import GenerationOutput, SamplingParams
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS, get_method

GLOBAL_EPISODES = 8  # per generation batch, whatever the number of processes
NUM_GENERATIONS = 2
NUM_TASKS = 4  # each step runs all 4 (twice: 3SPO then reads a table filled by both processes)
ACTIONS = ("right", "left", "right", "wait")  # "wait" is invalid (the invalid-action penalty); two neighbours
# always hold one "right", so the G = 2 episodes of a task start differently

# Case name -> (method, config overrides). Every method except dr_grpo (its loss is normalised per process, see
# tests/training/test_multiprocess.py) and APPO (its split points rank z-scores of per-token entropies and log-probs from a
# batched forward, and a batch padded differently on one process than on two moves those by ~1e-7, enough to
# reorder near-equal tokens: the trees, not the arithmetic, differ) and IB-RL (it needs a two-role environment, and the
# walk has one role; its per-role adapters switch between forwards, which DDP's one-pass gradient sync does not
# follow), plus GRPO with gradient accumulation and with
# conversation rows.
CASES = {
    **{name: (name, {}) for name in METHODS if name not in ("dr_grpo", "appo", "ib_rl")},
    "bipace": ("bipace", {"hidden_layer": -1}),  # the tiny model has one decoder layer
    # OPSD alone: the teacher is the step-0 copy under a longer prompt, so the JSD's gradient is small; scaled up so
    # that a wrongly normalised update would show.
    "opsd": ("opsd", {"opsd_coef": 100.0}),
    # GRSD: ℓ_stu from the behaviour log-probs (the generator's), not a re-score. Here teacher and student prompts
    # differ by a one-token guidance, so a re-scored gap is ~1e-3 and GRSD's group normalisation of q (by the mean
    # |q|) would amplify the ~1e-7 differences of batched forwards padded differently on each process.
    "grsd": ("grsd", {"grsd_student_logprobs": "behaviour"}),
    "grpo_accumulation": ("grpo", {"gradient_accumulation_steps": 2}),
    "grpo_conversation": ("grpo", {"row_format": "conversation"}),
    # The loss, old and reference log-probs in row chunks of at most 150 tokens (a few rows each): every process
    # cuts the same chunks, gradients accumulate without synchronisation until the last chunk.
    "grpo_token_budget": ("grpo", {"max_tokens_per_forward": 150, "beta": 0.04}),
    # PATR: B = 4 leaves per task (with B = G = 2 the walk's two leaves mostly return the same).
    "patr": ("patr", {"patr_budget": 4}),
    # IGRPO: the gold answer from the task row (the walk's privileged context is not a Search-QA answer).
    "igrpo": ("igrpo", {"igrpo_answer_source": "task:task_id"}),
    # EPPO: the walk's tasks have no task type; pace by task id (four types, two per process).
    "eppo": ("eppo", {"eppo_task_type_field": "task_id"}),
    # 3SPO with its adaptive allocation (a depth-first search per task; per-task table).
    "3spo_adaptive": ("3spo", {"sspo_allocation": "adaptive", "sspo_g_max": 2, "state_scope": "task"}),
    # Per-episode scheduling: a seed per request in both (the generator's answer then depends on the prompt and the
    # seed only), lockstep against free; each process's rows must be the same (test_multiprocess.py).
    "grpo_seeded": ("grpo", {"deterministic_sampling": True}),
    "grpo_free": ("grpo", {"rollout_schedule": "free", "env_workers": 4}),
    # One-step-off: the second rollout generates in the background while the first trains (twice the tasks, so that
    # the second step's batch is in the first epoch and can be seen in advance).
    "grpo_1off": ("grpo", {"max_staleness": 1}),
    # DPEPO: the walk played in K = 2 copies through the `parallel` wrapper (DeterministicGenerator answers in its
    # format when the prompt is the wrapper's).
    "dpepo": ("dpepo", {"env_name": "parallel", "history_length": 0, "max_completion_length": 24,
                        "env_kwargs": {"inner": "test-multiprocess-walk", "num_envs": 2}}),
}
# `TRL_AGENTS_MULTIPROCESS_CASES=patr,appo pytest tests/training/test_multiprocess.py` checks only those cases (while working on
# a method); the default is every case.
if os.environ.get("TRL_AGENTS_MULTIPROCESS_CASES"):
    CASES = {name: CASES[name] for name in os.environ["TRL_AGENTS_MULTIPROCESS_CASES"].split(",")}

@register_env
class WalkEnv(AgentEnv):
    """Walk from 0 to a target at 1-3 (from the seed): +1 and success on arrival, −0.1 per other step.

    Has the capabilities every method needs: `state_key` (anchor states), `solver_value` (CAST), `verify`
    (VICT: one atom per position on the way, witnessed by the step that first reached it), `snapshot`/`restore`
    (BPO's forks) and `privileged_context` (OPSD, SDAR: the teacher is told where the target is).
    """

    name = "test-multiprocess-walk"
    instructions = "Walk to the target. Answer left or right."
    task_keys = ("seed",)

    def reset(self, task):
        self.seed = task["seed"]
        self.target = 1 + self.seed % 3
        self.position = 0
        self.num_steps = 0
        self.first_reached: dict[int, int] = {}  # position -> index of the step that first reached it
        return self._observation()

    def _observation(self) -> str:
        # The task seed is in the text, so two tasks never show the same prompt (see DeterministicGenerator).
        return f"Task {self.seed}: you are at {self.position}, the target is at {self.target}."

    def step(self, action_text):
        self.num_steps += 1
        move = {"left": -1, "right": 1}.get(action_text.strip())
        if move is None:
            return self._observation(), -0.1, False, {"valid": False}
        self.position += move
        self.first_reached.setdefault(self.position, self.num_steps - 1)
        arrived = self.position == self.target
        return self._observation(), 1.0 if arrived else -0.1, arrived, {"valid": True, "success": arrived}

    def state_key(self):
        return (self.seed, self.position)

    def solver_value(self):
        return float(abs(self.target - self.position))

    def snapshot(self):
        return (self.seed, self.target, self.position, self.num_steps, dict(self.first_reached))

    def restore(self, snapshot):
        self.seed, self.target, self.position, self.num_steps, first = snapshot
        self.first_reached = dict(first)

    def privileged_context(self):
        return f"The target is {self.target - self.position} steps to the right."

    def verify(self):
        return [
            VerifierAtom(
                f"reached:{k}",
                "sat" if k in self.first_reached else "unsat",
                witness_step=self.first_reached.get(k),
                depends_on=[f"reached:{k - 1}"] if k > 1 else [],
            )
            for k in range(1, self.target + 1)
        ]

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        return [{"env": cls.name, "seed": seed, "task_id": f"walk-{seed}"} for seed in range(count or NUM_TASKS)]


class DeterministicGenerator:
    """Answers "right" once an episode is right of the start, and otherwise one of `ACTIONS`, chosen by a hash of the
    prompt's text (so the choices do not depend on the tokenizer) and by how many identical prompts came before it
    in the same call; with request seeds (`per_request_seeds`: deterministic sampling), by the hash and the seed
    instead, so the answer does not depend on the other prompts of the call (per-episode scheduling).

    Identical prompts only come from the episodes of one task (the observation names the task), and whole groups
    run on one process in episode order, so every episode gets the same action however tasks are split between
    processes; the G episodes of a task still differ, which gives the groups reward variance.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]

    per_request_seeds = True

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 seeds: Sequence[int] | None = None) -> GenerationOutput:
        seen = Counter()
        completion_ids, logprobs = [], []
        for row, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            positions = re.findall(r"you are at (-?\d+)", text)
            if not positions or "reflect" in text.lower():
                # Not an episode's turn (GRSD's reflections, judge and guidance): a fixed answer, which a judge reads
                # as the score 2, the same on any process.
                action = "2"
            elif int(positions[-1]) > 0:
                action = "right"  # an episode that got going keeps going: more groups with a success and a failure
            else:
                draw = seen[text] if seeds is None else seeds[row]
                action = ACTIONS[(zlib.crc32(text.encode()) + draw) % len(ACTIONS)]
            if "environments this turn" in text:  # DPEPO's parallel wrapper: the same move in both copies
                action = f"<parallel><env_1>{action}</env_1><env_2>{action}</env_2></parallel>"
            seen[text] += 1
            ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            completion_ids.append(ids)
            logprobs.append([-1.0] * len(ids))
        return GenerationOutput(completion_ids, logprobs)


def train(case: str, model_dir: str, output_dir: str) -> None:
    method_name, overrides = CASES[case]
    method = get_method(method_name)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = overrides.get("gradient_accumulation_steps", 1)
    values = {
        "env_name": WalkEnv.name,
        "per_device_train_batch_size": GLOBAL_EPISODES // (world_size * accumulation),
        "num_generations": NUM_GENERATIONS,
        "max_completion_length": 8,
        "history_length": 1,
        # SGD, so that the parameter change is the gradient itself (Adam's first step is ±lr almost whatever the
        # gradient, which would hide a wrong normalisation).
        "optim": "sgd",
        "learning_rate": 0.5,
        "lr_scheduler_type": "constant",
    }
    config = tiny_training_config(method.config_class, output_dir, **{**values, **method.defaults, **overrides})
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    tasks = WalkEnv.task_split("train", 2 * NUM_TASKS if overrides.get("max_staleness") else NUM_TASKS)
    if config.env_name == "parallel":  # the wrapper plays the walk's tasks
        tasks = [{**task, "env": "parallel"} for task in tasks]
    trainer = method.trainer_class(
        model=model_dir,
        args=config,
        train_dataset=tasks,
        processing_class=tokenizer,
        generator=DeterministicGenerator(tokenizer),
    )
    trainer.train()
    if trainer.accelerator.is_main_process:
        with open(os.path.join(output_dir, "log_history.json"), "w") as handle:
            json.dump(trainer.state.log_history, handle)
        model = trainer.accelerator.unwrap_model(trainer.model)
        parameters = {name: p.detach().cpu() for name, p in model.named_parameters()}
        torch.save(parameters, os.path.join(output_dir, "parameters.pt"))
    trainer.accelerator.wait_for_everyone()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True, help="saved tiny model + tokenizer")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names of CASES")
    args = parser.parse_args(argv)
    for name in args.cases.split(","):
        train(name, args.model_dir, os.path.join(args.output_dir, name))


if __name__ == "__main__":
    main()
