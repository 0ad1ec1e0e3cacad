"""The one training loop (``trainer``): step, control exchange, evaluation, checkpoint, preemption, summary."""
