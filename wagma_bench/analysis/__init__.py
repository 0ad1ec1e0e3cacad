"""Reading results: runs and tuning directories into tables, intervals, figures and the claims' verdicts;
pure functions over committed files, shared by report, tune, simulate, claims and reproduce/."""
