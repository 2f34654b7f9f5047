"""Weight transport: inference engines serve the weights the trainer publishes.

- `sync`: the `WeightSync` actor (one per inference engine) loads each `WeightsPublished`
  version into its engine, through memory, a node-local shared buffer or the checkpoint file,
  and records `WeightsLoaded`; `InProcessWeights` is the in-process handoff;
- `share`: `SharedWeights`, the node-local handoff across processes (CUDA IPC or /dev/shm)
  that Ray placement uses.

The ports they serve (`LoadsState`, `WeightOffer`) are in stacx.ports; the launcher wires
them (stacx.launch.roles, stacx.launch.placement).
"""
