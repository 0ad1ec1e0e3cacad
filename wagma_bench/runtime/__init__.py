"""One run's world: the launcher (local ranks, torchrun, SLURM, mpirun), supervision of ranks and hosts, SLURM
signals and requeue, the start-up record. The trainer imports it; campaigns of many runs are
:mod:`wagma_bench.campaign`."""
