"""A kernel's pruning hooks, run with Triton's semantics on a traced call's arguments.

``early_config_prune`` (the decorator's ``prune_configs_by``, else the manifest's ``tune.prune``) runs when the
plan is made, per table row, on the row's first traced call, as ``triton.autotune`` runs it when a key is first
seen: the row's configs are what it returns, so an untuned row takes the first of them, as Triton's autotuner
would when one is left. A hook may return configs it did not get (gemlite's gemv pruner clamps block sizes to
the shape and adds ``NUM_STAGES``, ``EVEN_K`` and ``EVEN_N``): those become configs of the space too.
``perf_model`` (with ``top_k``) needs the device the tuning runs on, so only tuning runs it.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from .errors import SourceError

if TYPE_CHECKING:
    from .plan import ConfigChoice, KernelPlan, TracedCall


class PruneHookFailed(SourceError):
    """The pruning hook itself raised (one that asks the GPU, run on a build machine without one)."""


def early_prune_hook(kp: KernelPlan) -> str | None:
    """The name (or ``introspect.TUNER_OWN_HOOK``) of the kernel's ``early_config_prune``, if it has one."""
    if kp.entry.tune.prune:
        return kp.entry.tune.prune
    return kp.autotune.prune.get("early_config_prune") if kp.autotune else None


