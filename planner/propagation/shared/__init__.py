"""What both propagation engines build on and hand on: the working graph with each decision's provenance
(`graph`), dot and convolution dimension roles (`dot_dims`), and the result every later stage reads
(`result`)."""
