"""A module's structure: While loops and their carried tuples (`loops`), calls inlined or flattened as
XLA's passes leave them, sealing from MLIR's canonicalizer, which front end wrote it, and a summary."""
