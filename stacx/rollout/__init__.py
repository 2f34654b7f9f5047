"""The rollout manager, the episode runner and the eval report.

- `episode`: one attempt of one sample: sandbox -> agent loop -> verifier, as events;
  infrastructure trouble raised as `InfraFailure` (never a score);
- `manager`: the `RolloutManager` actor (work queue on TaskScheduled; groups, concurrency,
  retries, idempotency through derived episode ids and the log);
- `report`: the eval report's SQL (`stacx eval` is a preset over the launcher:
  stacx.launch.presets; the Docker adapter is stacx.sandbox.environments).
"""
