"""Learning checks: RL on the tiny model actually improves the policy (seconds on CPU).

The toy env rewards an answer containing the letter 'a'; a fresh tiny model says one about 1 time in 10. Every
estimator must push that towards always. (The FrozenLake quickstart's gain is measured in benchmarks/, not here.)
"""

from __future__ import annotations

import pytest

from trl_agents import AgentGRPOConfig, AgentGRPOTrainer, GiGPOConfig, GiGPOTrainer
from trl_agents.testing import build_tiny_model, build_tiny_tokenizer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "trainer_class, config_class, extra",
    [
        (AgentGRPOTrainer, AgentGRPOConfig, {"advantage_estimator": "grpo"}),
        (AgentGRPOTrainer, AgentGRPOConfig, {"advantage_estimator": "rloo"}),
        (AgentGRPOTrainer, AgentGRPOConfig, {"advantage_estimator": "grpo", "row_format": "conversation", "max_turns": 2}),
        (GiGPOTrainer, GiGPOConfig, {}),
    ],
    ids=["grpo", "rloo", "grpo-conversation", "gigpo"],
)
def test_rl_learns_the_toy_task(trainer_class, config_class, extra, tmp_path):
    tokenizer = build_tiny_tokenizer(["a b c d e f g h"] * 10, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    length = extra.get("max_turns", 1)
    tasks = [{"env": "test-keyword", "seed": s, "length": length} for s in range(64)]
    values = dict(output_dir=str(tmp_path), max_steps=20, per_device_train_batch_size=32, num_generations=8,
                  max_completion_length=3, max_turns=1, learning_rate=0.01, logging_steps=1, report_to="none",
                  save_strategy="no", gradient_checkpointing=False, disable_tqdm=True, save_trajectories=False,
                  lr_scheduler_type="constant", seed=0)
    values.update(extra)
    trainer = trainer_class(model=model, args=config_class(**values), train_dataset=tasks, processing_class=tokenizer)
    trainer.train()
    success = [h["env/success_rate"] for h in trainer.state.log_history if "env/success_rate" in h]
    first, last = sum(success[:3]) / 3, sum(success[-3:]) / 3
    assert first < 0.35 and last > 0.8, success
