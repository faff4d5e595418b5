"""Contract test: every TRL behaviour AgentGRPOTrainer relies on, pinned on TRL 1.16.

AgentGRPOTrainer (trainers/agent_grpo.py, the only file that may) overrides six private methods of GRPOTrainer and
transformers' Trainer (`_generate_and_score_completions`, `_prepare_inputs`, `_compute_loss`, `_save`,
`_push_from_checkpoint` (a checkpoint push uploads the model files only; it keeps `push_in_progress`), and
`_get_per_token_logps_and_entropies`, which runs TRL's own over groups of rows of similar length and relies on its
arguments and its (log-probs, entropies, auxiliary loss) return value; it is also briefly replaced on the instance,
to reuse the policy log-probs of TRL's loss in an auxiliary loss), and reads or writes these private attributes: `_tokenizer`, `_metrics`, `_logs`, `_step`,
`_buffered_inputs`, `_dist`, `_last_loaded_step`, `_created_lr_scheduler` (`install_lr_scheduler`, for IB-RL's
per-role schedules), plus the class attributes `_tag_names`, `_name` and `_paper` (model cards). IB-RL overrides
TRL's public `compute_loss`, `create_optimizer` and `create_scheduler`: pinned at the end. Resuming and stopping
(`train()`, `checkpoints.py`, `callbacks/preemption.py`) override nothing private but rely on the order of
transformers' checkpoint writes and loads and of its callback events: pinned last.
Each is pinned here, with the reason. When a TRL upgrade changes any of this, a test
here fails and names what to revisit (docs/concepts/trl_internals.md).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import trl
from trl import GRPOConfig, GRPOTrainer
from trl.trainer import utils as trl_utils

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer


def test_trl_is_the_pinned_minor_version():
    assert trl.__version__.startswith("1.16."), "pyproject pins trl>=1.16,<1.17; re-run this file after bumping"


@pytest.mark.parametrize(
    "method, parameters",
    [
        ("_generate_and_score_completions", ["self", "inputs"]),
        ("_prepare_inputs", ["self", "generation_batch"]),
        ("_compute_loss", ["self", "model", "inputs"]),
        ("_save", ["self", "output_dir", "state_dict"]),  # transformers.Trainer: agent_config.json + extra state
        # transformers.Trainer: a checkpoint push uploads the model files only, not output_dir's trajectories
        ("_push_from_checkpoint", ["self", "checkpoint_folder"]),
    ],
)
def test_overridden_methods_keep_their_signatures(method, parameters):
    assert list(inspect.signature(getattr(GRPOTrainer, method)).parameters) == parameters


def test_the_private_methods_we_override_are_the_ones_we_know():
    # If AgentGRPOTrainer starts overriding another TRL/transformers private method, add it to the list above.
    ours = {name for name in vars(AgentGRPOTrainer) if name.startswith("_") and not name.startswith("__")}
    trl = {name for cls in GRPOTrainer.__mro__ for name in vars(cls) if name.startswith("_")}
    assert ours & trl == {"_generate_and_score_completions", "_prepare_inputs", "_compute_loss", "_save",
                          "_get_per_token_logps_and_entropies", "_push_from_checkpoint", "_tag_names", "_name"}


def test_the_hub_pushes_we_replace_keep_their_contract(trainer):
    # `push_to_hub` (public) is replaced by trl_agents.hub.push_run; it calls `save_model(_internal_call=True)` and
    # waits for a checkpoint push with `_finish_current_push`, as Trainer's does. `_push_from_checkpoint` keeps the
    # in-flight uploads in `push_in_progress` (a transformers.utils.hub.PushInProgress) and reads the hub_* args.
    from transformers import Trainer
    from transformers.utils.hub import PushInProgress

    # (transformers >= 5.18 adds `private` before **kwargs; ours takes it too)
    theirs = inspect.signature(Trainer.push_to_hub).parameters
    assert list(theirs)[:5] == ["self", "commit_message", "blocking", "token", "revision"]
    assert set(theirs) - {"private", "kwargs"} <= set(inspect.signature(AgentGRPOTrainer.push_to_hub).parameters)
    assert "_internal_call" in inspect.signature(Trainer.save_model).parameters
    assert callable(trainer._finish_current_push) and getattr(trainer, "push_in_progress", None) is None
    assert "self.push_in_progress = None" in inspect.getsource(Trainer.init_hf_repo)  # set when pushes start
    assert {"is_done", "jobs"} <= set(dir(PushInProgress([])))
    assert {"hub_strategy", "hub_always_push", "hub_token", "hub_revision", "hub_private_repo"} <= set(
        vars(trainer.args))
    # `log_values` calls Trainer.log directly (GRPOTrainer's adds the step metrics and the completions table).
    assert list(inspect.signature(Trainer.log).parameters)[:2] == ["self", "logs"]


def test_the_forward_we_run_in_row_groups_keeps_its_arguments():
    # AgentGRPOTrainer._get_per_token_logps_and_entropies passes the first seven through to each group's call; the
    # rest (multimodal inputs) default to None, and TRL's forward runs as it is when any is given.
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters.values())
    assert [p.name for p in params[:8]] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep",
                                            "batch_size", "compute_entropy", "compute_aux_loss"]
    assert all(p.default is None for p in params[8:]), [p.name for p in params[8:]]


@pytest.fixture
def trainer(tiny_model, tokenizer, tmp_path):
    """An AgentGRPOTrainer on the toy env, in train mode, with the accumulation steps the training loop would set."""
    config = AgentGRPOConfig(output_dir=str(tmp_path), env_name="test-keyword", report_to="none",
                             num_generations=2, per_device_train_batch_size=2, loss_type="dapo")
    trainer = AgentGRPOTrainer(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                               processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def test_private_attributes_we_use_exist_after_init(trainer, tokenizer):
    assert trainer._tokenizer is tokenizer  # the renderer and the generator tokenize with it
    assert set(trainer._metrics) == {"train", "eval"} and trainer._metrics["train"]["x"] == []  # defaultdict(list)
    # The completions table: one entry per episode is appended to these.
    assert {"prompt", "completion", "rewards", "advantages", "extra"} <= set(trainer._logs)
    assert trainer._step == 0 and trainer._buffered_inputs is None  # _prepare_inputs' generation schedule
    assert hasattr(trainer._dist, "summon_full_params")  # FSDP full parameters for generation
    assert trainer.loss_is_scaled_for_ga is True


def test_compute_loss_gets_the_policy_log_probs_from_one_call_we_can_capture(trainer):
    # Why an auxiliary loss can reuse TRL's per-token log-probs: `_compute_loss` calls
    # `self._get_per_token_logps_and_entropies` once, on the policy, and the loss is a function of what it returns.
    calls = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append((args[0], out[0]))
        return out

    trainer._get_per_token_logps_and_entropies = spy  # what _capturing_policy_logps does
    try:
        loss = GRPOTrainer._compute_loss(trainer, trainer.model, _inputs())
    finally:
        del trainer._get_per_token_logps_and_entropies
    assert len(calls) == 1 and calls[0][0] is trainer.model and calls[0][1].requires_grad
    (grad,) = torch.autograd.grad(loss, calls[0][1])
    assert grad.abs().sum() > 0  # the loss depends on the captured tensor


def test_use_vllm_switches_the_importance_sampling_ratio_on_in_compute_loss(trainer):
    # Why AgentGRPOTrainer raises `use_vllm` for one `_compute_loss` call when a user-passed generator samples
    # off-policy: TRL multiplies the per-token loss by inputs["importance_sampling_ratio"] only `if self.use_vllm`.
    inputs = dict(_inputs(), importance_sampling_ratio=torch.full((2, 2), 2.0))
    assert trainer.use_vllm is False and trainer.vllm_importance_sampling_correction is True
    plain = GRPOTrainer._compute_loss(trainer, trainer.model, dict(inputs)).item()
    trainer.use_vllm = True
    try:
        corrected = GRPOTrainer._compute_loss(trainer, trainer.model, dict(inputs)).item()
    finally:
        trainer.use_vllm = False
    assert plain == pytest.approx(-2.0, abs=1e-5) and corrected == pytest.approx(-4.0, abs=1e-5)


def test_the_correction_flag_gates_the_ratio_too(trainer):
    # Why one-step-off (max_staleness=1) also raises `vllm_importance_sampling_correction` for the loss call: TRL
    # multiplies by the ratio only `if self.use_vllm and self.vllm_importance_sampling_correction`.
    inputs = dict(_inputs(), importance_sampling_ratio=torch.full((2, 2), 2.0))
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, False
    try:
        off = GRPOTrainer._compute_loss(trainer, trainer.model, dict(inputs)).item()
    finally:
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = False, True
    assert off == pytest.approx(-2.0, abs=1e-5)


def test_the_training_loop_prepares_each_item_get_batch_samples_returns_in_order():
    # Why one-step-off can look one generation ahead by overriding the public `get_batch_samples`: the loop asks it
    # for each optimizer step's batches from the epoch's iterator, and trains on what it returns, in order.
    from transformers import Trainer

    assert list(inspect.signature(Trainer.get_batch_samples).parameters) == ["self", "epoch_iterator", "num_batches",
                                                                             "device"]
    source = inspect.getsource(Trainer)
    assert "self.get_batch_samples(epoch_iterator, num_batches, self.args.device)" in source
    assert "for i, inputs in enumerate(batch_samples):" in source


def test_clip_bounds_are_read_from_the_trainer_and_may_be_per_row_tensors(trainer):
    # Why `clip_bounds` (EPPO's per-task ε) works: TRL's loss reads `self.epsilon_low` / `self.epsilon_high` on every
    # call (AgentGRPOTrainer sets them for one call) and its clamp broadcasts (B, 1) tensors over the tokens.
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert "torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)" in source
    inputs = _inputs()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 2)
    inputs = dict(inputs, old_per_token_logps=logps - 0.5, advantages=torch.ones(2, 2))  # ratio e^0.5 = 1.65 > 1.5
    trainer.epsilon_low = trainer.epsilon_high = torch.tensor([[0.1], [0.5]])
    try:
        loss = GRPOTrainer._compute_loss(trainer, trainer.model, dict(inputs)).item()
    finally:
        trainer.epsilon_low = trainer.epsilon_high = 0.2
    assert loss == pytest.approx(-(1.1 + 1.1 + 1.5) / 3, abs=1e-5)  # row 0 clipped at 1.1, row 1 at 1.5


def _inputs():
    return {
        "prompt_ids": torch.tensor([[5, 6, 7], [0, 8, 9]]),
        "prompt_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]),
        "completion_ids": torch.tensor([[10, 11], [12, 0]]),
        "completion_mask": torch.tensor([[1, 1], [1, 0]]),
        "advantages": torch.tensor([[1.0, 2.0], [3.0, 0.0]]),
        "num_items_in_batch": torch.tensor(3.0),
    }


def test_helpers_we_call_exist_with_the_arguments_we_pass():
    params = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    for name in ["model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"]:
        assert name in params
    from trl.models import unwrap_model_for_generation
    from trl.models.utils import disable_gradient_checkpointing

    params = inspect.signature(unwrap_model_for_generation).parameters
    assert {"gather_deepspeed3_params", "gradient_checkpointing_kwargs"} <= set(params)
    assert list(inspect.signature(disable_gradient_checkpointing).parameters) == ["model", "gradient_checkpointing_kwargs"]
    assert list(inspect.signature(trl_utils.use_adapter).parameters) == ["model", "adapter_name"]
    assert GRPOTrainer.loss_is_scaled_for_ga is True  # so our auxiliary loss must be divided by the GA steps
    for name in ["steps_per_generation", "num_iterations", "scale_rewards", "ds3_gather_for_generation",
                 "chat_template_kwargs", "max_completion_length", "loss_type"]:
        assert name in GRPOConfig.__dataclass_fields__, name


def test_split_tensor_dict_still_drops_the_remainder():
    # Why AgentGRPOTrainer splits rows itself: TRL floors the chunk size (5 rows, 2 chunks -> 2 + 2).
    chunks = trl_utils.split_tensor_dict({"x": torch.arange(5)}, 2)
    assert [len(c["x"]) for c in chunks] == [2, 2]


def test_shuffle_keeps_scalars_and_permutes_lists_in_unison():
    batch = {"x": torch.arange(4), "tags": ["a", "b", "c", "d"], "n": torch.tensor(3.0)}
    out = trl_utils.shuffle_sequence_dict(batch)
    assert out["n"].item() == 3.0
    assert [ "abcd"[i] for i in out["x"].tolist()] == out["tags"]


def test_repeat_sampler_hands_out_whole_groups_in_a_row():
    sampler = trl_utils.RepeatSampler(list(range(10)), mini_repeat_count=4, batch_size=2, repeat_count=1, seed=0)
    indices = list(sampler)
    blocks = [indices[i : i + 4] for i in range(0, len(indices), 4)]
    assert all(len(set(block)) == 1 for block in blocks)


def test_grpo_trainer_requires_a_reward_source(tiny_model, tokenizer, tmp_path):
    # Why AgentGRPOTrainer registers `environment_return` as its reward function.
    from datasets import Dataset

    config = GRPOConfig(output_dir=str(tmp_path), bf16=False, report_to="none", num_generations=2,
                        per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="No reward source"):
        GRPOTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list([{"prompt": "x"}]),
                    processing_class=tokenizer)


def test_compute_loss_takes_per_token_advantages_and_the_env_mask(trainer):
    inputs = _inputs()
    # On-policy (no old log-probs), the ratio is 1 and dapo's loss is -Σ A·mask / num_items = -(1+2+3)/3.
    loss = trainer._compute_loss(trainer.model, dict(inputs))
    assert loss.item() == pytest.approx(-2.0, abs=1e-5)
    # tool_mask (our env mask) removes tokens from the loss: -(1+3)/2.
    masked = dict(inputs, tool_mask=torch.tensor([[1, 0], [1, 1]]), num_items_in_batch=torch.tensor(2.0))
    assert trainer._compute_loss(trainer.model, masked).item() == pytest.approx(-2.0, abs=1e-5)
    # (B,) advantages are broadcast by TRL; (B, T) are used as they are.
    scalar = dict(inputs, advantages=torch.tensor([1.0, 3.0]))
    assert trainer._compute_loss(trainer.model, scalar).item() == pytest.approx(-(1 + 1 + 3) / 3, abs=1e-5)


def test_the_entropy_bonus_is_read_from_the_trainer_on_every_loss():
    # ADRS (trainers/adrs.py) schedules TRL's entropy bonus by setting `trainer.entropy_coef` between steps: the loss
    # must read the attribute each time (not a copy taken at init), and add the bonus only when it started non-zero.
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert "self.entropy_coef" in source and "self._entropy_bonus_enabled" in source
    assert "self._entropy_bonus_enabled = self.entropy_coef != 0.0" in inspect.getsource(GRPOTrainer.__init__)


# ---- IB-RL's public overrides (compute_loss, create_optimizer, create_scheduler) -----------------------------------


@pytest.mark.parametrize(
    "owner, method, parameters",
    [
        (GRPOTrainer, "compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"]),
        (GRPOTrainer, "create_optimizer", ["self", "model"]),
        (GRPOTrainer, "create_scheduler", ["self", "num_training_steps", "optimizer"]),
    ],
)
def test_the_public_methods_ib_rl_overrides_keep_their_signatures(owner, method, parameters):
    # IBRLTrainer overrides them: one loss per trained role's rows with that role's adapter active (TRL's public
    # compute_loss, which calls _compute_loss), one AdamW per role, one schedule per role.
    assert list(inspect.signature(getattr(owner, method)).parameters) == parameters


def test_trl_compute_loss_is_the_private_loss_without_outputs():
    # IB-RL calls super().compute_loss per role, so every role's loss runs through AgentGRPOTrainer._compute_loss.
    source = inspect.getsource(GRPOTrainer.compute_loss)
    assert "return self._compute_loss(model, inputs)" in source


def test_the_trainer_builds_optimizer_then_scheduler_once_each_and_resets_a_created_schedule():
    # IB-RL's create_optimizer/create_scheduler build their role objects only when `self.optimizer` /
    # `self.lr_scheduler` is None, as Trainer's do; `install_lr_scheduler` sets `_created_lr_scheduler` as
    # Trainer.create_scheduler does, so that a later train() call builds a new schedule (Trainer resets it then).
    from transformers import Trainer

    assert "self._created_lr_scheduler = True" in inspect.getsource(Trainer.create_scheduler)
    prepare = inspect.getsource(Trainer._prepare_for_training)
    assert "if self._created_lr_scheduler:" in prepare and "self.lr_scheduler = None" in prepare
    assert "self.create_optimizer()" in prepare and "self.create_scheduler(num_training_steps=max_steps)" in prepare


def test_the_paper_trl_cites_is_a_class_attribute_with_id_and_citation():
    # AgentGRPOTrainer.card_metadata reads `_paper` (model cards cite TRL's citation when the paper ids match).
    assert {"id", "citation"} <= set(GRPOTrainer._paper) and GRPOTrainer._paper["id"] == "2402.03300"


# ---- what resuming and stopping rely on (train(), checkpoints.py, callbacks/preemption.py) ------------------------


def test_a_checkpoint_is_complete_once_its_trainer_state_is_written():
    # checkpoints.incomplete_reason: `_save_checkpoint` writes the model, then optimizer, scheduler, scaler and RNG
    # state, and trainer_state.json last; a save cut short leaves a folder without it.
    from transformers import Trainer

    source = inspect.getsource(Trainer._save_checkpoint)
    order = [source.index(step) for step in ("self.save_model(", "self._save_optimizer_and_scheduler(",
                                              "self._save_rng_state(", "self.state.save_to_json(")]
    assert order == sorted(order)


def test_on_train_begin_comes_after_the_checkpoint_loads_except_the_rng_state():
    # ResumeBookkeeping moves the later trajectory shards aside at on_train_begin: the model (train()), the trainer
    # state and the optimizer/scheduler (_init_training_state, _prepare_for_training) are loaded by then; the RNG
    # state loads after it, before the first on_step_begin (a failure there puts the shards back).
    from transformers import Trainer

    train = inspect.getsource(Trainer.train)
    assert train.index("self._load_from_checkpoint(") < train.index("inner_training_loop(")
    loop = inspect.getsource(Trainer._inner_training_loop)
    order = [loop.index(step) for step in ("self._init_training_state(", "self._prepare_for_training(",
                                           "on_train_begin(", "self._run_epoch(")]
    assert order == sorted(order)
    assert "self._load_optimizer_and_scheduler(" in inspect.getsource(Trainer._prepare_for_training)
    epoch = inspect.getsource(Trainer._run_epoch)
    assert epoch.index("self._load_rng_state(") < epoch.index("on_step_begin(")


def test_a_save_asked_for_at_a_step_end_is_made_then_on_save_runs():
    # StopOnSignal sets control.should_save (whatever save_strategy is, "no" included) and should_training_stop at
    # on_step_end; the save follows, then on_save (where a signal that came during the save stops the run).
    from transformers import Trainer

    epoch = inspect.getsource(Trainer._run_epoch)
    assert epoch.index("on_step_end(") < epoch.index("self._maybe_log_save_evaluate(")
    assert "should_training_stop" in epoch
    save = inspect.getsource(Trainer._maybe_log_save_evaluate)
    assert "if self.control.should_save:" in save
    assert save.index("self._save_checkpoint(") < save.index("on_save(")


def test_transformers_jit_checkpoint_sets_its_handler_at_init_and_restores_it_at_train_end():
    # StopOnSignal replaces that handler while train() runs and leaves alone a handler set meanwhile (the JIT
    # callback's on_train_end restores the one from before the trainer was built).
    from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback

    assert "signal.signal(signal.SIGTERM" in inspect.getsource(CheckpointManager.setup_signal_handler)
    assert "signal.signal(signal.SIGTERM" in inspect.getsource(JITCheckpointCallback.on_train_end)


def test_what_resume_errors_use_exists():
    # find_corrupt_file loads rng_state.pth as transformers does (numpy types allowed); a failed train() closes the
    # progress bar that ProgressCallback keeps in `training_bar`.
    from transformers.trainer_callback import ProgressCallback
    from transformers.trainer_pt_utils import safe_globals

    assert callable(safe_globals)
    assert "self.training_bar = None" in inspect.getsource(ProgressCallback.__init__)


def test_checkpointing_is_set_under_either_name_without_a_deprecation_warning(tmp_path):
    # transformers 5.24 renamed gradient_checkpointing to activation_checkpointing and warns on the old name, which
    # TRL 1.16 sets by default: every run printed a FutureWarning (and `train`'s one-line errors became three lines).
    import warnings

    from transformers import TrainingArguments

    from trl_agents.trainers.agent_grpo_config import checkpointing_setting

    has_new_name = "activation_checkpointing" in {f.name for f in TrainingArguments.__dataclass_fields__.values()}
    for settings, expected in (({}, True), ({"gradient_checkpointing": False}, False),
                               ({"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"x": 1}}, True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            config = AgentGRPOConfig(str(tmp_path), report_to="none", **settings)
        assert config.gradient_checkpointing is expected
        if has_new_name:
            assert config.activation_checkpointing is expected
    assert list(checkpointing_setting(False)) == ["activation_checkpointing" if has_new_name else "gradient_checkpointing"]
