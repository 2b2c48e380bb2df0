"""Templates of the package forge-aot generates: its runtime loader, its build backend, its metadata.

Nothing here may import triton or forge_aot: these files run inside the generated wheel.
"""
