"""`flashnpc train --budget-s`: the schedule cut to what fits a machine lent for a fixed time."""
import pytest

from plugin.cli import main as flashnpc
from runtime.factory.train import BUDGET_PROBE_STEPS, TrainConfig, steps_for_budget

from .test_train import book_data, run_tiny  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_steps_for_budget_fit_the_steps_and_their_validations_in_the_budget():
    cfg = TrainConfig(steps=3000, batch_size=32, eval_interval=250, eval_examples=512)
    fit = steps_for_budget(10.0, 0.01, cfg)
    eval_s = 16 * 0.01 / 2
    assert 900 < fit < 1000
    assert fit * 0.01 + (fit // 250 + 2) * eval_s <= 10.0
    assert steps_for_budget(1e6, 0.01, cfg) == 3000
    assert steps_for_budget(1e-6, 0.01, cfg) == 1


def test_a_budget_too_small_for_more_than_the_probe_ends_the_run_after_the_probe(tmp_path, book_data):  # noqa: F811
    tcfg = TrainConfig(steps=200, batch_size=4, warmup_steps=50, eval_interval=1000, eval_examples=8,
                       checkpoint_interval=1000, log_interval=1)
    log = run_tiny(tmp_path, book_data, tcfg, budget_s=1e-3)
    assert log["budget"]["steps_asked"] == 200
    assert log["budget"]["steps"] == BUDGET_PROBE_STEPS
    assert [r["step"] for r in log["records"]] == list(range(BUDGET_PROBE_STEPS))
    assert log["final"]["step"] == BUDGET_PROBE_STEPS
    assert log["train_config"]["steps"] == 200  # what was asked; the log's budget says what ran


def test_an_ample_budget_trains_exactly_the_unbudgeted_schedule(tmp_path, book_data):  # noqa: F811
    tcfg = TrainConfig(steps=BUDGET_PROBE_STEPS + 6, batch_size=4, warmup_steps=3, eval_interval=1000,
                       eval_examples=8, checkpoint_interval=1000, log_interval=1)
    plain = run_tiny(tmp_path / "a", book_data, tcfg)
    budgeted = run_tiny(tmp_path / "b", book_data, tcfg, budget_s=1e6)
    assert budgeted["budget"]["steps"] == tcfg.steps
    assert [r["ce"] for r in budgeted["records"]] == pytest.approx([r["ce"] for r in plain["records"]], rel=1e-6)


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_cli_refuses_a_budget_that_is_not_a_positive_number_of_seconds(tmp_path, capsys, value):
    assert flashnpc(["train", "--tiny", "--out", str(tmp_path), "--budget-s", value, "--quiet"]) == 2
    assert "--budget-s must be a number of seconds > 0" in capsys.readouterr().err
