"""Harbor in one room: its task format, its dataset registry and its job directories.

The task format (what a task directory says; no Docker, no NATS):
- model         task.toml as frozen Structs and `Task` (stacx.ports re-exports `Task`)
- tasks         loading and checking a task directory, task sets, step views, limits
- jsonl_tasks   task sets as JSON lines and the light answer-task format
- compose_load  a task's docker-compose.yaml read as the Compose specification defines it
- task_network  a task's network policy per phase, checked at load

Interop (above the engines; `stacx export harbor`, `stacx import`, `stacx tasks download`):
- registry      Harbor's dataset registry
- jobs          a run exported as a Harbor job directory; pass@k
- job_import    a Harbor job directory imported as events

Running a task (build, sandboxes, verifier) is the sandbox engine's: stacx.sandbox.
"""
