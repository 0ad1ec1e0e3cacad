"""Configuration: the schemas and allowed values of every setting (``schema``), where ``conf/`` is
(``paths``), the command line's override grammar (``overrides``), search spaces, and the schedules that follow
from the settings."""
