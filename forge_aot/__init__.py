"""forge-aot: ahead-of-time build and packaging of Triton kernels into wheels that need no Triton to run."""

__version__ = "0.1.0"
