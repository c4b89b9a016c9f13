"""Which class a recipe entry's ``use`` names, and building it with the entry's options.

Built-in steps by name (:data:`BUILTINS`: import paths, so listing them imports nothing
heavy); anything else is ``module:Class``, imported from the workers' path. Every failure is a
:class:`pipeline.steps.contract.StepError` naming the entry's step."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from pipeline.steps.contract import StepError
from pipeline.steps.recipe import StepSpec
from pipeline.steps.recipe import spec as make_spec

#: built-in steps: name -> "module:Class"
BUILTINS: dict[str, str] = {
    "url_blocklist": "pipeline.steps.web:UrlBlocklist",
    "extract": "pipeline.steps.web:Extract",
    "clean": "pipeline.steps.cleaning:Clean",
    "length": "pipeline.steps.cleaning:Length",
    "langid": "pipeline.steps.web:LanguageId",
    "gopher_repetition": "pipeline.steps.rules:RULE_STEPS.gopher_repetition",
    "gopher_quality": "pipeline.steps.rules:RULE_STEPS.gopher_quality",
    "c4": "pipeline.steps.rules:RULE_STEPS.c4",
    "fineweb": "pipeline.steps.rules:RULE_STEPS.fineweb",
    "pii": "pipeline.steps.web:PiiMask",
    "fasttext": "pipeline.steps.fasttext_scorer:FastTextScorer",
    "kenlm": "pipeline.steps.kenlm_scorer:KenLMPerplexity",
    "decontaminate": "pipeline.steps.decontaminate:Decontaminate",
}


def _import(path: str, use: str) -> type:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises as it loads
        raise StepError(f"step {use!r}: cannot import {module_name!r} "
                        f"({type(exc).__name__}: {exc})"[:500]) from None
    obj: Any = module
    for part in attr.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
        if obj is None:
            raise StepError(f"step {use!r}: {module_name!r} has no {attr!r}")
    if not isinstance(obj, type):
        raise StepError(f"step {use!r}: {attr!r} is not a class")
    return obj


def step_class(use: str) -> type:
    """The class ``use`` names, checked for the contract's class attributes."""
    builtin = use in BUILTINS
    if not builtin and ":" not in use:
        known = ", ".join(BUILTINS)
        raise StepError(f"unknown step {use!r}: a built-in step ({known}) or 'module:Class'")
    cls = _import(BUILTINS.get(use, use), use)
    for attr in ("name", "version"):
        if not isinstance(getattr(cls, attr, None), str):
            raise StepError(f"step {use!r}: class {cls.__name__} needs a string class "
                            f"attribute {attr!r}")
    if not any("__call__" in vars(k) for k in cls.__mro__[:-1]):
        raise StepError(f"step {use!r}: class {cls.__name__} is not callable on a document")
    return cls


def is_builtin(use: str) -> bool:
    return use in BUILTINS


def _kwargs(spec: StepSpec, cls: type, storage_options: dict[str, Any] | None
            ) -> dict[str, Any]:
    kwargs = spec.kwargs()
    modes = getattr(cls, "modes", None)
    if modes is not None:  # the step runs its own annotate mode
        if spec.mode not in modes:
            raise StepError(f"step {spec.name!r} ({spec.use}) has no {spec.mode!r} mode "
                            f"(its modes: {', '.join(modes)})")
        kwargs["mode"] = spec.mode
    elif spec.mode != "filter" and is_builtin(spec.use):  # a user step is annotated for it
        raise StepError(f"step {spec.name!r} ({spec.use}) has no {spec.mode!r} mode "
                        "(its modes: filter)")
    if getattr(cls, "wants_storage_options", False) and is_builtin(spec.use):
        kwargs["storage_options"] = storage_options
    return kwargs


def check_options(spec: StepSpec) -> type:
    """The entry's class, and its options checked against the constructor's signature
    (without building it: a model scorer would load its model in the driver)."""
    cls = step_class(spec.use)
    kwargs = _kwargs(spec, cls, None)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as exc:
        raise StepError(f"step {spec.name!r} ({spec.use}): bad options: {exc}") from None
    except ValueError:  # no signature to read (a C type): building it will tell
        pass
    return cls


def build(spec: StepSpec, storage_options: dict[str, Any] | None = None) -> Any:
    """The step of one recipe entry, built with its options; a built-in takes the entry's
    name (its reasons and changes are counted under it)."""
    cls = step_class(spec.use)
    try:
        step = cls(**_kwargs(spec, cls, storage_options))
    except StepError:
        raise
    except TypeError as exc:
        raise StepError(f"step {spec.name!r} ({spec.use}): bad options: {exc}"[:500]) from None
    except ValueError as exc:  # a missing block-list, an unknown language, a bad model
        raise StepError(f"step {spec.name!r} ({spec.use}): {exc}"[:500]) from None
    if is_builtin(spec.use):
        step.name = spec.name
    return step


def pinned(steps: tuple[StepSpec, ...]) -> tuple[StepSpec, ...]:
    """The steps with what their options name pinned by the driver: a built-in step with a
    ``pin_options(options)`` class method (``decontaminate``: its eval files' content hash)
    gets the options it returns, so the manifest's recipe and the partition keys change with
    the files, and every worker checks it reads the same. A bad file is a ``ValueError``
    naming the step (the run stops before anything is written)."""
    out = []
    for spec in steps:
        pin = getattr(step_class(spec.use), "pin_options", None) if is_builtin(spec.use) \
            else None
        if pin is not None:
            try:
                options = pin(spec.kwargs())
            except TypeError as exc:
                raise ValueError(f"step {spec.name!r} ({spec.use}): bad options: {exc}") \
                    from None
            except ValueError as exc:
                raise ValueError(f"step {spec.name!r} ({spec.use}): {exc}"[:500]) from None
            spec = make_spec(spec.use, spec.name, spec.mode, **options)
        out.append(spec)
    return tuple(out)
