"""Streaming DiLoCo against torchft's own ``DiLoCo`` (torchft 0.2.0, ``torchft/local_sgd.py``), the reference
implementation: the same two-layer model, inner AdamW, data, fragments (one layer each), H = 4, tau = 1 and
alpha = 0.5, 12 inner steps. torchft runs its two replicas as threads with its own Lighthouse and Managers
over gloo; ours is local SGD with ``outer=nesterov`` and fragments on a real 2-rank gloo world whose data
plane refuses what NCCL refuses. The models agree to float32 rounding: torchft's outer step is torch's
``SGD(nesterov=True)`` from the global parameters, ours the same recursion written from the average
(``optim/outer.py``), so the two round differently in the last bits."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
from torch import nn

from tests.optim_util import flat_params, make_algorithm, run_world
from wagma_bench.errors import ConfigError
from wagma_bench.optim.streaming import fragments_of, sync_at

STEPS, PERIOD, DELAY, ALPHA, LR, OUTER_LR, OUTER_MOMENTUM = 12, 4, 1, 0.5, 1e-2, 0.7, 0.9


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def _ours(comm):
    model = _model()
    algo = make_algorithm(
        "local_sgd",
        comm,
        model,
        lambda params: torch.optim.AdamW(params, lr=LR),
        sync_period=PERIOD,
        outer="nesterov",
        outer_lr=OUTER_LR,
        outer_momentum=OUTER_MOMENTUM,
        fragments=2,
        fragment_delay=DELAY,
        fragment_alpha=ALPHA,
    )
    algo.broadcast_initial_model()
    g = torch.Generator().manual_seed(comm.rank)
    for _ in range(STEPS):
        x = torch.randn(8, 4, generator=g)
        algo.zero_grad()
        model(x).pow(2).mean().backward()
        algo.step()
    return flat_params(model)


def _torchft_replica(rid: int, lighthouse: str, model: nn.Sequential) -> torch.Tensor:
    import torch.distributed as dist
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    inner = torch.optim.AdamW(model.parameters(), lr=LR)
    outers = [
        torch.optim.SGD(f.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True) for f in model
    ]
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=30)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=2,
        use_async_quorum=False,
        load_state_dict=lambda sd: model.load_state_dict(sd["m"]),
        state_dict=lambda: {"m": model.state_dict()},
        replica_id=str(rid),
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        port=0,
        init_sync=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
    )
    g = torch.Generator().manual_seed(rid)
    try:
        with DiLoCo(
            manager,
            list(model),
            inner,
            outers,
            sync_every=PERIOD,
            fragment_sync_delay=DELAY,
            fragment_update_alpha=ALPHA,
        ):
            for _ in range(STEPS):
                x = torch.randn(8, 4, generator=g)
                inner.zero_grad()
                model(x).pow(2).mean().backward()
                inner.step()
    finally:
        manager.shutdown(wait=False)
    return flat_params(model)


def test_streaming_diloco_agrees_with_torchfts_diloco():
    from torchft._torchft import LighthouseServer

    ours = run_world(_ours, 2, emulate="nccl")  # the data plane refuses what NCCL refuses
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    # built here, one after the other: _model() seeds torch's global generator, which two replica threads
    # building theirs at once would interleave (each replica then starts from other weights)
    models = [_model() for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            theirs = list(
                pool.map(lambda rid: _torchft_replica(rid, lighthouse.address(), models[rid]), [0, 1])
            )
    finally:
        lighthouse.shutdown()
    start = flat_params(_model())
    for rank in (0, 1):
        assert not torch.equal(ours[rank], start)  # it trained
        torch.testing.assert_close(ours[rank], theirs[rank], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours[0], ours[1])  # alpha keeps each rank's own steps: the ranks differ


def test_the_schedule_prepares_tau_steps_before_each_fragment_performs():
    events = {t: sync_at(t, 8, 2, 1) for t in range(1, 17)}
    assert {t: e for t, e in events.items() if e} == {
        3: ("prepare", 0),
        4: ("perform", 0),
        7: ("prepare", 1),
        8: ("perform", 1),
        11: ("prepare", 0),
        12: ("perform", 0),
        15: ("prepare", 1),
        16: ("perform", 1),
    }
    assert fragments_of([16, 4, 16, 4], 2) == [
        [0, 1],
        [2, 3],
    ]  # one Linear layer each, as torchft's fragments


def test_more_fragments_than_parameter_tensors_are_refused_naming_both():
    """A fragment is one or more whole tensors: 10,000 fragments of a 4-tensor model would be empty syncs."""
    from wagma_bench.optim.local_sgd import LocalSGD
    from wagma_bench.optim.streaming import StreamingOuter

    settings = LocalSGD.Settings(sync_period=10000, outer="nesterov", fragments=10000)
    params = [p.detach() for p in _model().parameters()]
    with pytest.raises(
        ConfigError,
        match=rf"optimizer.fragments=10000 is not allowed .* it has {len(params)} "
        rf"parameter tensors.*choose at most {len(params)}",
    ):
        StreamingOuter(settings, params, comm=None)


@pytest.mark.slow
def test_a_run_with_more_fragments_than_tensors_is_refused_by_its_ranks_in_one_line(tmp_path):
    """The embedded ResNet's tensor count is known only where the model is built: the ranks refuse, each in
    one line, and the launcher ends the run naming the setting and the count (no traceback)."""
    from tests.cli_util import run

    res = run(
        [
            "optimizer=local_sgd",
            "optimizer.outer=nesterov",
            "optimizer.fragments=10000",
            "optimizer.sync_period=10000",
            "train.max_rounds=10000",
            "launcher.nproc=2",
            f"hydra.run.dir={tmp_path}",
        ],
        timeout=300,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert (
        "refused the run: optimizer.fragments=10000 is not allowed for this model: it has 65 parameter"
        in last
    )
    assert "Traceback" not in res.stderr
