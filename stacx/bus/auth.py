"""Per-role NATS users with subject permissions, for a many-host deployment (a nats-server
``authorization`` block; see README "Many machines").

Roles and what each may do:
- ``worker(run_id)``: a rollout worker / launcher of one run. Publishes the run's events
  (``stacx.<run>.>``) and uses JetStream only on the run's stream (``STACX_<run>``: create,
  info, its consumers, acks); requests sandboxes on any service's subject *for its run*
  (``stacx.sandbox.svc.*.run.<run>``) and finds services (discover, adverts). It cannot read
  another run's subjects or stream, nor send admin requests (stop, gc) to any service.
- ``service(service_id)``: a sandbox service. Receives its own requests
  (``stacx.sandbox.svc.<id>.>``) and discover, publishes adverts, and answers requests
  (``allow_responses``: only to the reply subject of a request it received).
- ``admin``: `stacx sandbox hosts|ls|stats|stop|gc`: admin requests to every service.

Each user's replies come to its own inbox prefix (``_INBOX_<user>``; a client is told with
$STACX_NATS_INBOX), so no user can subscribe to the replies meant for another: a reply to a
worker's read_file carries the sandbox's bytes.

The subject names are those of stacx.events (``subject``, ``stream_name``) and
stacx.sandbox.remote_wire (checked equal by tests/backbone/test_nats_auth.py).
"""

from __future__ import annotations

import json

ENV_INBOX = "STACX_NATS_INBOX"
SANDBOX = "stacx.sandbox"


def _token(name: str) -> str:  # as remote_wire.subject_token
    import re

    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


def inbox(user: str) -> str:
    return f"_INBOX_{_token(user)}"


def _js(stream: str) -> list[str]:
    api = "$JS.API"
    return [
        f"{api}.INFO",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.CREATE.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
    ]


def worker(user: str, password: str, run_id: str) -> dict[str, object]:
    stream = f"STACX_{run_id}".replace("-", "_")  # stacx.events.stream_name
    return {
        "user": user,
        "password": password,
        "permissions": {
            "publish": {
                "allow": [
                    f"stacx.{run_id}.>",
                    *_js(stream),
                    f"{SANDBOX}.discover",
                    f"{SANDBOX}.svc.*.run.{_token(run_id)}",
                ]
            },
            "subscribe": {"allow": [f"{inbox(user)}.>", f"{SANDBOX}.advert"]},
        },
    }


def service(user: str, password: str, service_id: str) -> dict[str, object]:
    return {
        "user": user,
        "password": password,
        "permissions": {
            "publish": {"allow": [f"{SANDBOX}.advert"]},
            "subscribe": {
                "allow": [
                    f"{SANDBOX}.svc.{_token(service_id)}.>",
                    f"{SANDBOX}.discover",
                    f"{inbox(user)}.>",
                ]
            },
            "allow_responses": True,
        },
    }


def admin(user: str, password: str) -> dict[str, object]:
    return {
        "user": user,
        "password": password,
        "permissions": {
            "publish": {"allow": [f"{SANDBOX}.svc.*.admin", f"{SANDBOX}.discover"]},
            "subscribe": {"allow": [f"{inbox(user)}.>", f"{SANDBOX}.advert"]},
        },
    }


def authorization_block(users: list[dict[str, object]]) -> str:
    """The nats-server config text of these users (JSON is valid nats-server config)."""
    return "authorization " + json.dumps({"users": users}, indent=2)
