"""A simulated GPU benchmark worker for the CPU tests of ``forge-aot tune``: it speaks the worker protocol
(``forge_aot.tune.bench_worker``) and checks every binary it is given exists with the recorded sha256, but
"times" configs with a formula instead of running them. Planted configs behave like the real planted kernels of
tests/fixtures/tune: ``MODE = 1`` gives a wrong result, ``MODE = 2`` kills the process (an illegal address),
``MODE = 3`` hangs. ``FAKE_TUNE_LOG`` names a file that gets one line per command and candidate;
``FAKE_TUNE_DELAY`` seconds are slept per timed candidate (to kill a run in the middle); candidates whose id
contains ``FAKE_TUNE_FAIL`` fail their probe as a harness error would; ``FAKE_TUNE_REVERSE`` reverses the order of
a row's first interleaved rounds."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time

from forge_aot.tune.bench_worker import RESULT_MARK

DEVICE = {"name": "Simulated H100", "capability": "9.0", "arch": "sm_90", "backend": "cuda", "sms": 132,
          "l2_bytes": 50 << 20, "max_shared": 232448, "driver": "simulated", "cuda": "13.0", "torch": "none",
          "peak_bytes_per_s": 3.0e12, "peak_flops": 8.0e14}


def log(line: str) -> None:
    path = os.environ.get("FAKE_TUNE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def fake_ms(cand: dict, key: dict) -> float:
    meta = cand["config"]["meta"]
    block = meta.get("BLOCK", meta.get("BLOCK_SIZE", 1024))
    n = max(key.values()) if key else 1
    warps = cand["config"]["num_warps"]
    return 0.002 + n * 4e-9 * (1 + 0.15 * abs(math.log2(block / 1024))) * (1 + 0.05 * abs(math.log2(warps / 4)))


def stats(ms: float, n: int = 10) -> dict:
    return {"median_ms": ms, "min_ms": ms * 0.99, "max_ms": ms * 1.02, "p20_ms": ms * 0.995, "p80_ms": ms * 1.005,
            "n": n, "mode": "graph" if ms < 0.03 else "events"}


def main() -> None:
    result_fd = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(result_fd, "w", buffering=1)
    item: dict = {}

    def emit(ev: dict) -> None:
        out.write(RESULT_MARK + json.dumps(ev) + "\n")
        out.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        log(f"{op} {os.environ.get('CUDA_VISIBLE_DEVICES')}")
        if op == "device":
            emit({"event": "device", "device": DEVICE, "pid": os.getpid()})
        elif op == "setup":
            assert cmd["index"]["kernels"] and cmd["modules"]
            emit({"event": "ready"})
        elif op == "item":
            item = cmd["item"]
            emit({"event": "item", "input_bytes": 4 * max(item["key"].values())})
        elif op in ("probe", "time"):
            for cand in cmd["candidates"]:
                emit({"event": "start", "cid": cand["cid"]})
                for b in cand["binaries"].values():
                    with open(b["path"], "rb") as f:
                        assert hashlib.sha256(f.read()).hexdigest() == b["sha256"], b["path"]
                    if "N" in b.get("spec", ""):  # an argument passed as None, compiled in
                        log(f"none-binary {b['spec']}")
                mode = cand["config"]["meta"].get("MODE", 0)
                variant = ",".join(f"{k}={v}" for k, v in item["assignment"].items())
                log(f"{op}-candidate {variant} {cand['cid']}")
                if mode == 2:
                    os._exit(3)  # an illegal address ends the process
                if mode == 3:
                    time.sleep(3600)
                if op == "probe" and os.environ.get("FAKE_TUNE_FAIL") and os.environ["FAKE_TUNE_FAIL"] in cand["cid"]:
                    # a harness error (the timer or the inputs raised), not a verdict on the config
                    emit({"event": "result", "cid": cand["cid"], "status": "failed",
                          "error": "AttributeError: 'NoneType' object has no attribute 'untyped_storage'"})
                    continue
                if op == "probe":
                    shared = max(b["shared"] for b in cand["binaries"].values())
                    attrs = {"shared": shared, "regs": 32, "local_bytes": 0, "occupancy": 8,
                             "programs": max(item["key"].values()) // cand["config"]["meta"].get("BLOCK", 1024) + 1,
                             "tensor_bytes": 8 * max(item["key"].values())}
                    status, err = ("wrong", 0.5) if mode == 1 else ("ok", 1e-7)
                    emit({"event": "result", "cid": cand["cid"], "status": status, "rel_err": err, "attrs": attrs})
                else:
                    time.sleep(float(os.environ.get("FAKE_TUNE_DELAY", "0")))
                    ms = fake_ms(cand, item["key"])
                    best = cmd.get("best_ms")
                    early = best is not None and ms > best * 1.4
                    s = stats(ms, 5 if early else 10)
                    if early:
                        s["early_exit"] = True
                    emit({"event": "result", "cid": cand["cid"], "status": "ok", "time": s})
            emit({"event": "done"})
        elif op == "interleave":
            # FAKE_TUNE_REVERSE: the first interleaved rounds put the first pass's order upside down (noise that a
            # few rounds cannot tell from a difference); rounds asked for after that time the configs as they are.
            reverse = bool(os.environ.get("FAKE_TUNE_REVERSE")) and not item.get("_interleaved")
            item["_interleaved"] = True
            log(f"interleave-rounds {cmd['rounds']} {len(cmd['candidates'])}")
            times = {c["cid"]: fake_ms(c, item["key"]) for c in cmd["candidates"]}
            if reverse:
                times = {cid: 1.0 / ms * 1e-6 for cid, ms in times.items()}
            emit({"event": "interleaved", "rounds": {cid: [ms] * cmd["rounds"] for cid, ms in times.items()},
                  "modes": {cid: stats(ms)["mode"] for cid, ms in times.items()}})
        elif op == "verify":
            emit({"event": "verified", "cid": cmd["candidate"]["cid"], "rel_err": 1e-7, "ok": True})


if __name__ == "__main__":
    main()
