"""Check that a fake class has exactly the surface of the real SDK class it stands for.

A fake that drifts from the SDK it imitates makes tests pass against code that fails in
production. `surface_problems(fake, real)` compares every public name the fake defines
with the real class: it must exist there, be a method where the real one is a method,
be async exactly where the real one is, and accept only parameters the real one accepts
(same names and kinds), while every parameter the real one requires is accepted. Beyond
names, it compares what a caller relies on:

- order: the fake's positional parameters are the SDK's first ones, in the same order
  (a positional call would otherwise bind to the wrong parameter);
- defaults: a parameter both declare is optional in both or required in both, and where
  both defaults are plain values (None, bool, numbers, strings, enums) they are equal;
- return annotations: when both sides annotate a return, the outer type names agree,
  union member by union member (`X | None` against `Optional[X]`), after mapping the
  fake's class names to the SDK's (the fake class itself, its bases, `Self`, leading
  underscores of synchronicity's `_Impl` names, and the fake module's `SDK_NAMES`
  mapping, also of its bases' modules); `Any` on either side is not checked;
- overloads (`typing.overload`): a fake of an overloaded SDK function declares the same
  number of overloads, compared one by one like the implementations.

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

import enum
import inspect
import sys
import typing
from collections.abc import Iterable, Mapping
from typing import Any

# The class attributes a fake uses to name what it has beyond the SDK (its own helpers,
# dunders) and its map of fake names to SDK names.
FAKE_ONLY_MARK = "__fake_only__"
FAKE_DUNDERS_MARK = "__fake_dunders__"
SDK_NAMES_MARK = "SDK_NAMES"
_PLAIN_DEFAULTS = (type(None), bool, int, float, str, bytes, enum.Enum)
# typing's old aliases name the same types as the builtins.
_TYPING_ALIASES = {
    "List": "list",
    "Dict": "dict",
    "Tuple": "tuple",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Type": "type",
}


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


def _callable_problems(
    qual: str, fake: Any, real: Any, aliases: Mapping[str, str] | None = None
) -> list[str]:
    """Async-ness and parameter differences between two callables."""
    problems = []
    if _is_async(fake) != _is_async(real):
        problems.append(
            f"{qual}: {'async' if _is_async(fake) else 'sync'} in the fake, "
            f"{'async' if _is_async(real) else 'sync'} in the SDK"
        )
    problems.extend(signature_problems(qual, fake, real, aliases))
    return problems


def _signature(func: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(_unwrap(func))
    except (TypeError, ValueError):
        return None


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` where it is not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _annotation_names(annotation: Any, aliases: Mapping[str, str]) -> frozenset[str] | None:
    """The outer type names of a return annotation, one per union member (None: not
    annotated, or `Any`, so nothing to compare)."""
    if annotation is inspect.Signature.empty:
        return None
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    names: set[str] = set()
    for member in _split_top(text.strip().strip("'\""), "|"):
        member = member.strip("'\"")
        head, _, inner = member.partition("[")
        base = head.rsplit(".", 1)[-1]
        if base in ("Optional", "Union") and inner:
            for part in _split_top(inner[:-1], ","):
                found = _annotation_names(part, aliases)
                if found is None:
                    return None
                names.update(found)
            if base == "Optional":
                names.add("None")
            continue
        if base == "Any":
            return None
        base = "None" if base == "NoneType" else _TYPING_ALIASES.get(base, base)
        base = aliases.get(base, base)
        names.add(aliases.get(base.lstrip("_"), base.lstrip("_")))
    return frozenset(names)


def _return_problems(
    name: str, fake_sig: inspect.Signature, real_sig: inspect.Signature, aliases: Mapping[str, str]
) -> list[str]:
    fake_names = _annotation_names(fake_sig.return_annotation, aliases)
    real_names = _annotation_names(real_sig.return_annotation, aliases)
    if fake_names is None or real_names is None or fake_names == real_names:
        return []
    return [
        f"{name}: returns {' | '.join(sorted(fake_names))} in the fake, "
        f"{' | '.join(sorted(real_names))} in the SDK"
    ]


def _plain(value: object) -> bool:
    return isinstance(value, _PLAIN_DEFAULTS)


def _default_problems(
    name: str, fake_sig: inspect.Signature, real_sig: inspect.Signature
) -> list[str]:
    problems = []
    for pname, param in fake_sig.parameters.items():
        other = real_sig.parameters.get(pname)
        if other is None or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        fake_required = param.default is param.empty
        real_required = other.default is other.empty
        if fake_required != real_required:
            where = "the fake" if fake_required else "the SDK"
            problems.append(f"{name}: parameter {pname!r} is required only in {where}")
        elif not fake_required and _plain(param.default) and _plain(other.default):
            same = type(param.default) is type(other.default) and param.default == other.default
            if not same:
                problems.append(
                    f"{name}: parameter {pname!r} defaults to {param.default!r} in the fake, "
                    f"{other.default!r} in the SDK"
                )
    return problems


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _order_problems(
    name: str, fake_sig: inspect.Signature, real_sig: inspect.Signature
) -> list[str]:
    """The fake's positional parameters must be the SDK's first ones, in order."""
    fake_pos = [p for p, v in fake_sig.parameters.items() if v.kind in _POSITIONAL]
    real_pos = [p for p, v in real_sig.parameters.items() if v.kind in _POSITIONAL]
    for index, pname in enumerate(fake_pos):
        if pname not in real_pos:
            continue  # reported as a parameter the SDK lacks (or takes by keyword only)
        if index >= len(real_pos) or real_pos[index] != pname:
            return [
                f"{name}: parameter {pname!r} is positional parameter {index} in the fake, "
                f"{real_pos.index(pname)} in the SDK"
            ]
    return []


def _overloads(func: Any) -> list[Any]:
    try:
        return list(typing.get_overloads(inspect.unwrap(_unwrap(func))))
    except (AttributeError, TypeError, ValueError):
        return []


def signature_problems(
    name: str, fake: Any, real: Any, aliases: Mapping[str, str] | None = None
) -> list[str]:
    """Differences between a fake callable's parameters and the real one's: names and
    kinds, order, defaults, return annotation, and overloads (see the module
    docstring). `aliases` maps the fake's class names to the SDK's."""
    aliases = aliases or {}
    fake_sig, real_sig = _signature(fake), _signature(real)
    if fake_sig is None or real_sig is None:
        return []
    problems = _parameter_problems(name, fake_sig, real_sig)
    problems.extend(_order_problems(name, fake_sig, real_sig))
    problems.extend(_default_problems(name, fake_sig, real_sig))
    problems.extend(_return_problems(name, fake_sig, real_sig, aliases))
    fake_overloads, real_overloads = _overloads(fake), _overloads(real)
    if len(fake_overloads) != len(real_overloads):
        problems.append(
            f"{name}: {len(fake_overloads)} overloads in the fake, {len(real_overloads)} in the SDK"
        )
    else:
        for index, (fake_o, real_o) in enumerate(zip(fake_overloads, real_overloads, strict=True)):
            fake_osig, real_osig = _signature(fake_o), _signature(real_o)
            if fake_osig is None or real_osig is None:
                continue
            qual = f"{name} (overload {index})"
            problems.extend(_parameter_problems(qual, fake_osig, real_osig))
            problems.extend(_order_problems(qual, fake_osig, real_osig))
            problems.extend(_default_problems(qual, fake_osig, real_osig))
            problems.extend(_return_problems(qual, fake_osig, real_osig, aliases))
    return problems


def _parameter_problems(
    name: str, fake_sig: inspect.Signature, real_sig: inspect.Signature
) -> list[str]:
    """Parameter names and kinds: the fake accepts only what the SDK accepts, and
    everything the SDK requires."""
    problems = []
    real_params = real_sig.parameters
    real_has_var_kw = any(p.kind is p.VAR_KEYWORD for p in real_params.values())
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
    return problems


def _aliases(fake: type, real: type, extra: Mapping[str, str] | None) -> dict[str, str]:
    """Fake class names -> SDK class names, for comparing return annotations."""
    names: dict[str, str] = {}
    for klass in reversed(fake.__mro__):  # a test's subclass of a fake uses its module's names
        module = sys.modules.get(klass.__module__)
        names.update(getattr(module, SDK_NAMES_MARK, None) or {})
    for klass in fake.__mro__:
        if klass is not object:
            names[klass.__name__] = real.__name__.lstrip("_")
    names["Self"] = real.__name__.lstrip("_")
    names.update(extra or {})
    return names


def surface_problems(
    fake: type, real: type, *, aliases: Mapping[str, str] | None = None
) -> list[str]:
    """Every way the public surface of `fake` differs from `real` (empty when none).

    Names listed in the fake's `__fake_only__` tuple are helpers for tests, not SDK
    surface, and are skipped. `aliases` adds fake-to-SDK class names for comparing
    return annotations (the fake module's `SDK_NAMES` dict is used too).
    """
    names = _aliases(fake, real, aliases)
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
            problems.extend(signature_problems(f"{qual}.aio", fake_aio, real_aio, names))
            continue
        fake_dual = _instance_or_class_method(fake_attr)
        real_dual = _instance_or_class_method(real_attr)
        if fake_dual is not None or real_dual is not None:
            if fake_dual is None or real_dual is None:
                where = "the fake" if fake_dual is not None else "the SDK"
                problems.append(f"{qual}: an instance-or-class method only in {where}")
                continue
            problems.extend(_callable_problems(qual, fake_dual[0], real_dual[0], names))
            try:
                fake_cls_form = _lookup(fake, fake_dual[1])
                real_cls_form = _lookup(real, real_dual[1])
            except AttributeError as exc:
                problems.append(f"{qual}: its class-level form is missing ({exc})")
                continue
            problems.extend(
                _callable_problems(f"{qual} (class form)", fake_cls_form, real_cls_form, names)
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
        problems.extend(signature_problems(qual, fake_attr, real_attr, names))
    return problems


__all__ = [
    "FAKE_DUNDERS_MARK",
    "FAKE_ONLY_MARK",
    "SDK_NAMES_MARK",
    "signature_problems",
    "surface_problems",
]
