"""Writers and readers of a run's files: events and step logs, the run directory's lock and summary,
checkpoint sets, W&B and MLPerf sinks, progress lines and CPU accounting. Every figure a report shows comes
from here."""