def hook_arguments(kp: KernelPlan, call: TracedCall) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(nargs, kwargs)`` of a hook: every argument of the call by name (Triton's ``nargs`` holds those passed
    positionally: a hook finds each where Triton puts it), and the constexprs with the runtime arguments some launch
    passes by keyword (the attention tutorial's ``prune_invalid_configs`` reads ``kwargs["N_CTX"]``), or this call
    did (Unsloth's MoE: ``kernel[grid](**kernel_args)``, its pruner reading ``kwargs["x_ptr"]``)."""
    named = dict(call.named or {})
    keywords = {kw for site in kp.launches for kw in site.keywords} | set(call.keywords)
    runtime = {n for n, ty in kp.params if ty not in ("meta", "constexpr", "heuristic")}
    return named, {k: v for k, v in named.items() if k not in runtime or k in keywords}


def triton_configs(candidates: list[ConfigChoice]) -> list[Any]:
    import triton

    out = []
    for c in candidates:
        kwargs = {"num_warps": c.num_warps, "num_stages": c.num_stages}
        if c.maxnreg is not None:
            kwargs["maxnreg"] = c.maxnreg
        out.append(triton.Config(dict(c.meta), **kwargs))
    return out


def early_prune(kp: KernelPlan, space: list[ConfigChoice], call: TracedCall,
                module: types.ModuleType) -> tuple[list[ConfigChoice], dict[str, str]]:
    """The configs the kernel's ``early_config_prune`` keeps of ``space`` for ``call``'s arguments, in the order
    it returns them (configs it made itself included), and the dropped ones with why. ``module``: the kernel file
    imported with Triton (the hook lives there)."""
    from .introspect import tuner_hook

    name = early_prune_hook(kp)
    assert name is not None
    where = f"{kp.source}: {kp.function}"
    fn = tuner_hook(module, kp.function, "early_config_prune", name) if not kp.entry.tune.prune \
        else getattr(module, name)
    nargs, kwargs = hook_arguments(kp, call)
    configs = triton_configs(space)
    given = {id(c): choice for c, choice in zip(configs, space)}
    try:
        returned = list(fn(configs, nargs, **kwargs))
    except Exception as exc:
        raise PruneHookFailed(f"{where}: the pruning hook {name}() failed on {_shown(nargs)}: "
                          f"{type(exc).__name__}: {exc}") from None
    kept: list[ConfigChoice] = []
    seen: set[str] = set()
    for c in returned:
        choice = given.get(id(c))
        if choice is None or (dict(c.kwargs), c.num_warps, c.num_stages) != (choice.meta, choice.num_warps,
                                                                             choice.num_stages):
            # a config the hook made, or one it was given and changed in place (as Triton would run it)
            choice = _made_config(kp, c, choice, module, f"{where}: the pruning hook {name}()")
        if choice.id not in seen:  # the first of equal configs stands
            seen.add(choice.id)
            kept.append(choice)
    if not kept:
        raise SourceError(f"{where}: the pruning hook {name}() left no config for {_shown(nargs)}")
    kept_ids = {c.id for c in kept}
    return kept, {c.id: f"pruned by {name}()" for c in space if c.id not in kept_ids}


def _made_config(kp: KernelPlan, c: Any, given: ConfigChoice | None, module: types.ModuleType,
                 hook: str) -> ConfigChoice:
    """A ``triton.Config`` a pruning hook returned that is none of those it got, as a config of the space: it must set
    the kernel's meta-parameters (those with a default may be left out) and name its pre-hook by a top-level
    function of the kernel file (else it keeps the one it was given with)."""
    from .introspect import _function_name
    from .plan import ConfigChoice

    if getattr(c, "num_ctas", 1) != 1:
        raise SourceError(f"{hook} returned a config with num_ctas={c.num_ctas} (thread-block clusters), which the "
                          "forge-aot loader cannot launch")
    names = set(c.kwargs)
    required = set(kp.meta_names) - set(kp.meta_defaults)
    if not required <= names <= set(kp.meta_names):
        raise SourceError(f"{hook} returned a config that sets {sorted(names)}; a config of {kp.function} sets "
                          f"{sorted(required)}"
                          f"{', and may set ' + str(sorted(kp.meta_defaults)) if kp.meta_defaults else ''} (the "
                          "decorator's meta-parameters and the constexprs no launch passes)")
    pre_hook = _function_name(c.pre_hook, module, "the pre_hook of a config it returned", hook) \
        if c.pre_hook is not None else given.pre_hook if given is not None else None
    meta = {**c.kwargs, **{n: v for n, v in kp.meta_defaults.items() if n not in names}}
    return ConfigChoice(meta, int(c.num_warps), int(c.num_stages), getattr(c, "maxnreg", None), pre_hook)


def perf_model_prune(kp: KernelPlan, candidates: list[ConfigChoice], call: TracedCall,
                     module: types.ModuleType) -> tuple[list[ConfigChoice], dict[str, str]]:
    """``perf_model(**nargs, **kwargs, **config.all_kwargs())`` over the candidates, keeping the ``top_k`` it
    estimates fastest, as ``triton.autotune`` does; the candidates as they are where there is no model (or the
    manifest's ``tune.prune`` replaces the decorator's hooks)."""
    from .introspect import tuner_hook

    model = kp.autotune.prune.get("perf_model") if kp.autotune and not kp.entry.tune.prune else None
    if not model:
        return candidates, {}
    fn = tuner_hook(module, kp.function, "perf_model", model)
    nargs, kwargs = hook_arguments(kp, call)
    kwargs = {k: v for k, v in kwargs.items() if k not in kp.meta_names}
    plain = {k: v for k, v in nargs.items() if k not in kwargs and k not in kp.meta_names}
    try:
        estimates = {c.id: float(fn(**plain, **kwargs, **c.all_kwargs())) for c in candidates}
    except Exception as exc:
        raise SourceError(f"{kp.source}: {kp.function}: perf_model {model}() failed: {type(exc).__name__}: "
                          f"{exc}") from None
    top_k = kp.autotune.prune.get("top_k") if kp.autotune else None
    ordered = sorted(candidates, key=lambda c: estimates[c.id])
    k = top_k if isinstance(top_k, int) else max(1, int(len(ordered) * float(top_k or 1.0)))
    kept_ids = {c.id for c in ordered[:k]}
    return ([c for c in candidates if c.id in kept_ids],
            {c.id: f"pruned by {model}()" for c in candidates if c.id not in kept_ids})


def _shown(nargs: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" if isinstance(v, (int, float, bool, str)) or v is None
                           else f"{k}: <{type(v).__name__}>" for k, v in nargs.items()) + "}"
