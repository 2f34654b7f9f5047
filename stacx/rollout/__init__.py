"""The rollout manager and the eval lane.

- `episode`: one attempt of one sample: sandbox -> agent loop -> verifier, as events;
  infrastructure trouble raised as `InfraFailure` (never a score);
- `manager`: the `RolloutManager` actor (work queue on TaskScheduled; groups, concurrency,
  retries, idempotency through derived episode ids and the log);
- `environments`: the Docker/pool/verifier adapter behind `episode.Environments`;
- `evaluate`: what `stacx eval` runs; `report`: its SQL.
"""
