"""One value describes a simulated server's shape: the ``[embedded]`` section, the bench's cluster,
the engines and the ``agentd sim-backend`` flags all read ``sim.config.SimServerShape``."""

from __future__ import annotations

import argparse

import attrs
import pytest

from bench.bench import ClusterSpec
from daemon.commands import sim_backend
from daemon.config import EmbeddedConfig
from daemon.config_loading import ConfigError, dump_config, load_config
from sim.cluster import SimConfig
from sim.config import SimServerShape, shape_of
from sim.engine import EngineConfig
from sim.stats import CostModel

SHAPE_FIELDS = [a.name for a in attrs.fields(SimServerShape)]


def test_every_description_of_a_server_is_a_shape() -> None:
    for cls in (EmbeddedConfig, ClusterSpec, EngineConfig):
        assert issubclass(cls, SimServerShape)
        assert [a.name for a in attrs.fields(cls) if a.name in SHAPE_FIELDS] == SHAPE_FIELDS
    # the same defaults everywhere (the sim-backend command alone defaults to one DP rank)
    assert shape_of(EmbeddedConfig()) == shape_of(ClusterSpec()) == SimServerShape()


def test_embedded_section_keeps_its_keys_order_and_rules() -> None:
    assert list(dump_config(load_config(None))["embedded"]) == ["num_workers", *SHAPE_FIELDS]
    bad = {
        "num_workers": 0,
        "dp_size": 0,
        "num_gpu_blocks": -1,
        "block_size": 0,
        "max_num_seqs": 0,
        "max_num_batched_tokens": 0,
        "time_scale": float("inf"),
        "model": " ",
        "scheduling_policy": "sjf",
        "seed": -1,
    }
    with pytest.raises(ConfigError) as info:
        load_config(None, {"embedded": bad})
    assert info.value.lines == [
        "embedded.num_workers: must be an integer > 0 (got 0)",
        "embedded.dp_size: must be an integer > 0 (got 0)",
        "embedded.num_gpu_blocks: must be an integer > 0 (got -1)",
        "embedded.block_size: must be an integer > 0 (got 0)",
        "embedded.max_num_seqs: must be an integer > 0 (got 0)",
        "embedded.max_num_batched_tokens: must be an integer > 0 (got 0)",
        "embedded.time_scale: must be finite and >= 0.001 (got inf)",
        "embedded.model: must be a non-empty string (got ' ')",
        "embedded.scheduling_policy: must be one of 'fcfs', 'priority', 'batch_job_aware' (got 'sjf')",
        "embedded.seed: must be an integer >= 0 (got -1)",
    ]


def test_a_server_of_a_shape() -> None:
    spec = ClusterSpec(workers=3, dp_size=4, num_gpu_blocks=300, block_size=32, time_scale=5.0, model="m", seed=7)
    cost = CostModel()
    config = SimConfig.from_shape(spec, worker_index=2, cost=cost, deterministic=True)
    assert (config.dp_size, config.model, config.seed, config.deterministic) == (4, "m", 9, True)
    assert config.engine == EngineConfig(
        dp_size=4, num_gpu_blocks=300, block_size=32, time_scale=5.0, model="m", seed=9, cost=cost
    )
    assert config.engine.max_model_len == 299 * 32


def test_sim_backend_flags_are_the_shape() -> None:
    parser = argparse.ArgumentParser()
    sim_backend.add_arguments(parser)
    args = parser.parse_args(["--num-gpu-blocks", "128", "--scheduling-policy", "priority", "--strict-xargs"])
    config = sim_backend.config_from_args(args)
    expected = SimServerShape(dp_size=1, num_gpu_blocks=128, scheduling_policy="priority")
    assert config == SimConfig.from_shape(expected, strict_xargs=True)
    defaults = parser.parse_args([])
    assert shape_of(defaults) == attrs.evolve(SimServerShape(), dp_size=1)


def test_sim_backend_cost_flags() -> None:
    parser = argparse.ArgumentParser()
    sim_backend.add_arguments(parser)
    assert sim_backend.config_from_args(parser.parse_args([])).engine.cost == CostModel()
    args = parser.parse_args(
        ["--intercept-seconds", "0.2", "--fixed-step-seconds", "0.03", "--context-step-seconds-per-token", "0"]
    )
    cost = sim_backend.config_from_args(args).engine.cost
    assert cost.prefill.intercept_seconds == 0.2 and not cost.simulate_alpha
    assert (cost.decode.fixed_step_seconds, cost.decode.context_step_seconds_per_token) == (0.03, 0.0)
    assert cost.decode.batch_step_seconds_per_request == CostModel().decode.batch_step_seconds_per_request
    cost = sim_backend.config_from_args(parser.parse_args(["--decode-throughput-alpha", "0.3"])).engine.cost
    assert cost.simulate_alpha and cost.prefill.decode_throughput_alpha == 0.3
    for bad in (
        ["--fixed-step-seconds", "0"],
        ["--linear-seconds-per-1k-tokens", "-1"],
        ["--decode-throughput-alpha", "1.5"],
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
