"""The module IR: immutable instructions, computations and modules (`module`), shapes, typed attributes and
opcodes, and what can be read off one module alone: where an instruction came from, its structural digest,
names made unique."""
