"""Per-role NATS users with subject permissions for a many-host deployment (a nats-server
``authorization`` block): a ``worker`` sees only its run's subjects and stream, a ``service`` only
its own requests, an ``admin`` may stop and gc; each user reads only its own reply inbox. Subject
names are stacx.events' and stacx.sandbox.remote_wire's (tests/backbone/test_nats_auth.py).
Design: docs/sandboxes.md#remote-sandboxes-stacx-sandbox-serve
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
