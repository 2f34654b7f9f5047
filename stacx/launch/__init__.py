"""The recipe launcher: `stacx run RECIPE` (see stacx.cli.run). Recipe, wiring and placement only.

recipe.py (the schema) <- loader.py (TOML, --set, errors, diff) <- plan.py (roles, resources)
<- roles.py / engines.py (the real role builders: where concrete engines are built and wired
to each other's ports) <- placement.py (local | ray) <- launcher.py (one run: resume checks,
RunContext, roles, the scheduler, progress.py, metrics.py, plot.py).

The actors it wires live in their own rooms: the scheduler (what to roll out next) in
stacx.schedule, weight sync in stacx.weights, the SQL service for Ray actors in stacx.store.query.
"""
