"""Pure pieces of the trainer: LR schedules, straggler models, gradient clipping, the event summary."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wagma_bench.config.schedules import lr_at, peak_lr, round_up
from wagma_bench.imbalance import (
    AuthorsImbalance,
    FixedImbalance,
    IndependentImbalance,
    LognormalImbalance,
    SharedDrawImbalance,
)
from wagma_bench.record.events import summarize
from wagma_bench.train.state import make_local_optimizer


def test_linear_scaling_rule_and_paper_resnet50_schedule():
    peak = peak_lr(0.1, 128, 64, 256)  # paper: per-GPU batch 128, lr 0.1 x global / 256
    assert peak == pytest.approx(3.2)
    kw = {
        "peak": peak,
        "start": 0.1,
        "warmup_epochs": 5,
        "schedule": "step",
        "epochs": 90,
        "milestones": [30, 60, 80],
    }
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(2.5, **kw) == pytest.approx(0.1 + (3.2 - 0.1) / 2)
    assert lr_at(5, **kw) == pytest.approx(3.2)
    assert lr_at(29.9, **kw) == pytest.approx(3.2)
    assert lr_at(30, **kw) == pytest.approx(0.32)
    assert lr_at(65, **kw) == pytest.approx(0.032)
    assert lr_at(85, **kw) == pytest.approx(0.0032)


def test_cosine_and_inverse_sqrt():
    kw = {"peak": 1.0, "start": 0.0, "warmup_epochs": 1, "epochs": 11}
    assert lr_at(1, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(6, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_at(11, schedule="cosine", **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(4, schedule="inverse_sqrt", **kw) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="choose"):
        lr_at(3, schedule="linear", **kw)


def test_shared_draw_imbalance_draws_the_same_ranks_everywhere():
    model = SharedDrawImbalance(SharedDrawImbalance.Settings(num_slow=2, delay_s=0.32), seed=5)
    for step in range(50):
        slow = model.slow_ranks(8, step)
        assert len(slow) == 2
        delays = [model.delay(r, 8, step, 0.1) for r in range(8)]
        assert sorted(delays) == [0.0] * 6 + [0.32, 0.32]
        assert {r for r, d in enumerate(delays) if d} == slow
    # every rank is slow about num_slow / P of the time
    counts = [sum(r in model.slow_ranks(8, s) for s in range(4000)) for r in range(8)]
    assert all(abs(c / 4000 - 0.25) < 0.03 for c in counts)


def test_independent_imbalance_is_a_pure_function_of_seed_rank_and_step():
    """Each rank asks in its own process: a fresh model (as another rank builds it) gives the same answers."""
    settings = IndependentImbalance.Settings(delay_s=0.32, probability=0.25)

    def delays(seed: int, world: int = 8, base_s: float = 0.1) -> list[float]:
        return [
            IndependentImbalance(settings, seed=seed).delay(r, world, s, base_s)
            for r in range(8)
            for s in range(300)
        ]

    first = delays(7)
    assert first == delays(7) and set(first) == {0.0, 0.32}
    assert delays(8) != first
    # the world size and the compute time do not enter: a rank's delay is its own draw
    assert first == delays(7, world=64, base_s=9.0)


def test_independent_imbalance_delays_each_rank_at_its_probability_independently():
    """The default probability, the paper's 1 - (63/64)^2: the delayed share of 16 x 5000 (rank, step) pairs
    within 5 binomial sigmas of it (fixed seed, so the check is deterministic), every rank delayed on steps of
    its own."""
    settings = IndependentImbalance.Settings()
    p, world, steps = settings.probability, 16, 5000
    assert p == pytest.approx(1 - (63 / 64) ** 2, abs=1e-15) and settings.delay_s == 0.32
    model = IndependentImbalance(settings, seed=3)
    slow = [[model.delay(r, world, s, 0.1) > 0 for s in range(steps)] for r in range(world)]
    n = world * steps
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(sum(map(sum, slow)) / n - p) < 5 * sigma
    assert len({tuple(row) for row in slow}) == world  # no two ranks share their sequence of delays
    # independent of each other: the number of slow ranks per step varies, none on most steps at P=16
    per_step = {sum(slow[r][s] for r in range(world)) for s in range(steps)}
    assert {0, 1, 2} <= per_step


def test_independent_imbalance_at_probability_zero_and_one():
    never = IndependentImbalance(IndependentImbalance.Settings(delay_s=0.5, probability=0.0), seed=1)
    always = IndependentImbalance(IndependentImbalance.Settings(delay_s=0.5, probability=1.0), seed=1)
    pairs = [(r, s) for r in range(8) for s in range(500)]
    assert all(never.delay(r, 8, s, 0.1) == 0.0 for r, s in pairs)
    assert all(always.delay(r, 8, s, 0.1) == 0.5 for r, s in pairs)


def _authors_code(seed: int, world: int, steps: int) -> list[list[bool]]:
    """The oracle: each rank runs the authors' ``my_func`` as written (``rank == randint(P) or rank ==
    randint(P)``, Python's own short-circuit) over its own copy of one stream, the same on every rank."""
    import numpy as np

    from wagma_bench.imbalance import uniform

    u = uniform(seed, AuthorsImbalance.stream, np.arange(2 * steps + 1), 0)
    shared = [min(int(x * world), world - 1) for x in u]  # np.random.randint(P), seeded alike on every rank
    rows = []
    for rank in range(world):
        stream = iter(shared)
        rows.append([rank == next(stream) or rank == next(stream) for _ in range(steps)])
    return rows


