"""Real compilers on a plan: XLA through jaxlib (HLO, StableHLO with or without Shardy) and torch_xla's own,
the checks that a conversion is faithful, and whether the compile confirms the saving claimed."""
