"""`predictor`'s public API: the names it declares (`__all__`), resolves at run time (`_EXPORTS`, PEP 562) and shows
type checkers (the `if TYPE_CHECKING:` imports) are one and the same set, and each resolves to its module's object."""
from __future__ import annotations

import ast
from importlib import import_module
from pathlib import Path

import predictor


def _type_checking_names() -> dict[str, tuple[str, str]]:
    """Public name → (module, attribute) as the `if TYPE_CHECKING:` block of predictor/__init__.py imports it (a module
    of the package relative, `.costs.learned.models`; tracekit's shared types absolute, `tracekit.core.stacks`)."""
    tree = ast.parse(Path(predictor.__file__).read_text())
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level in (0, 1) and node.module
        module = "." * node.level + node.module
        for alias in node.names:
            names[alias.asname or alias.name] = (module, alias.name)
    return names


def test_declared_resolved_and_typed_names_agree():
    assert len(predictor.__all__) == len(set(predictor.__all__))
    assert set(predictor.__all__) == set(predictor._EXPORTS)
    assert _type_checking_names() == predictor._EXPORTS


def test_every_name_resolves_to_its_module_attribute():
    for name, (module, attribute) in predictor._EXPORTS.items():
        assert getattr(predictor, name) is getattr(import_module(module, "predictor"), attribute), name
    assert sorted(dir(predictor)) == sorted(predictor.__all__)
