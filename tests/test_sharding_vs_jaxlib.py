"""Sharding text: printing and equality agree with jaxlib's own HloSharding.

Every distinct sharding string in the corpus (the dumps, XLA's recorded
decisions in the truth files) and in XLA's propagation test cases is read by
both; the canonical text must match and so must equality between any two.
"""

from __future__ import annotations

import itertools
import json
import random
import re

import numpy as np
import pytest
from conftest import corpus_hlo_files, truth_files, xla_cases

from planner import HloParseError, parse_hlo
from planner.sharding import parse_sharding

pytestmark = pytest.mark.xla


def _strings_in_json(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value.startswith("{") and ("replicated" in value or "devices" in value
                                                       or "manual" in value or "maximal" in value
                                                       or "unknown" in value) else []  # fmt: skip
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings_in_json(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings_in_json(v)]
    return []


def _distinct_sharding_strings() -> list[str]:
    found: set[str] = set()
    texts = [p.read_text() for p in corpus_hlo_files()] + [c["hlo"] for c in xla_cases()]
    for text in texts:
        for comp in parse_hlo(text).computations:
            for inst in comp.instructions:
                for attribute in inst.attributes:
                    if attribute.key == "sharding":
                        found.add(attribute.text)
    for case in xla_cases():
        found.update(case["expect"].values())
    for path in truth_files():
        found.update(_strings_in_json(json.loads(path.read_text())))
    return sorted(found)


STRINGS = _distinct_sharding_strings()


def _jaxlib():
    from jax._src.lib import xla_client

    return xla_client.HloSharding


def test_there_are_many_distinct_strings() -> None:
    assert len(STRINGS) > 200


@pytest.mark.parametrize("text", STRINGS)
def test_canonical_text_matches_jaxlib(text: str) -> None:
    theirs = _jaxlib().from_string(text)
    ours = parse_sharding(text)
    assert ours.to_text() == str(theirs)
    # Printing with metadata reads back to an equal sharding.
    assert parse_sharding(ours.to_text(include_metadata=True)) == ours


def test_equality_matches_jaxlib_on_every_pair() -> None:
    hlo_sharding = _jaxlib()
    ours = [parse_sharding(t) for t in STRINGS]
    theirs = [hlo_sharding.from_string(t) for t in STRINGS]
    disagreements = [
        (STRINGS[i], STRINGS[j])
        for i, j in itertools.combinations(range(len(STRINGS)), 2)
        if (ours[i] == ours[j]) != (theirs[i] == theirs[j])
    ]
    assert disagreements == []
    # Equal shardings hash alike (they key dictionaries in propagation).
    for i, j in itertools.combinations(range(len(STRINGS)), 2):
        if ours[i] == ours[j]:
            assert hash(ours[i]) == hash(ours[j])


def _random_tiled_strings(seed: int, count: int) -> list[str]:
    """Tiled shardings over random meshes, written as iota, list or shuffled list."""
    rng = random.Random(seed)

    def factors(n: int) -> list[int]:
        out = []
        while n > 1:
            d = rng.choice([d for d in range(2, n + 1) if n % d == 0])
            out.append(d)
            n //= d
        return out or [1]

    suffixes = ["", " last_tile_dim_replicate", " last_tile_dims={manual}", " last_tile_dims={replicated}",
                " last_tile_dims={replicated, manual}", " last_tile_dims={manual, replicated}",
                " last_tile_dims={manual, manual}", " last_tile_dims={replicated, replicated}"]  # fmt: skip
    out = []
    while len(out) < count:
        n = rng.choice([4, 8, 12, 16, 32])
        reshape = factors(n)
        perm = list(range(len(reshape)))
        rng.shuffle(perm)
        dims = factors(n)
        if rng.random() < 0.3:
            dims.insert(rng.randrange(len(dims) + 1), 1)
        suffix = rng.choice(suffixes)
        if len(dims) <= (suffix.count(",") + 1 if suffix else 0):
            continue
        form = rng.choice(["iota", "list", "shuffled"])
        if form == "iota":
            devices = "<=[" + ",".join(map(str, reshape)) + "]"
            if len(reshape) > 1:
                devices += "T(" + ",".join(map(str, perm)) + ")"
        else:
            ids = np.arange(n).reshape(reshape).transpose(perm).reshape(-1)
            if form == "shuffled":
                ids = np.random.RandomState(len(out)).permutation(n)
            devices = ",".join(map(str, ids))
        group = rng.choice(["", " shard_as 2", " shard_like 0"])
        out.append("{devices=[" + ",".join(map(str, dims)) + "]" + devices + suffix + group + "}")
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_canonicalisation_matches_jaxlib_on_generated_shardings(seed: int) -> None:
    """Partial-tile sorting, subgroup merging and iota canonical forms, 1,500 at a time."""
    hlo_sharding = _jaxlib()
    mismatches = []
    for text in _random_tiled_strings(seed, 1500):
        try:
            theirs = str(hlo_sharding.from_string(text))
        except Exception:
            theirs = None
        try:
            ours = parse_sharding(text).to_text()
        except HloParseError:
            ours = None  # then XLA must reject it too
        if ours != theirs:
            mismatches.append((text, theirs, ours))
    assert mismatches == []


def test_truth_files_hold_tuple_shardings_with_index_comments() -> None:
    """Tuple shardings in XLA's output print `/*index=5*/` markers; we read and print them."""
    tuples = [s for s in STRINGS if s.startswith("{{") and "/*index=5*/" in s]
    assert tuples
    for text in tuples[:20]:
        assert parse_sharding(text).to_text() == re.sub(r"\s+metadata=\{[^{}]*\}", "", text)
