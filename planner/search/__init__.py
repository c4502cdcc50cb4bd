"""Which configuration of a JAX step fits: candidates (mesh x remat x microbatches x chip), each lowered and
planned, ranked by fit, compute and headroom, the best compiled; fanned out as Ray tasks.

- `candidates`: the grid of configurations.
- `evaluate`: one candidate lowered and planned, or compiled with its plan; the step builders by name.
- `ranking`: the search itself on Ray, its ranking and its report for the service.
- `ray_tasks`: what every Ray task asks for (the service's jobs too).
"""