@pytest.mark.parametrize("world", [1, 2, 4, 7, 64])
def test_the_authors_rule_is_their_code_run_on_every_rank(world):
    """Each rank's own question (the trainer's, step by step and after a resume) and the world's at once (the
    simulator's, in blocks) give what the authors' code gives each rank."""
    import numpy as np

    settings = AuthorsImbalance.Settings()
    want = _authors_code(seed=5, world=world, steps=300)
    own = {r: AuthorsImbalance(settings, seed=5) for r in range(world)}  # each rank's model, in its process
    assert [[own[r].delay(r, world, s, 0.1) > 0 for s in range(300)] for r in range(world)] == want
    model = AuthorsImbalance(
        settings, seed=5
    )  # in blocks of 37 steps, then a resumed rank asking from step 150
    blocks = np.concatenate(
        [model.delays(world, np.zeros((world, 37)), first_step=k) for k in range(0, 300, 37)], axis=1
    )[:, :300]
    assert (blocks > 0).tolist() == want and set(blocks.ravel()) <= {0.0, 0.32}
    resumed = AuthorsImbalance(settings, seed=5)
    resumed.delay(0, world, 299, 0.1)
    assert [resumed.delay(0, world, s, 0.1) > 0 for s in range(150, 300)] == want[0][150:]


@pytest.mark.parametrize("world", [64, 1024])
def test_the_authors_rule_delays_two_minus_one_over_p_ranks_a_step_at_any_world(world):
    """The expected number of slow ranks a step is P (1 - (1 - 1/P)^2) = 2 - 1/P: 1.98 at the paper's P = 64
    and about 2 at 1,024, where imbalance=independent's preset (the P = 64 probability kept) delays about 32.
    The mean of 3,000 steps within 5 standard errors of it (a fixed seed: deterministic); the count varies."""
    import numpy as np

    slow = AuthorsImbalance(AuthorsImbalance.Settings(), seed=2).delays(world, np.zeros((world, 3000))) > 0
    per_step = slow.sum(axis=0)
    assert abs(per_step.mean() - (2 - 1 / world)) < 5 * per_step.std() / np.sqrt(per_step.size)
    assert {0, 1, 2, 3} <= set(per_step.tolist())
    rate = slow.mean(axis=1)  # every rank at the same probability, 1 - (1 - 1/P)^2
    assert abs(rate.mean() - (1 - (1 - 1 / world) ** 2)) < 5 * np.sqrt(rate.mean() / slow.size)
    independent = IndependentImbalance(IndependentImbalance.Settings(), seed=2)
    assert (independent.delays(world, np.zeros((world, 300))) > 0).sum(axis=0).mean() == pytest.approx(
        world * IndependentImbalance.Settings().probability, rel=0.2
    )


