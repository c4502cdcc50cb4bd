"""The shapes XLA's parser infers for instructions written without one (`shapes`), by kind of op: data
movement, linear algebra, and the shape vocabulary both use (`algebra`)."""
