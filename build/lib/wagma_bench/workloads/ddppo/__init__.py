"""DD-PPO point-goal navigation: environments (``envs/``), the policy, PPO, preemption, the workload."""

from wagma_bench.workloads.ddppo.workload import DDPPOWorkload

__all__ = ["DDPPOWorkload"]
