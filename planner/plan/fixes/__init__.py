"""What to do about it: the placements that fix a finding, named in the user's words (parameter, spec, a line
to paste), and the next steps beyond sharding (remat, more chips, smaller microbatches)."""
