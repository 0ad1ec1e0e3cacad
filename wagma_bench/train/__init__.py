"""The one training loop (``trainer``): step, control exchange, evaluation, checkpoint, preemption, summary;
its small state objects (``state``: clock, counters, control flags, the evaluated model)."""
