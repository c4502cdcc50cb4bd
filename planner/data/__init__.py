"""Data bundled with the planner: a real torch_xla training-step dump.

`llama_scan_L8_fsdp4_tp2.hlo` is one training step of a Llama-like layer
stack run with torch_xla 2.9 `scan_layers` on 8 devices, mesh fsdp=4 x tp=2,
exactly as XLA dumped it before optimisation. It is the default input of the
command line.
"""

from pathlib import Path

DEFAULT_DUMP = Path(__file__).with_name("llama_scan_L8_fsdp4_tp2.hlo")
