"""A custom op's real implementation held to its schema (runtime/guard.py), on the CPU: the schema's written
arguments, the guard a call stands under (written arguments left out), results that alias copied, guards of nested
custom ops joined. Launches refused under a guard: tests/test_c_launch.py (both launch paths, with
the fake driver) and tests/test_liger_rope.py (the H100)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from forge_aot.runtime import guard  # noqa: E402
from forge_aot.runtime.kernel import LAUNCHES  # noqa: E402


def test_arguments_reads_positional_names_and_written_ones() -> None:
    names, written = guard.arguments("pkg.op", "(Tensor(a!) out, Tensor x, Tensor(b!)[] bufs, *, Tensor? y=None, "
                                               "int n=1) -> ()")
    assert names == ["out", "x", "bufs"] and written == {"out", "bufs"}


def _call(fn, args, kwargs=None, schema="(Tensor x, Tensor y) -> Tensor", op="pkg.op"):
    names, written = guard.arguments(op, schema)
    kwargs = kwargs or {}
    return guard.guarded(op, names, written, fn, args, kwargs, (args, kwargs))


def test_the_guard_keeps_every_unwritten_tensor_argument_and_is_lifted_after() -> None:
    x, y, out = torch.randn(8), torch.randn(3, 4), torch.empty(8)
    seen = []

    def host(out, x, ys):
        seen.append(LAUNCHES.skip)
        return x + 1

    _call(host, (out, x, [y, y[1:]]), schema="(Tensor(a!) out, Tensor x, Tensor[] ys) -> Tensor")
    (g,) = seen
    assert isinstance(g, guard.Guard) and g.ops == ("pkg.op", "pkg.op")
    # x and y's storage (once, though two views of it are passed), not the written out
    assert list(g) == [x.data_ptr(), x.data_ptr() + 32, y.data_ptr(), y.data_ptr() + 48]
    ((op, names, args, kwargs),) = g.call
    assert op == "pkg.op" and names == ["out", "x", "ys"] and args[1] is x and kwargs == {}
    assert LAUNCHES.skip is False
    # lifted when the host code raises too
    with pytest.raises(ZeroDivisionError):
        _call(lambda x, y: 1 / 0, (x, y))
    assert LAUNCHES.skip is False
    # a kept argument sharing storage with a written one is the written one's: not kept
    seen.clear()
    _call(host, (out, out[2:], [y]), schema="(Tensor(a!) out, Tensor x, Tensor[] ys) -> Tensor")
    assert list(seen[0]) == [y.data_ptr(), y.data_ptr() + 48]


def test_nested_custom_ops_keep_what_both_keep_and_meta_calls_stay_unlaunched() -> None:
    a, b = torch.randn(4), torch.randn(5)
    inner = []

    def outer_host(x, y):
        return _call(lambda x, y: (inner.append(LAUNCHES.skip), x * 2)[1], (b, b))

    _call(outer_host, (a, a), op="pkg.outer")
    assert list(inner[0]) == [a.data_ptr(), a.data_ptr() + 16, b.data_ptr(), b.data_ptr() + 20]
    assert inner[0].ops == ("pkg.outer", "pkg.op") and [c[0] for c in inner[0].call] == ["pkg.outer", "pkg.op"]
    # inside a Meta implementation (LAUNCHES.skip True) nothing launches: the guard does not replace that
    LAUNCHES.skip = True
    try:
        assert torch.equal(_call(lambda x, y: (inner.append(LAUNCHES.skip), x + y)[1], (a, a)), a + a)
    finally:
        LAUNCHES.skip = False
    assert inner[-1] is True


def test_a_written_argument_is_the_ops_to_write_and_shares_its_storage_with_no_kept_one() -> None:
    x, y = torch.randn(6), torch.randn(6)
    seen = []
    out = _call(lambda x, y: (seen.append(LAUNCHES.skip), y.mul_(2), x + y)[2], (x, y),
                schema="(Tensor x, Tensor(a!) y) -> Tensor")
    assert torch.equal(out, x + y) and list(seen[0]) == [x.data_ptr(), x.data_ptr() + 24]


def test_results_that_alias_are_copied_and_fresh_ones_returned_as_they_are() -> None:
    x, y = torch.randn(4, 4), torch.randn(4)
    fresh = torch.randn(3)
    assert _call(lambda x, y: fresh, (x, y)) is fresh
    # an input, a view of one, the same result twice
    out = _call(lambda x, y: x, (x, y))
    assert out is not x and torch.equal(out, x) and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    out = _call(lambda x, y: (x.t(), fresh, fresh[1:]), (x, y), schema="(Tensor x, Tensor y) -> (Tensor, Tensor, "
                                                                          "Tensor)")
    assert torch.equal(out[0], x.t()) and not torch._C._is_alias_of(out[0], x)
    assert out[1] is fresh and torch.equal(out[2], fresh[1:]) and not torch._C._is_alias_of(out[2], fresh)
    assert guard.own((None, fresh), (x,), {}) == (None, fresh)


def test_the_meta_implementations_results_are_told_apart_by_storage_identity() -> None:
    """Fake and meta tensors have no addresses: ``own`` (the Meta implementation's) compares storages themselves."""
    x = torch.empty(4, 4, device="meta")
    out = guard.own(x.t(), (x,), {})
    assert out.device.type == "meta" and out.shape == (4, 4) and not torch._C._is_alias_of(out, x)
    fresh = torch.empty(3, device="meta")
    out = guard.own((fresh, x[0]), (), {"x": x})
    assert out[0] is fresh and not torch._C._is_alias_of(out[1], x) and out[1].shape == (4,)


def test_a_launch_is_checked_for_what_the_flags_it_passes_write() -> None:
    """FlashInfer's rms_norm stores to ``o_ptr if HAS_OUTPUT else x_ptr`` and passes ``HAS_OUTPUT=True``: its custom op
    keeps ``x``, and the guard refused the launch by the kernel's ``writes`` (both pointers). The index's
    ``writes_when`` says what each combination of flags writes; a call passing no bool there is held to all."""
    import types

    x, out = torch.randn(8), torch.empty(8)
    kernel = types.SimpleNamespace(function="rms_norm_kernel", runtime_names=["x_ptr", "o_ptr"], written_pos=(0, 1),
                                   spec={"writes_when": [[[["HAS_OUTPUT", True]], ["o_ptr"]],
                                                         [[["HAS_OUTPUT", False]], ["x_ptr"]]]})

    def host(x, out, flag):
        LAUNCHES.skip.check(kernel, (x, out), {"HAS_OUTPUT": flag})

    _call(host, (x, out, True), schema="(Tensor x, Tensor(a!) out, bool flag) -> ()")  # writes out only: allowed
    for flag in (False, 1):  # writes x, or no bool: every pointer counts
        with pytest.raises(guard.ForgeRuntimeError, match=r"kernel rms_norm_kernel would write argument x \(through "
                                                          r"its parameter x_ptr\)"):
            _call(host, (x, out, flag), schema="(Tensor x, Tensor(a!) out, bool flag) -> ()")
    assert guard._written_positions(kernel, {}) == (0, 1)
