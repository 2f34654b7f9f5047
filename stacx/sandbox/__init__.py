"""The environment engine: where Harbor tasks run. Backends (Docker, process, remote), the
sandbox service, networking (egress, the allowlist proxy) and verification; the task format
itself (task.toml, task sets, compose files) is read by stacx.harbor.

Modules (import what you use; this package imports nothing heavy):

- docker    DockerSandbox (aiodocker), the Docker backend of the Sandbox port (stacx.ports:
            Sandbox, ExecResult, Limits)
- pool      SandboxPool: warm containers per (image, limits), destroyed after use
- aliases   base-image alias map (FROM ubuntu:24.04 -> stacx/base:bookworm)
- standins  offline stand-ins rebuilt from a package registry (uv's images, from PyPI)
- images    the offline base image (debootstrap + docker import)
- build     task images cached by content hash
- verifier  run tests/test.sh, parse reward.txt / reward.json into a Verdict (or a failure kind)
- health    a task's healthcheck
- steps     a multi-step task's per-step setup (workdir/, setup.sh, the step's healthcheck)
- environments  the `Environments` port over Docker (build, pool, healthcheck, verifier)
- process   ProcessSandbox: the process backend (temp root, rlimits, namespaces), no Docker
- containment  what the machine allows (namespaces), the sandbox root, a command's rlimits
- spawner, spawner_main  the process sandbox's spawner: commands forked from a small process
            in the sandbox's namespaces, never from the caller (STYLE principle 21)
- process_environments  the `Environments` port over process sandboxes (image-less tasks)
- gc        find and remove orphaned sandbox containers
- service   `stacx sandbox serve`: this host's sandboxes over NATS request/reply
- remote    RemoteSandbox / RemoteEnvironments: the ports over sandbox services (backend "remote")
- remote_wire  the service's subjects, messages, tokens and chunking
- remote_hosts  the live services seen from a client: placement, host-lost detection
- cgroups   OOM-kill and pids-limit counters of a container
- output    bounded capture of a command's output
- archive   tar archives for uploads
- compose   a task's docker-compose.yaml run through the Docker API (read by
            stacx.harbor.compose_load)
- egress, egress_proxy  network_mode = "allowlist": the per-episode network and its proxy

An episode, as the rollout engine drives it (stacx.rollout.episode.run_episode, through the
`Environments` port; DockerEnvironments does the build, pool and healthcheck)::

    async with envs.sandbox(task, episode_id=eid) as sandbox:  # InfraFailure(IMAGE_BUILD|START)
        ... agent: await sandbox.exec(cmd, timeout=...) ...     # SandboxError -> EXEC_TRANSPORT
        verdict = await envs.verify(sandbox, task, episode_id=eid)  # Verdict | InfraFailure
    # run_episode records RewardAssigned; the rollout manager records an InfraFailure as InfraFailed
"""
