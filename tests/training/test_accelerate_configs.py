"""The launch configs in configs/accelerate/ are valid for accelerate: each goes through `accelerate launch`'s own
validation and environment preparation, and the DeepSpeed / FSDP plugins accelerate would build from them (no GPU
needed for that)."""

from __future__ import annotations

import glob
import os
from unittest import mock

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

FOLDER = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "accelerate")
CONFIGS = sorted(glob.glob(os.path.join(FOLDER, "*.yaml")))
EXPECTED = {  # file -> (distributed type, ZeRO stage or FSDP version)
    "ddp.yaml": (DistributedType.MULTI_GPU, None),
    "deepspeed_zero2.yaml": (DistributedType.DEEPSPEED, 2),
    "deepspeed_zero3.yaml": (DistributedType.DEEPSPEED, 3),
    "fsdp.yaml": (DistributedType.FSDP, 2),
    "cpu_2proc.yaml": (DistributedType.MULTI_GPU, None),
}


def launch_environment(path: str) -> tuple[dict[str, str], object]:
    """What `accelerate launch --config_file PATH train.py` validates and exports to the training processes."""
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    return env, defaults


def test_every_config_is_known():
    assert sorted(os.path.basename(p) for p in CONFIGS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_accelerate_accepts_the_config(path, tiny_model):
    distributed_type, level = EXPECTED[os.path.basename(path)]
    env, config = launch_environment(path)
    assert config.distributed_type == distributed_type
    with open(path) as handle:
        header = handle.read().split("compute_environment:")[0]
    assert "accelerate launch --config_file configs/accelerate/" in header  # each says how to launch it
    name = os.path.basename(path).removesuffix(".yaml")
    assert f"--config_file $(trl-agents configs --path {name})" in header  # and how, installed with pip
    if distributed_type == DistributedType.DEEPSPEED:
        with mock.patch.dict(os.environ, env):
            plugin = DeepSpeedPlugin()
        assert plugin.zero_stage == level
        assert plugin.deepspeed_config["zero_optimization"]["stage"] == level
    elif distributed_type == DistributedType.FSDP:
        with mock.patch.dict(os.environ, env):
            plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == level
        # no layer class is named: accelerate wraps what the model lists in `_no_split_modules`, the decoder layer
        # of Qwen2 models for the tiny test model (test_fsdp_wraps_the_decoder_layers_of_any_model_family: Qwen3)
        assert plugin.transformer_cls_names_to_wrap is None
        plugin.set_auto_wrap_policy(tiny_model)
        assert plugin.transformer_cls_names_to_wrap == ["Qwen2DecoderLayer"]
    else:
        assert env["ACCELERATE_MIXED_PRECISION"] in ("bf16", "no")


def test_no_config_names_a_model_family():
    # a layer class (e.g. Qwen2DecoderLayer) would fail every model of another family (the Qwen3 configs)
    for path in CONFIGS:
        with open(path) as handle:
            text = handle.read()
        assert "transformer_layer_cls_to_wrap" not in text.split("compute_environment:")[1], path


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Qwen3ForCausalLM(config)


def test_fsdp_wraps_the_decoder_layers_of_any_model_family():
    # what accelerate does with the FSDP2 config when it prepares a Qwen3 model (Accelerator.prepare ->
    # fsdp2_prepare_model): one shard unit per Qwen3DecoderLayer, found through the model's `_no_split_modules`
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    env, _ = launch_environment(os.path.join(FOLDER, "fsdp.yaml"))
    with mock.patch.dict(os.environ, env):
        plugin = FullyShardedDataParallelPlugin()
    model = tiny_qwen3()
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    wrapped = [type(module).__name__ for module in model.modules() if policy(module)]
    assert wrapped == ["Qwen3DecoderLayer"] * 2


def test_training_gpus_do_not_count_the_vllm_gpu():
    for path in CONFIGS:
        if os.path.basename(path) != "cpu_2proc.yaml":
            with open(path) as handle:
                assert "number of TRAINING GPUs, not counting a GPU that serves vLLM" in handle.read(), path


def test_a_broken_config_is_caught(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_process: 2\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_config_from_file(str(broken))
    broken.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 2\n"
                      "fsdp_config:\n  fsdp_auto_wrap_policy: EVERY_LAYER\n")
    env, _ = launch_environment(str(broken))
    with mock.patch.dict(os.environ, env), pytest.raises(ValueError, match="auto wrap policy"):
        FullyShardedDataParallelPlugin()
