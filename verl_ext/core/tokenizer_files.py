"""The files behind a renderer, checked so that each failure names the file, the place and the fix.

A tokenizer folder is read by transformers, whose errors name neither the file nor what to do
(``Expecting value: line 1 column 1 (char 0)``), and a folder without ``tokenizer.json`` even loads, as a tokenizer
of a few dozen added tokens. A chat template with a syntax error fails only when first rendered. Here the folder
is checked before loading, a load failure is traced to the file that caused it, and a template is parsed once,
up front, with its line number reported.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from verl_ext.core.errors import MissingFileError, TemplateError

# The JSON files transformers may read from a tokenizer folder, in the order they are worth blaming.
_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "config.json",
    "generation_config.json",
    "chat_template.json",
)
_COPY_AGAIN = "the file is damaged: copy it again from the model's repository (or save_pretrained the tokenizer)"


def check_tokenizer_folder(folder: str | os.PathLike[str]) -> Path:
    """The folder, when it can hold a loadable tokenizer; otherwise an error naming the fix."""
    path = Path(folder)
    if path.is_file():
        raise NotADirectoryError(
            f"tokenizer folder {str(path)!r} is a file; pass the folder that holds tokenizer.json and "
            "tokenizer_config.json"
        )
    if not path.is_dir():
        raise MissingFileError(
            f"tokenizer folder {str(path)!r} does not exist; pass the folder that holds tokenizer.json "
            "and tokenizer_config.json"
        )
    if not (path / "tokenizer.json").is_file():
        raise TemplateError(
            f"{path}: no tokenizer.json; verl_ext needs the fast tokenizer file. Copy tokenizer.json from the model's "
            "repository, or write it with AutoTokenizer.from_pretrained(...).save_pretrained(folder)"
        )
    return path


def explain_load_failure(folder: Path, exc: BaseException) -> TemplateError:
    """Why transformers could not load the folder, traced to a file where one is to blame."""
    for name in _JSON_FILES:
        problem = json_file_problem(folder / name)
        if problem:
            return TemplateError(problem)
    for file in sorted(folder.glob("*.jinja")):
        try:
            file.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            return TemplateError(f"{file}: not UTF-8 (byte {err.start + 1}); save the chat template as UTF-8")
    return TemplateError(
        f"tokenizer folder {str(folder)!r} could not be loaded ({type(exc).__name__}: {exc}); check that "
        "tokenizer.json is a Hugging Face tokenizers file (save_pretrained writes one)"
    )


def json_file_problem(file: Path) -> str | None:
    """``FILE: <what is wrong>; <fix>`` for a JSON file that exists and cannot be read as a JSON object."""
    if not file.is_file():
        return None
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return f"{file}: not UTF-8 (byte {err.start + 1}); {_COPY_AGAIN}"
    if not text.strip():
        return f"{file}: the file is empty; {_COPY_AGAIN}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"{file}: not valid JSON, line {err.lineno} column {err.colno}: {err.msg}; {_COPY_AGAIN}"
    if not isinstance(value, dict):
        return f"{file}: expected a JSON object, found a {type(value).__name__}; {_COPY_AGAIN}"
    if file.name == "tokenizer.json" and not isinstance(value.get("model"), dict):
        return f"{file}: JSON, but not a tokenizers file (no 'model' object); {_COPY_AGAIN}"
    return None


def read_template_file(file: str | os.PathLike[str]) -> str:
    """A ``--chat-template`` file's text: UTF-8, not empty, and parsing as a Jinja template."""
    path = Path(file)
    if path.is_dir():
        raise IsADirectoryError(f"chat template {str(path)!r} is a folder; pass the .jinja file")
    if not path.is_file():
        raise MissingFileError(f"chat template file {str(path)!r} does not exist")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TemplateError(f"{path}: not UTF-8 (byte {err.start + 1}); save the chat template as UTF-8") from None
    if not text.strip():
        raise TemplateError(f"{path}: the chat template file is empty; pass a Jinja chat template")
    refuse_unparsable(text, str(path))
    return text


def template_origin(folder: Path) -> str:
    """Where a folder's own chat template comes from, to name it in an error."""
    if (folder / "chat_template.jinja").is_file():
        return str(folder / "chat_template.jinja")
    return f"{folder / 'tokenizer_config.json'} (key 'chat_template')"


def refuse_unparsable(template: str, origin: str = "the chat template") -> None:
    """Raise ``TemplateError`` naming ``origin`` and the line when the template has a Jinja syntax error."""
    problem = template_syntax_problem(template)
    if problem is not None:
        line, message = problem
        raise TemplateError(
            f"{origin}: the chat template does not parse, line {line}: {message}; fix the template's Jinja syntax"
        )


@functools.lru_cache(maxsize=64)
def template_syntax_problem(template: str) -> tuple[int, str] | None:
    """(line, message) of the template's first Jinja syntax error, or None. Parsed with the tags transformers'
    chat-template environment accepts (loop controls and ``{% generation %}``)."""
    try:
        _PARSER.parse(template)
    except jinja2.TemplateSyntaxError as err:
        return int(err.lineno or 1), str(err.message or err)
    return None


class _GenerationTag(jinja2.ext.Extension):
    """Parses ``{% generation %}...{% endgeneration %}``, as transformers' environment does (nothing to run)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


_PARSER = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
)
