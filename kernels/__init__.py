"""Example kernels packaged by this repository's kernel_manifest.toml."""
