"""What BEPO and ECPO share as state-keyed methods: their paper and tiny configs parse and name environments that key
states, and a task from an environment without `state_key` is refused at start-up with a one-line error."""

from __future__ import annotations

import os

import pytest
from helpers import check_method_yaml, register_env_without_state_key

from trl_agents.trainers import BEPOConfig, BEPOTrainer, ECPOConfig, ECPOTrainer

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")
METHODS = {"bepo": (BEPOConfig, BEPOTrainer), "ecpo": (ECPOConfig, ECPOTrainer)}
register_env_without_state_key("test-bepo-no-state-key", "An env without `state_key`: Gated-BEPO has no graph on it.")
register_env_without_state_key("test-ecpo-no-state-key", "An env without `state_key`: ECPO has no anchor states on it.")


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("flavour", ["alfworld", "sokoban_tiny"])
def test_yaml_configs_parse(method, flavour):
    check_method_yaml(os.path.join(CONFIGS, f"{method}_{flavour}.yaml"), method, METHODS[method][0],
                      capability="state_key")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_start_up_capability_error(method, tiny_model, tokenizer, tmp_path):
    config_class, trainer_class = METHODS[method]
    config = config_class(output_dir=str(tmp_path), report_to="none", num_generations=2,
                          per_device_train_batch_size=2, max_steps=1)
    with pytest.raises(ValueError, match=f"'test-{method}-no-state-key' .* lacks state_key"):
        trainer_class(model=tiny_model, args=config, train_dataset=[{"env": f"test-{method}-no-state-key", "seed": 0}],
                      processing_class=tokenizer)
