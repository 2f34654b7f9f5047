"""Harbor in one room: its task format (`model`, `tasks`, `jsonl_tasks`, `compose_load`,
`task_network`; no Docker or NATS), its dataset `registry`, and its job directories both ways
(`jobs`, `job_import`). Running a task is stacx.sandbox's.
"""
