"""The order in which the trainer calls an algorithm, as ``wagma_bench/optim/base.py`` documents it, on a
real 2-rank gloo world through the real trainer: a fresh run (construction, its budget, the initial broadcast,
steps, rank 0's sizing of checkpoints before the first step, state saved at synchronisation points, close) and
its resume (construction, load_state_dict instead of the broadcast, steps from the checkpoint's round, close);
the resume, with a larger budget, is told the new one."""

from __future__ import annotations

from pathlib import Path

from tests.dist_util import run_world

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = [
    "launcher.nproc=2",
    "optimizer=local_sgd",
    "optimizer.sync_period=2",
    "eval.every_rounds=4",
    "eval.target=null",
    "workload.arch=resnet8",
    "train.batch_size=8",
    "checkpoint.every_s=0",
    "logger.progress=off",
]


def _recorded_runs(comm, run_dir: str) -> list:
    """Train 8 rounds, then resume the same run to 12, with the registry's local SGD wrapped to record every
    call the trainer makes in this rank; returns each run's calls and (rank 0) status."""
    from hydra import compose, initialize_config_dir

    from wagma_bench import optim
    from wagma_bench.config.schema import validate
    from wagma_bench.train.trainer import train

    calls: list = []
    base = optim.OPTIMIZERS["local_sgd"]

    class Recording(base):
        def __init__(self, *args, **kwargs):
            calls.append(("init",))
            self.sizing = False
            super().__init__(*args, **kwargs)

        def end_at(self, rounds):
            calls.append(("end_at", rounds))
            super().end_at(rounds)

        def broadcast_initial_model(self):
            calls.append(("broadcast_initial_model",))
            super().broadcast_initial_model()

        def load_state_dict(self, state):
            calls.append(("load_state_dict", state["round"]))
            super().load_state_dict(state)

        def step(self):
            info = super().step()
            calls.append(("step", info.round))
            return info

        def state_dict(self):
            if not self.sizing:
                calls.append(("state_dict", self.round))
            return super().state_dict()

        def largest_state_dict(self):  # rank 0 at the start, for the checkpoint size it says (not a save)
            calls.append(("largest_state_dict", self.round))
            self.sizing = True
            try:
                return super().largest_state_dict()
            finally:
                self.sizing = False

        def close(self):
            calls.append(("close", self.round))
            super().close()

    optim.OPTIMIZERS["local_sgd"] = Recording
    runs = []
    for max_steps in (8, 12):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = validate(compose("wagma", overrides=[*TINY, f"train.max_rounds={max_steps}"]))
        summary = train(cfg, comm, Path(run_dir))  # rank 0's summary; None on the others
        runs.append((list(calls), summary["status"] if summary else None))
        calls.clear()
    return runs


def test_the_trainer_calls_an_algorithm_in_the_documented_order(tmp_path):
    results = run_world(_recorded_runs, 2, str(tmp_path), timeout_s=240)
    assert [runs[0][1] for runs in results] == ["completed", None] and results[0][1][1] == "completed"
    for rank, ((fresh, _), (resumed, _)) in enumerate(results):
        sized = [("largest_state_dict", 0)] if rank == 0 else []  # before the first step, rank 0 only
        assert fresh[: 4 if rank == 0 else 3] == [
            ("init",),
            ("end_at", 8),
            ("broadcast_initial_model",),
            *sized,
        ]
        assert [c for c in resumed if c[0] == "largest_state_dict"] == (
            [("largest_state_dict", 8)] if rank == 0 else []
        )
        fresh = [c for c in fresh if c[0] != "largest_state_dict"]
        assert fresh[:3] == [("init",), ("end_at", 8), ("broadcast_initial_model",)]
        assert not any(c[0] == "load_state_dict" for c in fresh)
        assert [c for c in fresh if c[0] == "step"] == [("step", r) for r in range(1, 9)]
        # state saved right after the step that reached a synchronisation point (every 4 rounds here)
        saved = [i for i, c in enumerate(fresh) if c[0] == "state_dict"]
        assert [fresh[i] for i in saved] == [("state_dict", 4), ("state_dict", 8)]
        assert all(fresh[i - 1] == ("step", fresh[i][1]) for i in saved)
        assert fresh[-1] == ("close", 8) and sum(c[0] == "close" for c in fresh) == 1
        assert resumed[:3] == [("init",), ("end_at", 12), ("load_state_dict", 8)]  # instead of the broadcast
        assert ("broadcast_initial_model",) not in resumed
        assert [c for c in resumed if c[0] == "step"] == [("step", r) for r in range(9, 13)]
        assert resumed[-1] == ("close", 12)
