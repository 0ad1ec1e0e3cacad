"""DD-PPO point-goal navigation (:mod:`wagma_bench.workloads.ddppo.workload`). The package imports nothing itself:
its environments' settings are read by the configuration check without torch (``DDPPOWorkload`` is loaded on
its first use, PEP 562)."""


def __getattr__(name: str):
    if name == "DDPPOWorkload":
        from wagma_bench.workloads.ddppo.workload import DDPPOWorkload

        return DDPPOWorkload
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
