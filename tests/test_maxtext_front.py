"""`spmd-planner maxtext`: MaxText's train steps planned in MaxText's terms.

The steps are MaxText 0.2.5's own (`tests/fixtures/maxtext`, compiled by libtpu 0.0.52 with `train_compile`, seven
models dense and MoE from 4 to 256 chips); each is planned as the front plans what it lowers, and its report is
read as a MaxText user reads it: the mesh as `ici_*_parallelism` keys with no axis of size 1, parameters by their
path in MaxText's params tree, the verdict XLA:TPU gave, next steps as overrides `train_compile` takes, no line
over 200 characters. `next_steps/` holds the front's next steps applied and compiled by `train_compile`
(`python -m fidelity.maxtext_next_steps`): each predicted verdict is the one XLA:TPU gave.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import re
import subprocess
import sys

import pytest
from conftest import REPO

from planner import parse_hlo
from scan_runtime.maxtext.next_steps import MaxTextNextStep, more_chips, smaller_batch
from scan_runtime.maxtext.planning import plan_step
from scan_runtime.maxtext.report import render
from scan_runtime.maxtext.terms import MAX_LINE, MaxTextStep, parameter_name, topology_chips, topology_of

FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
STEPS = [
    "libtpu_0_0_52/maxtext_llama3-8b_L32_v6e-8_shardy",
    "libtpu_0_0_52/maxtext_mixtral-8x7b_L16_v5p-8_shardy",  # refused by XLA:TPU
    "libtpu_0_0_52/maxtext_qwen3-30b-a3b_L2_v5p-16_shardy",
    "libtpu_0_0_52/maxtext_deepseek2-16b_L2_v6e-16_shardy",
    "libtpu_0_0_52/maxtext_gemma2-9b_L42_v6e-16_shardy",
    "libtpu_0_0_52/maxtext_llama2-70b_L80_v5p-128_shardy",
    "libtpu_0_0_52/maxtext_llama3.1-405b_L126_v6e-256_shardy",  # refused by XLA:TPU
]
NEXT_STEPS = sorted((FIXTURES / "next_steps").glob("*.json"))
# MaxText 0.2.5's base.yml values for the keys a record's overrides do not set.
BASE = {"per_device_batch_size": "12", "gradient_accumulation_steps": "1", "remat_policy": "full",
        "max_target_length": "2048"}  # fmt: skip


def _maxtext_step(record: dict) -> MaxTextStep:
    values = BASE | dict(o.split("=", 1) for o in record["overrides"])
    return MaxTextStep(
        config="maxtext/configs/base.yml",
        overrides=(f"model_name={record['model']}", f"compile_topology={record['topology']}", *record["overrides"]),
        model_name=record["model"],
        topology=record["topology"],
        num_slices=1,
        per_device_batch_size=float(values["per_device_batch_size"]),
        gradient_accumulation_steps=int(values["gradient_accumulation_steps"]),
        remat_policy=values["remat_policy"],
        max_target_length=int(values["max_target_length"]),
    )


@pytest.fixture(scope="module", params=STEPS, ids=[s.split("/")[-1] for s in STEPS])
def planned(request: pytest.FixtureRequest) -> tuple[dict, MaxTextStep, list[str]]:
    record = json.loads((FIXTURES / f"{request.param}.xla.json").read_text())
    step = _maxtext_step(record)
    module = parse_hlo(gzip.decompress((FIXTURES / f"{request.param}.hlo.gz").read_bytes()).decode())
    return record, step, render(plan_step(module, step, libtpu=record["libtpu"]), [])


def test_every_line_is_short(planned: tuple[dict, MaxTextStep, list[str]]) -> None:
    _, _, lines = planned
    assert max(len(line) for line in lines) <= MAX_LINE


def test_the_mesh_is_said_in_maxtext_keys_without_axes_of_size_1(planned: tuple[dict, MaxTextStep, list[str]]) -> None:
    _, step, lines = planned
    head = lines[0]
    assert head.startswith(f"MaxText {step.model_name} on {step.topology} ({step.chips} chips)")
    sizes = [int(v) for v in re.findall(r"ici_\w+_parallelism=(\d+)", head)]
    assert sizes and min(sizes) > 1 and math.prod(sizes) == step.chips
    assert "diloco" not in head and "=1 " not in head + " "


def test_the_verdict_is_xla_tpu_s(planned: tuple[dict, MaxTextStep, list[str]]) -> None:
    record, _, lines = planned
    verdict = next(line for line in lines if line.startswith("  verdict: "))
    refused = "oom" in record["tpu"]
    assert verdict.startswith("  verdict: does not fit" if refused else "  verdict: fits")


def test_parameters_are_named_by_their_path_in_maxtext_s_params(planned: tuple[dict, MaxTextStep, list[str]]) -> None:
    _, _, lines = planned
    held = "\n".join(line for line in lines if line.startswith("    parameters ") or line.startswith("    AdamW"))
    assert "state[" not in held and ".value" not in held
    assert re.search(r"parameters [\d.,]+ [KMG]iB: (decoder|token_embedder)/", held)


def test_topology_names_count_chips_as_maxtext_does() -> None:
    assert topology_chips("v6e-8") == 8 and topology_chips("v5p-16") == 8 and topology_chips("v5e-256") == 256
    assert topology_of("v6e", 16) == ("v6e-16", 1)
    assert topology_of("v6e", 512) == ("v6e-256", 2)  # past one pod: two slices
    assert topology_of("v5p", 64) == ("v5p-128", 1)


def test_parameter_names_are_maxtext_s() -> None:
    kernel = "state['model']['decoder']['layers']['mlp']['wi_0']['kernel'].value"
    assert parameter_name(kernel) == "decoder/layers/mlp/wi_0/kernel"
    mu = "state['optimizer']['opt_state'][0]['mu']['decoder']['logits_dense']['kernel'].value"
    assert parameter_name(mu) == "Adam mu of decoder/logits_dense/kernel"
    assert parameter_name("gradient of " + kernel) == "gradient of decoder/layers/mlp/wi_0/kernel"
    assert parameter_name("params['wq']") == "params['wq']"


def test_more_chips_keep_the_global_batch_and_a_smaller_batch_stops_at_one_row() -> None:
    step = _maxtext_step({"model": "llama3-8b", "topology": "v6e-128", "overrides": ["per_device_batch_size=2"]})
    assert more_chips(step, {"fsdp": 128}, 2) == [
        "compile_topology=v6e-256", "compile_topology_num_slices=1", "ici_fsdp_parallelism=256",
        "per_device_batch_size=1",
    ]  # fmt: skip
    assert more_chips(step, {"fsdp": 128}, 4) == [
        "compile_topology=v6e-256", "compile_topology_num_slices=2", "dcn_fsdp_parallelism=2",
        "ici_fsdp_parallelism=256", "per_device_batch_size=0.5",
    ]  # fmt: skip
    assert smaller_batch(step, 4) == ["per_device_batch_size=0.5"]
    assert smaller_batch(step, 512) is None  # 128 chips x 1/256 of a row


def _recorded(path) -> tuple[dict, MaxTextStep]:  # type: ignore[no-untyped-def]
    record = json.loads(path.read_text())
    facts = record["maxtext"]
    return record, MaxTextStep(**{**facts, "overrides": tuple(facts["overrides"])})


@pytest.mark.parametrize("path", NEXT_STEPS, ids=[p.stem for p in NEXT_STEPS])
def test_next_steps_compiled_by_train_compile_give_the_verdict_planned(path) -> None:  # type: ignore[no-untyped-def]
    """Each next step is MaxText's step lowered with its overrides (kept here) and planned: planned again it gets
    the recorded verdict, and XLA:TPU, compiling that step with `train_compile`, gave the same one."""
    record, step = _recorded(path)
    compiled = [s for s in record["next_steps"] if "xla_fits" in s]
    assert compiled and record["call"] == "does not fit"
    assert any(s["reported"] and s["predicted_call"] == "fits" for s in compiled)
    for s in compiled:
        values = dict(o.split("=", 1) for o in s["overrides"])
        candidate = MaxTextStep(
            **{**record["maxtext"], "overrides": tuple(record["maxtext"]["overrides"]),
               "topology": values.get("compile_topology", step.topology),
               "per_device_batch_size": float(values.get("per_device_batch_size", step.per_device_batch_size))}
        )  # fmt: skip
        module = parse_hlo(gzip.decompress((path.parent / s["hlo"]).read_bytes()).decode())
        plan = plan_step(module, candidate, libtpu=s["libtpu"], holders=False).plan
        assert plan.verdict is not None and plan.verdict.call_after == s["predicted_call"]
        if s["predicted_call"] != "too close to call":
            assert (s["predicted_call"] == "fits") == s["xla_fits"], s


def test_at_least_four_next_steps_were_confirmed_by_compiling_them() -> None:
    confirmed = [
        s
        for path in NEXT_STEPS
        for s in json.loads(path.read_text())["next_steps"]
        if "xla_fits" in s and s["predicted_call"] != "too close to call"
    ]
    assert len(confirmed) >= 4 and any(not s["xla_fits"] for s in confirmed)


@pytest.mark.parametrize("path", NEXT_STEPS, ids=[p.stem for p in NEXT_STEPS])
def test_the_report_gives_next_steps_as_overrides_and_the_command_that_confirms_one(path) -> None:  # type: ignore[no-untyped-def]
    record, step = _recorded(path)
    module = parse_hlo(gzip.decompress((path.parent / f"{path.stem}.hlo.gz").read_bytes()).decode())
    planned = plan_step(module, step, holders=False)
    steps = [
        MaxTextNextStep(s["kind"], tuple(s["overrides"]), s["predicted_bytes"], s["predicted_call"])
        for s in record["next_steps"]
        if s["reported"]
    ]
    lines = render(planned, steps)
    assert max(len(line) for line in lines) <= MAX_LINE
    text = "\n".join(lines)
    first = next(s for s in steps if s.fits)
    command = text[text.index("python -m maxtext.trainers.pre_train.train_compile") :]
    for override in first.overrides:
        assert override in command
    assert f"model_name={step.model_name}" in command


def test_bad_arguments_are_said_with_where_they_are(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scan_runtime.maxtext.lowering import split_arguments

    config = tmp_path / "my.yml"
    config.write_text("model_name: llama3-8b\n")
    assert split_arguments([str(config), "compile_topology=v6e-8"]) == (str(config), ["compile_topology=v6e-8"])
    with pytest.raises(ValueError, match=r"argument 3, 'v6e-8': expected key=value"):
        split_arguments([str(config), "compile_topology=v6e-8", "v6e-8"])
    with pytest.raises(ValueError, match=r"argument 2, '=8': an override needs a key"):
        split_arguments([str(config), "=8"])
    with pytest.raises(ValueError, match=r"nope.yml: no such MaxText config file"):
        split_arguments([str(tmp_path / "nope.yml"), "compile_topology=v6e-8"])


@pytest.mark.skipif(importlib.util.find_spec("maxtext") is not None, reason="MaxText is installed here")
def test_the_command_says_where_maxtext_is_needed() -> None:
    run = subprocess.run([sys.executable, "-m", "cli", "maxtext", "compile_topology=v6e-8"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "maxtext is not installed here: run this in your MaxText environment" in run.stderr


def test_a_lowered_step_s_outputs_are_said_as_ranges() -> None:
    """The lowered text's note on outputs read as pinned names 62 outputs as one range, not one by one."""
    from planner.prepare import prepare

    name = "libtpu_0_0_52/maxtext_llama3-8b_L32_v6e-8_shardy"
    module = parse_hlo(gzip.decompress((FIXTURES / f"{name}.hlo.gz").read_bytes()).decode())
    (warning,) = [w for w in prepare(module, "v6e").warnings if "allow_spmd_sharding_propagation_to_output" in w]
    assert "keeps outputs 0-61 as pinned" in warning and len(warning) < 300
