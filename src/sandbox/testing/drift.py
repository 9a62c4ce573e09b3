"""Check that a fake class has exactly the surface of the real SDK class it stands for.

A fake that drifts from the SDK it imitates makes tests pass against code that fails in
production. `surface_problems(fake, real)` compares every public name the fake defines
with the real class: it must exist there, be a method where the real one is a method,
be async exactly where the real one is, and accept only parameters the real one accepts
(same names and kinds), while every parameter the real one requires is accepted.

SDKs wrapped by synchronicity (Modal) expose each call twice: a blocking form and an
async form at `.aio` (`Sandbox.create.aio(...)`, `sandbox.exec.aio(...)`). Where either
side has an `.aio` form, the `.aio` forms are compared (presence, async-ness, parameters)
instead of the wrapper objects. A fake may also list dunder methods it imitates (such as
`__aiter__`) in `__fake_dunders__` to have them checked like public names.

Some SDKs (E2B) define methods that work both on an instance and on the class, through a
descriptor such as e2b's `class_method_variant`: `sandbox.kill()` runs the instance method,
`AsyncSandbox.kill(sandbox_id)` runs a class-level implementation named by the
descriptor's `class_method_name`. Such a descriptor (anything with a `method` and a
`class_method_name`) is compared on both forms: the instance methods with each other, and
the class-level implementations with each other.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

FAKE_ONLY_MARK = "__fake_only__"
FAKE_DUNDERS_MARK = "__fake_dunders__"


def _public_names(cls: type) -> list[str]:
    only: Iterable[str] = getattr(cls, FAKE_ONLY_MARK, ())
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(n for n in vars(klass) if not n.startswith("_"))
    names.update(getattr(cls, FAKE_DUNDERS_MARK, ()))
    return sorted(names - set(only) - {FAKE_ONLY_MARK})


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, staticmethod | classmethod):
        return obj.__func__
    return obj


def _is_async(func: Any) -> bool:
    func = inspect.unwrap(_unwrap(func))
    return inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)


def _lookup(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return getattr(cls, name)


def _aio_form(cls: type, name: str) -> Any:
    """The `.aio` (async) form of `cls.name` as a caller reaches it, or None if it has none."""
    try:
        attr = getattr(cls, name)
    except AttributeError:
        return None
    if isinstance(attr, property | type):
        return None
    aio = getattr(attr, "aio", None)
    return aio if callable(aio) else None


def _instance_or_class_method(attr: Any) -> tuple[Any, str] | None:
    """For a descriptor that dispatches to an instance method or a class-level one (e2b's
    `class_method_variant`): the instance method and the class-level one's name."""
    if isinstance(attr, type | property | staticmethod | classmethod) or inspect.isfunction(attr):
        return None
    method = getattr(attr, "method", None)
    name = getattr(attr, "class_method_name", None)
    if callable(method) and isinstance(name, str):
        return method, name
    return None


def _callable_problems(qual: str, fake: Any, real: Any) -> list[str]:
    """Async-ness and parameter differences between two callables."""
    problems = []
    if _is_async(fake) != _is_async(real):
        problems.append(
            f"{qual}: {'async' if _is_async(fake) else 'sync'} in the fake, "
            f"{'async' if _is_async(real) else 'sync'} in the SDK"
        )
    problems.extend(signature_problems(qual, fake, real))
    return problems


