"""When a package's release was published, from the package index's own JSON (PEP 691/700).

The time bounds which Shardy commit a jaxlib can have been built with: jaxlib records the JAX commit
it was built from (`jaxlib.version._git_hash`), not its Shardy's, and that pin lives in XLA's tree,
which a release check run without GitHub cannot read.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime

INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json"


def upload_time(package: str, version: str, index: str = INDEX) -> datetime:
    """The earliest upload time of `package==version`'s files."""
    request = urllib.request.Request(f"{index}/{package}/", headers={"Accept": _ACCEPT})
    with urllib.request.urlopen(request, timeout=60) as response:
        listing = json.load(response)
    return release_time(listing, package, version)


def release_time(listing: dict, package: str, version: str) -> datetime:  # type: ignore[type-arg]
    """From the index's JSON listing: the earliest `upload-time` of the version's files."""
    prefix = f"{package.replace('-', '_')}-{version}"
    times = [
        datetime.fromisoformat(f["upload-time"].replace("Z", "+00:00"))
        for f in listing.get("files", [])
        if f.get("upload-time") and f["filename"].startswith((f"{prefix}-", f"{prefix}.tar"))
    ]
    if not times:
        raise ValueError(f"the index lists no upload time for {package}=={version}")
    return min(times)
