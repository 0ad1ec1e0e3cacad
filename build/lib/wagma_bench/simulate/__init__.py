"""``wagma-bench simulate``: discrete-event predictions of every optimizer's throughput and time-to-target.

- :mod:`.costs`      alpha-beta cost models of the collectives (ring, recursive doubling, tree) per link level
- :mod:`.des`        the simulator: the trainer's loop and each optimizer's communication, round by round
- :mod:`.calibrate`  fits compute-time distributions and alpha/beta from real runs and comm-bench JSON
- :mod:`.cli`        the command line (tables, plots, CSV/JSON)
"""
