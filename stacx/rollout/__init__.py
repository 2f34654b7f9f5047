"""The rollout manager (`manager`: TaskScheduled -> scored groups), the episode runner (`episode`:
one attempt as events, infrastructure trouble raised as `InfraFailure`) and the eval report's SQL
(`report`).
"""
