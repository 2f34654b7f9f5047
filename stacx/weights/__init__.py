"""Weight transport: inference engines serve the weights the trainer publishes (`sync`: the
`WeightSync` actor and the in-process handoff; `share`: the node-local cross-process handoff).
"""
