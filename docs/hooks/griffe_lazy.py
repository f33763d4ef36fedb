"""Griffe extension: the public names that keras_vit's packages load on
first use, and its docstrings' reStructuredText bits in Markdown.

Four packages (``keras_vit.models``, ``.train``, ``.analysis``,
``keras_vit.zoo``) declare most public names with ``lazy.attach(__name__,
lazy.names_of({".module": ("name", ...)}))`` (PEP 562, so that the command
line starts without TensorFlow). Static analysis sees no such names; this
extension reads the same literal mapping from the source and adds each
name as an alias of ``package.module.name``, so that ``keras_vit.zoo.load``
is documented under that name.
"""

from __future__ import annotations

import ast
import re

import griffe


def lazy_names(tree):
    """``{name: ".module"}`` from every ``lazy.attach(...,
    lazy.names_of({...}))`` assignment at the top of a module's AST."""
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and _called(node.value) == "attach"
                and len(node.value.args) >= 2):
            continue
        inner = node.value.args[1]
        if isinstance(inner, ast.Call) and _called(inner) == "names_of":
            modules = ast.literal_eval(inner.args[0])
            for module, names in modules.items():
                for name in names:
                    found[name] = module
        else:
            found.update(ast.literal_eval(inner))
    return found


def _called(call):
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(
        func, "id", None)


# :func:`vit`, :class:`~keras_vit.Foo`, :mod:`x` -> `vit`, `Foo`, `x`
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_PROMPT = re.compile(r"^(\s*)>>>( |$)")


def _code_span(match):
    tilde, target = match.groups()
    # Sphinx's "~" shows the last component only.
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown_docstring(text):
    """A docstring's Sphinx roles as code spans and its doctest blocks
    (``>>>`` lines and their output, up to a blank line) as fenced
    ``pycon`` code, which Markdown would otherwise read as quotes. Text
    already converted comes back unchanged."""
    text = _ROLE.sub(_code_span, text)
    out, in_block, indent = [], False, ""
    for line in text.split("\n"):
        prompt = _PROMPT.match(line)
        fenced = bool(out) and out[-1].strip().startswith("```")
        if prompt and not in_block and not fenced:
            indent = prompt.group(1)
            out += [f"{indent}```pycon"]
            in_block = True
        elif in_block and not line.strip():
            out += [f"{indent}```"]
            in_block = False
        out.append(line)
    if in_block:
        out.append(f"{indent}```")
    return "\n".join(out)


class LazyNames(griffe.Extension):
    def on_module_members(self, *, node, mod, agent, **kwargs):
        if not isinstance(node, ast.Module):
            return
        for name, module in lazy_names(node).items():
            if name not in mod.members:
                target = f"{mod.path}{module}.{name}"
                mod.set_member(name, griffe.Alias(name, target, parent=mod))

    def on_object(self, *, obj, loader, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)

    def on_package(self, *, pkg, loader, **kwargs):
        if pkg.docstring is not None:
            pkg.docstring.value = markdown_docstring(pkg.docstring.value)
