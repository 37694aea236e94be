"""``agentd calibrate`` against the simulated backend with non-default coefficients, in virtual time.

The probes run through ``sim.transport.SimTransport`` under ``trio.testing.MockClock``: fast (a few
seconds of wall time for about two minutes of simulated backend time) and deterministic.
"""

from __future__ import annotations

import time

import attrs
import httpx
import pytest
import trio
import trio.testing

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from bench.calibrate_costs import CalibrateOptions, Calibration, calibrate, least_squares
from bench.commands import calibrate as calibrate_command
from daemon.config_loading import config_warnings, load_config
from sim.cluster import SimCluster, SimConfig
from sim.config import SimServerShape
from sim.stats import CostModel
from sim.transport import SimTransport

D_PRE, D_DEC = PrefillCostModel(), DecodeThroughputModel()
TRUTH = CostModel(
    prefill=PrefillCostModel(
        intercept_seconds=D_PRE.intercept_seconds * 2.0,
        linear_seconds_per_1k_tokens=D_PRE.linear_seconds_per_1k_tokens * 1.5,
        quadratic_seconds_per_1k_tokens_squared=D_PRE.quadratic_seconds_per_1k_tokens_squared * 2.5,
        decode_throughput_alpha=0.3,
    ),
    decode=DecodeThroughputModel(
        fixed_step_seconds=D_DEC.fixed_step_seconds * 1.7,
        batch_step_seconds_per_request=D_DEC.batch_step_seconds_per_request * 2.2,
        context_step_seconds_per_token=D_DEC.context_step_seconds_per_token * 2.8,
    ),
    simulate_alpha=True,
)


def run_calibration(opts: CalibrateOptions, truth: CostModel = TRUTH) -> tuple[Calibration, float]:
    async def main() -> tuple[Calibration, float]:
        cfg = SimConfig.from_shape(SimServerShape(dp_size=1), cost=truth)
        async with trio.open_nursery() as nursery:
            cluster = await nursery.start(SimCluster(cfg).run)
            t0 = trio.current_time()
            async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as client:
                result = await calibrate(client, "http://sim", opts)
            virtual = trio.current_time() - t0
            nursery.cancel_scope.cancel()
        return result, virtual

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_recovers_non_default_coefficients(tmp_path):
    cpu0 = time.process_time()
    result, virtual = run_calibration(CalibrateOptions())
    cpu = time.process_time() - cpu0  # CPU, not wall time: the same on a loaded machine (7 s of wall at load 9)
    assert cpu < 30
    assert virtual < 300
    got = result.coefficients()
    truth = {
        "prefill_cost_model.intercept_seconds": TRUTH.prefill.intercept_seconds,
        "prefill_cost_model.linear_seconds_per_1k_tokens": TRUTH.prefill.linear_seconds_per_1k_tokens,
        "prefill_cost_model.quadratic_seconds_per_1k_tokens_squared": (
            TRUTH.prefill.quadratic_seconds_per_1k_tokens_squared
        ),
        "decode_throughput_model.fixed_step_seconds": TRUTH.decode.fixed_step_seconds,
        "decode_throughput_model.batch_step_seconds_per_request": TRUTH.decode.batch_step_seconds_per_request,
        "decode_throughput_model.context_step_seconds_per_token": TRUTH.decode.context_step_seconds_per_token,
    }
    for name, value in truth.items():
        assert got[name] == pytest.approx(value, rel=0.05), name
    assert result.prefill.r_squared > 0.999 and result.decode.r_squared > 0.999
    alpha = got["prefill_cost_model.decode_throughput_alpha"]
    assert alpha == pytest.approx(TRUTH.prefill.decode_throughput_alpha, abs=0.05)

    block = result.toml_block()
    path = tmp_path / "calibrated.toml"
    path.write_text(block)
    cfg = load_config(path)
    ps = cfg.program_scheduling
    assert ps is not None
    assert ps.defaulted_coefficients() == ()
    assert not [w for w in config_warnings(cfg) if w.event == "program_scheduling_reference_calibration"]
    assert ps.prefill_cost_model.linear_seconds_per_1k_tokens == got["prefill_cost_model.linear_seconds_per_1k_tokens"]


def test_alpha_of_the_additive_step_model_is_small():
    """Without ``simulate_alpha`` a mixed step is prefill chunk + decode step: a decode batch keeps
    about one step's worth of throughput per 8192-token chunk, a few percent."""
    result, _ = run_calibration(CalibrateOptions(repeats=1), attrs.evolve(TRUTH, simulate_alpha=False))
    assert 0.0 <= result.alpha <= 0.1
    assert result.decode.coefficients[0] == pytest.approx(TRUTH.decode.fixed_step_seconds, rel=0.05)


def test_least_squares_exact_on_consistent_data():
    rows = [(1.0, x, x * x) for x in (0.5, 1.0, 2.0, 4.0)]
    y = [0.1 + 0.2 * x + 0.03 * x * x for _, x, _ in rows]
    assert least_squares(rows, y) == pytest.approx([0.1, 0.2, 0.03])
    with pytest.raises(ValueError):
        least_squares([(1.0, 1.0)], [1.0])


def test_unreachable_target_exits_1(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    calibrate_command.add_arguments(parser)
    args = parser.parse_args(["--target", "http://127.0.0.1:1", "--max-seconds", "10"])
    assert calibrate_command.run(args) == 1
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--repeats=0", "--max-concurrency=1", "--time-scale=0", "--max-seconds=-1"])
def test_bad_flag_exits_2_naming_it(flag, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    calibrate_command.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--target", "http://x", flag])
    assert exc.value.code == 2
    assert flag.split("=")[0] in capsys.readouterr().err