def _signature(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(_unwrap(func))
    except (TypeError, ValueError):
        return None


def signature_problems(name: str, fake: Any, real: Any) -> list[str]:
    """Differences between a fake callable's parameters and the real one's."""
    fake_sig, real_sig = _signature(fake), _signature(real)
    if fake_sig is None or real_sig is None:
        return []
    problems = []
    real_params = real_sig.parameters
    real_has_var_kw = any(p.kind is p.VAR_KEYWORD for p in real_params.values())
    real_has_var_pos = any(p.kind is p.VAR_POSITIONAL for p in real_params.values())
    for pname, param in fake_sig.parameters.items():
        if param.kind is param.VAR_KEYWORD or param.kind is param.VAR_POSITIONAL:
            continue
        other = real_params.get(pname)
        if other is None:
            if not (real_has_var_kw and param.kind is not param.POSITIONAL_ONLY):
                problems.append(f"{name}: parameter {pname!r} does not exist in the SDK")
            continue
        if other.kind != param.kind and not (
            {other.kind, param.kind} <= {param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY}
            and param.kind is param.KEYWORD_ONLY
        ):
            problems.append(
                f"{name}: parameter {pname!r} is {param.kind} in the fake, {other.kind} in the SDK"
            )
    fake_accepts_any_kw = any(p.kind is p.VAR_KEYWORD for p in fake_sig.parameters.values())
    fake_accepts_any_pos = any(p.kind is p.VAR_POSITIONAL for p in fake_sig.parameters.values())
    for pname, other in real_params.items():
        required = other.default is other.empty and other.kind not in (
            other.VAR_KEYWORD,
            other.VAR_POSITIONAL,
        )
        if required and pname not in fake_sig.parameters:
            if (other.kind is other.POSITIONAL_ONLY and fake_accepts_any_pos) or (
                other.kind is not other.POSITIONAL_ONLY and fake_accepts_any_kw
            ):
                continue
            problems.append(f"{name}: the SDK requires parameter {pname!r}, the fake lacks it")
    del real_has_var_pos
    return problems


def surface_problems(fake: type, real: type) -> list[str]:
    """Every way the public surface of `fake` differs from `real` (empty when none).

    Names listed in the fake's `__fake_only__` tuple are helpers for tests, not SDK
    surface, and are skipped.
    """
    problems: list[str] = []
    for name in _public_names(fake):
        qual = f"{fake.__name__}.{name}"
        fake_attr = _lookup(fake, name)
        try:
            real_attr = _lookup(real, name)
        except AttributeError:
            annotations: dict[str, object] = {}
            for klass in real.__mro__:
                annotations.update(getattr(klass, "__annotations__", {}))
            if name in annotations or name in getattr(real, "model_fields", {}):
                continue  # an instance attribute the SDK declares
            problems.append(f"{qual}: {real.__name__} has no attribute {name!r}")
            continue
        fake_aio, real_aio = _aio_form(fake, name), _aio_form(real, name)
        if fake_aio is not None or real_aio is not None:
            if fake_aio is None or real_aio is None:
                where = "the fake" if fake_aio is not None else "the SDK"
                problems.append(f"{qual}: has an .aio form only in {where}")
                continue
            if _is_async(fake_aio) != _is_async(real_aio):
                problems.append(
                    f"{qual}.aio: {'async' if _is_async(fake_aio) else 'sync'} in the fake, "
                    f"{'async' if _is_async(real_aio) else 'sync'} in the SDK"
                )
            problems.extend(signature_problems(f"{qual}.aio", fake_aio, real_aio))
            continue
        fake_dual = _instance_or_class_method(fake_attr)
        real_dual = _instance_or_class_method(real_attr)
        if fake_dual is not None or real_dual is not None:
            if fake_dual is None or real_dual is None:
                where = "the fake" if fake_dual is not None else "the SDK"
                problems.append(f"{qual}: an instance-or-class method only in {where}")
                continue
            problems.extend(_callable_problems(qual, fake_dual[0], real_dual[0]))
            try:
                fake_cls_form = _lookup(fake, fake_dual[1])
                real_cls_form = _lookup(real, real_dual[1])
            except AttributeError as exc:
                problems.append(f"{qual}: its class-level form is missing ({exc})")
                continue
            problems.extend(
                _callable_problems(f"{qual} (class form)", fake_cls_form, real_cls_form)
            )
            continue
        fake_is_callable = callable(_unwrap(fake_attr)) and not isinstance(fake_attr, type)
        real_is_callable = callable(_unwrap(real_attr)) and not isinstance(real_attr, type)
        if isinstance(fake_attr, property) or isinstance(real_attr, property):
            if isinstance(real_attr, property) != isinstance(fake_attr, property) and (
                fake_is_callable or real_is_callable
            ):
                problems.append(f"{qual}: property in one, method in the other")
            continue
        if fake_is_callable != real_is_callable:
            problems.append(f"{qual}: callable in one, not in the other")
            continue
        if not fake_is_callable:
            continue
        if _is_async(fake_attr) != _is_async(real_attr):
            problems.append(
                f"{qual}: {'async' if _is_async(fake_attr) else 'sync'} in the fake, "
                f"{'async' if _is_async(real_attr) else 'sync'} in the SDK"
            )
        problems.extend(signature_problems(qual, fake_attr, real_attr))
    return problems
