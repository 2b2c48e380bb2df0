"""What the probes' fresh child processes share: the device they run on, set up before anything is timed.

``DEVICE`` is the opening of a child's code (``python -c``): ``sys.argv[1]`` is ``cuda`` (torch's CUDA context made
and synchronized) or ``fake`` (the test suite's fake driver first on ``LD_LIBRARY_PATH`` as ``libcuda.so.1``: CPU
tensors answer as tensors of GPU 0, torch's current stream as a made-up handle); it leaves ``torch``, ``dev`` (the
torch device name) and ``clk`` (``time.perf_counter``) defined. Imported by ``probe_cold_stages`` and
``probe_lean_first_call`` (run as scripts, so this directory is on ``sys.path``).
"""

import textwrap

DEVICE = textwrap.dedent("""
    import sys, time
    import torch
    if sys.argv[1] == "fake":
        torch.Tensor.get_device = lambda self: 0
        torch._C._cuda_getCurrentRawStream = lambda d: 0x5EED0 + d
        dev = "cpu"
    else:
        dev = "cuda"
        torch.zeros(1, device=dev); torch.cuda.synchronize()
    clk = time.perf_counter
""")
