"""The recipe launcher, `stacx run RECIPE`: recipe schema and loading, the placement plan, the role
builders (where concrete engines are built and wired to each other's ports), placement, and the
launcher that drives one run. The actors it wires live in stacx.schedule, stacx.weights and
stacx.store.query.
"""
