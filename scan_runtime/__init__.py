"""Client runtime: drop-in scan / scan_layers that apply a sharding plan."""
