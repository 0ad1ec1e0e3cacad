"""Starting runs and keeping them honest: the launcher (local ranks, torchrun, SLURM, mpirun), supervision of
ranks and hosts, SLURM signals and requeue, the start-up record, SLURM sweeps and tuning campaigns, comm-bench."""
