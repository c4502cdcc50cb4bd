"""Reading and writing text: HLO as XLA prints it (`parser` and its parts, `printer`), StableHLO through
jaxlib's converter (`stablehlo_text`, `jaxlib_api`), and Shardy's syntax in a module (`shardy_import`,
`mesh_inference`); with the checks XLA's parser makes while it reads."""
