"""DD-PPO point-goal navigation: the workload (:mod:`wagma_bench.workloads.ddppo.workload`), its policy, PPO
and environments. The package imports nothing itself, so that the configuration check reads the environments'
settings (:mod:`wagma_bench.workloads.ddppo.envs`) without torch."""
