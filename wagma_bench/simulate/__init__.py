"""``wagma-bench simulate``: discrete-event predictions of every optimizer's throughput and time-to-target.

The model:

- :mod:`.costs`        alpha-beta costs of the collectives (ring, recursive doubling, tree) per link level
- :mod:`.des`          the simulator: the trainer's loop and each optimizer's communication, round by round
- :mod:`.presets`      each workload's cost model (step time, batch, parameters) as the paper's set-up has it
- :mod:`.calibrate`    fits compute-time distributions and alpha/beta from real runs and comm-bench JSON
- :mod:`.spread`       compute-time spread with persistent rank offsets; :mod:`.measured` the measured inputs
- :mod:`.uncertainty`  predictions with their inputs resampled, and with one assumption moved at a time

What the command does with it (``wagma_bench/cli/simulate.py`` parses the command line and calls these):

- :mod:`.request`      the command line sorted; :mod:`.configure` what each simulation is given
- :mod:`.predict`      the predictions; :mod:`.compare` ``--calibrate``: predicted against measured
- :mod:`.convergence`  samples to the target; :mod:`.run_spread` ``--compute-from``: the spread of real runs
- :mod:`.interval`     ``--interval``; :mod:`.outputs` tables and figures; :mod:`.progress` progress lines
"""
