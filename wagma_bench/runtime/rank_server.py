"""What the local ranks' fork server imports before it forks any rank (multiprocessing's forkserver preload,
:func:`wagma_bench.runtime.launch.start_rank_server`): importing this module is the preload.

Every local rank needs torch, ``torch._dynamo`` (torch's optimizers import it on their first call) and the
suite; each rank importing them itself took 4-5 s of CPU. Only modules that start no thread and touch no
device are imported: a fork copies no thread. The cyclic collector is off while they import, and what they
made is frozen afterwards (``gc.freeze``), as Python's documentation of ``gc.freeze`` advises for a server
that forks without exec: the imports make no garbage cycles worth a collection (the collector's passes took
0.45 of the 2.7 CPU-seconds of these imports here), and a rank's collections then never walk, nor copy, the
server's objects.

The local launcher only names it (importing it there would import torch); a rank of an external launcher's
world (torchrun, srun, mpiexec) imports it first thing (``wagma-bench run``).
"""

import gc
import importlib

RANK_MODULES = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "wagma_bench.train.trainer",
    "wagma_bench.comm.torch_dist",
    "wagma_bench.optim.registry",
    "wagma_bench.workloads.resnet",
    "wagma_bench.train.rank",
)

gc.disable()
try:
    for name in RANK_MODULES:
        importlib.import_module(name)
finally:
    gc.freeze()
    gc.enable()
