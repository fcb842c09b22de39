"""Parsing YAML text for the importers (IMPORT.md §1), pure: no file access.

Multi-document YAML (JSON is YAML) is parsed with a safe loader that resolves
scalars by the YAML 1.2 core schema, as Kubernetes' and YuniKorn's Go parsers
read a value meant as text: ``on``/``off``/``yes``/``no`` stay text (YAML 1.1
would make them booleans and a label ``yes`` would turn into ``true``), ``1_000``
and ``1:30`` stay text, and dates stay text.
"""

from __future__ import annotations

import re

import yaml

from .common import SourceDocument


class ConfigLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema booleans, integers, floats and no timestamps."""


ConfigLoader.yaml_implicit_resolvers = {}
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value = str(loader.construct_scalar(node))
    if value.startswith("0o"):
        return int(value[2:], 8)
    return int(value, 0) if value.startswith("0x") else int(value, 10)


ConfigLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


class UnreadableInput(ValueError):
    """A file that cannot be read or parsed; the message names the file and document."""


def parse_text(content: str, origin: str) -> list[SourceDocument]:
    """Every document of a YAML/JSON stream, or :class:`UnreadableInput`."""
    documents: list[SourceDocument] = []
    try:
        for index, body in enumerate(yaml.load_all(content, Loader=ConfigLoader), start=1):
            documents.append(SourceDocument(f"{origin} document {index}", body))
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1} column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        count = len(documents) + 1
        raise UnreadableInput(
            f"{origin}: document {count}: invalid YAML{where}: {problem}"
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an int literal too long to convert
        raise UnreadableInput(f"{origin}: invalid YAML: {exc}") from None
    return documents