def test_fixed_and_lognormal_imbalance():
    fixed = FixedImbalance(FixedImbalance.Settings(ranks=[1], factor=3.0), seed=0)
    assert fixed.delay(1, 4, 0, 0.2) == pytest.approx(0.4) and fixed.delay(0, 4, 0, 0.2) == 0
    group = FixedImbalance(FixedImbalance.Settings(ranks=[2, 3], factor=2.0), seed=0)  # a whole group slow
    assert [group.delay(r, 4, 0, 0.1) for r in range(4)] == [0, 0, pytest.approx(0.1), pytest.approx(0.1)]
    logn = LognormalImbalance(LognormalImbalance.Settings(sigma=0.5), seed=0)
    d = [logn.delay(r, 4, s, 0.1) for r in range(4) for s in range(200)]
    assert (
        min(d) == 0
        and max(d) > 0.05
        and d == [logn.delay(r, 4, s, 0.1) for r in range(4) for s in range(200)]
    )


def test_round_up_to_sync_points():
    assert round_up(20, 11) == 22 and round_up(22, 11) == 22 and round_up(3, 11) == 11 and round_up(7, 1) == 7


def test_grad_clip_applies_before_the_local_step():
    train = SimpleNamespace(
        local_optimizer="sgd",
        lr=1.0,
        momentum=0.0,
        nesterov=False,
        weight_decay=0.0,
        adam_betas=[0.9, 0.98],
        grad_clip=0.5,
    )
    p = torch.nn.Parameter(torch.zeros(4))
    opt = make_local_optimizer(train)([p])
    p.grad = torch.full((4,), 10.0)
    opt.step()
    assert p.data.norm().item() == pytest.approx(0.5)


def _event(key, value=None, **meta):
    return {"key": key, "value": value, "time_ms": 0, "metadata": meta}


def test_summary_from_events_time_to_target_excludes_eval():
    events = [
        _event(
            "run_start", workload="resnet", optimizer="wagma", world_size=4, seed=1, metric="top1", target=0.9
        ),
        _event("eval_accuracy", 0.5, step=10, samples=1280, train_s=10.0, wall_s=12.0, eval_s=2.0),
        _event("eval_accuracy", 0.92, step=20, samples=2560, train_s=20.0, wall_s=24.0, eval_s=4.0),
        _event("eval_accuracy", 0.91, step=30, samples=3840, train_s=30.0, wall_s=36.0, eval_s=6.0),
        _event("run_stop", status="completed", step=30, samples=3840, train_s=30.0, wall_s=36.0, eval_s=6.0),
    ]
    s = summarize(events)
    assert s["reached"] and s["time_to_target_s"] == 20.0 and s["rounds_to_target"] == 20
    assert (s["final_metric"], s["best_metric"], s["status"]) == (0.91, 0.92, "completed")
    assert s["throughput_samples_per_s"] == pytest.approx(128.0)
    crashed = summarize(events[:3])
    assert crashed["status"] == "incomplete" and crashed["reached"]


@pytest.mark.parametrize(
    "sync,every,total", [(1, 10, 100), (11, 10, 132), (8, 21, 200), (16, 5, 160), (7, 7, 70)]
)
def test_evaluations_follow_one_grid_whatever_the_sync_period(sync, every, total):
    """The trainer evaluates at sync points only, at the first one at or after each multiple of eval_every
    (the oracle: each grid point rounded up to the sync period), and at the end: optimizers of other sync
    periods are evaluated within one period of the same rounds, not every eval_every-rounded-up rounds."""
    from wagma_bench.config.plan import RunPlan
    from wagma_bench.config.schedules import round_up

    plan = RunPlan(sync, 100, total, every, sync, {})
    evals, next_eval = [], plan.eval_every
    for r in range(sync, total + 1, sync):  # the loop's sync points (should_evaluate's rule)
        if r >= next_eval or r >= total:
            evals.append(r)
            next_eval = plan.next_eval_after(r)
    oracle = sorted(
        {round_up(g, sync) for g in range(every, total + 1, every) if round_up(g, sync) <= total} | {total}
    )
    assert evals == oracle


