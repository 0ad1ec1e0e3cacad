"""wagma-bench: benchmark and reproduction suite for communication-efficient distributed training."""

__version__ = "0.1.0"
