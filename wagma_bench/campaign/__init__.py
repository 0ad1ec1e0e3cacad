"""Campaigns of many runs or many measurements: SLURM sweeps (rendered, checked before the queue, followed and
cancelled), tuning trials and their speed references, runs resumed by the scripts under reproduce/, and
comm-bench (message sizes and links timed by the ranks of one world it starts, the simulator's network model
fitted from them). They sit above the simulator and the analysis they read; the trainer never imports them:
one run's world is :mod:`wagma_bench.runtime`."""