@pytest.mark.parametrize(
    "optimizer,sync",
    [
        ("local_sgd", ["optimizer.sync_period=10000"]),
        ("wagma", ["optimizer.tau=3"]),
        ("eager", ["optimizer.sync_period=4"]),
        ("adpsgd", ["optimizer.sync_period=4"]),
    ],
)
def test_a_budget_ends_where_it_says_and_the_budget_line_names_its_extra_synchronisation_point(
    optimizer, sync
):
    """train.max_rounds=5 is the run's length for every optimizer, whatever its sync period (once 10,000 steps
    under local SGD's period=10000); the budget line, one short sentence, says the last round is an extra
    synchronisation point and the period, and names the page that says what the optimizer does there. A
    budget on a sync point needs no such words."""
    from tests.cli_util import compose
    from wagma_bench.config.plan import BUDGET_DOC, RunPlan
    from wagma_bench.config.schema import validate
    from wagma_bench.optim.specs import OPTIMIZER_SPECS

    cfg = validate(compose(f"optimizer={optimizer}", *sync, "train.max_rounds=5", "train.time_limit_s=60"))
    spec = OPTIMIZER_SPECS[optimizer]
    plan = RunPlan.of(cfg, spec.sync_period_of(cfg.optimizer), 100, 4)
    line = plan.budget_line(cfg)
    assert plan.total == 5 and "\n" not in line, line
    assert line == (
        f"budget: 5 rounds (train.max_rounds=5; the last an extra sync point, {optimizer} syncing every "
        f"{plan.sync}), or until eval.target=0.97 or train.time_limit_s=60 ({BUDGET_DOC})"
    ), line
    assert len(line.split()) <= 25, f"the budget line is no short sentence: {len(line.split())} words"
    assert spec.final_sync and "rounded" not in line
    on_sync = validate(compose(f"optimizer={optimizer}", *sync, f"train.max_rounds={plan.sync}"))
    exact = RunPlan.of(on_sync, plan.sync, 100, 4).budget_line(on_sync)
    assert (
        exact.startswith(f"budget: {plan.sync} rounds (train.max_rounds={plan.sync}") and "extra" not in exact
    )


def test_the_budget_page_says_what_each_optimizer_does_at_an_extra_last_synchronisation_point():
    """The budget line names only the period; the page it names holds, for every optimizer with an extra
    last synchronisation point, its spec's ``final_sync``, word for word (a spec changed alone fails)."""
    import re
    from pathlib import Path

    from wagma_bench.config.plan import BUDGET_DOC
    from wagma_bench.optim.specs import OPTIMIZER_SPECS

    page = (Path(__file__).resolve().parents[1] / BUDGET_DOC).read_text()
    block = re.search(r"<!-- final_sync:begin -->\n(.*?)\n<!-- final_sync:end -->", page, re.DOTALL)
    assert block, f"{BUDGET_DOC} has no final_sync block"
    rows = ["| optimizer | at an extra last synchronisation point |", "|---|---|"]
    rows += [f"| `{name}` | {spec.final_sync} |" for name, spec in OPTIMIZER_SPECS.items() if spec.final_sync]
    assert block.group(1) == "\n".join(rows), f"{BUDGET_DOC}'s table differs from the specs' final_sync"


def test_the_last_round_of_a_schedule_is_synchronous_over_the_whole_world():
    """The schedule the optimizer, the engine and the simulator share knows the run's last round: synchronous
    over every rank there, whatever the period; the rounds before it keep their groups."""
    from wagma_bench.comm.topology import FixedSchedule, WagmaSchedule

    wagma = WagmaSchedule(8, 2, tau=3, last=10)
    assert [r for r in range(1, 11) if wagma.is_sync(r)] == [4, 8, 10]
    assert wagma.group(5, 10) == tuple(range(8)) and len(wagma.group(5, 9)) == 2
    assert not WagmaSchedule(8, 2, tau=3).is_sync(10)
    eager = FixedSchedule(4, period=4, last=7)
    assert [r for r in range(1, 8) if eager.is_sync(r)] == [4, 7]
