"""docker/compose.yaml is a team's deployment: read it and check that its parts fit together.

No container engine runs here; the image's steps are run by tests/test_docker_steps.py. What this
checks is what a typo would break: both replicas on the one PostgreSQL the compose file starts, with
its credentials; jobs on its Ray head's client port; readiness-gated health checks; the load balancer
sending to both replicas; and every setting the file sets is one the service reads.
"""

from __future__ import annotations

import re

import yaml
from conftest import REPO

from api.settings import Settings
from api.store import database_url

COMPOSE = REPO / "docker" / "compose.yaml"
NGINX = REPO / "docker" / "nginx.conf"


def test_two_replicas_share_the_composed_postgresql_and_ray_head() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    replicas = {name: s for name, s in services.items() if name.startswith("planner-")}
    assert len(replicas) == 2
    db = services["db"]["environment"]
    head = services["ray-head"]["command"]
    client_port = next(int(a.split("=")[1]) for a in head if a.startswith("--ray-client-server-port="))
    for name, replica in replicas.items():
        env = replica["environment"]
        url = env["SPMD_PLANNER_DB"]
        assert database_url(url).startswith("postgresql+psycopg://"), name
        assert url == f"postgresql://{db['POSTGRES_USER']}:{db['POSTGRES_PASSWORD']}@db:5432/{db['POSTGRES_DB']}"
        assert env["SPMD_PLANNER_RAY_ADDRESS"] == f"ray://ray-head:{client_port}"
        assert replica["build"]["args"]["WITH_RAY"] == "true" and "/readyz" in " ".join(replica["healthcheck"]["test"])
        assert replica["depends_on"]["db"]["condition"] == "service_healthy"
        # Every setting is one the service reads (pydantic would ignore a misspelt one silently).
        fields = {f"SPMD_PLANNER_{k.upper()}" for k in Settings.model_fields}
        assert set(env) <= fields, set(env) - fields


def test_the_load_balancer_sends_to_both_replicas_and_streams_events_unbuffered() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    conf = NGINX.read_text()
    upstream = re.search(r"upstream planner \{([^}]*)\}", conf)
    assert upstream is not None
    targets = re.findall(r"server (\S+):8000", upstream.group(1))
    assert sorted(targets) == sorted(n for n in services if n.startswith("planner-"))
    events = re.search(r"location ~ \^/jobs/\[\^/\]\+/events\$ \{([^}]*)\}", conf)
    assert events is not None and "proxy_buffering off;" in events.group(1)
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in services["lb"]["volumes"]
