"""The recipe launcher: `stacx run RECIPE` (see stacx.cli.run).

recipe.py (the schema) <- loader.py (TOML, --set, errors, diff) <- plan.py (roles, resources)
<- roles.py / engines.py / weights.py (the real role builders: where concrete engines are built
and wired to each other's ports; weights.py keeps inference engines on the trainer's weights)
<- placement.py (local | ray; query.py serves SQL to Ray actors) <- launcher.py (one run: resume checks, RunContext, roles, scheduler,
progress.py, metrics.py, plot.py). The scheduler it spawns (what to roll out next, from the
log) lives in stacx.schedule.
"""
