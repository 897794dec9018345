"""The files behind a renderer, checked so that each failure names the file, the place and the fix.

A tokenizer folder is read by transformers, whose errors name neither the file nor what to do
(``Expecting value: line 1 column 1 (char 0)``), and a folder without ``tokenizer.json`` even loads, as a tokenizer
of a few dozen added tokens. A chat template with a syntax error fails only when first rendered. Here the folder
is checked before loading, a load failure is traced to the file that caused it, and a template is parsed once,
up front, with its line number reported.
"""

from __future__ import annotations

import errno
import functools
import json
import os
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from verl_ext.core.errors import IsAFolderError, MissingFileError, NotAFolderError, TemplateError

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
_EMPTY_JSON = f"the file is empty; {_COPY_AGAIN}"
_SAVE_AS_UTF8 = "save the chat template as UTF-8"


def _read_text(file: Path, not_utf8_fix: str, empty: str | None = None) -> str:
    """``file``'s text, decoded as UTF-8 with one leading byte-order mark dropped (as ``utf-8-sig`` does), the one
    place these files are decoded. Raises ``TemplateError`` ``FILE: not UTF-8 (byte N); <not_utf8_fix>``, N counted
    in the file, BOM included; and, when ``empty`` is given, ``FILE: <empty>`` for a file of only whitespace."""
    data = file.read_bytes()
    pointer = lfs_pointer_size(data)
    if pointer is not None:
        raise TemplateError(
            f"{file}: a Git LFS pointer, not the file itself (the {pointer} it stands for was never downloaded); "
            f"run `git lfs pull` in the model's clone, or download {file.name} itself"
        )
    try:
        # decoded as plain UTF-8, not utf-8-sig, whose error offsets skip the BOM's three bytes
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise TemplateError(f"{file}: not UTF-8 (byte {err.start + 1}); {not_utf8_fix}") from None
    if empty is not None and not text.strip():
        raise TemplateError(f"{file}: {empty}")
    return text


_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def lfs_pointer_size(data: bytes) -> str | None:
    """``"N bytes"`` (or ``"file"`` where no size is written) when ``data`` is a Git LFS pointer file: what a clone
    without ``git lfs`` holds in place of a large file. None for any other content."""
    if not data.startswith(_LFS_POINTER) or len(data) > 1024:  # pointers are a few lines, never more
        return None
    for line in data.decode("ascii", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "size" and value.strip().isdigit():
            return f"{int(value):,} bytes"
    return "file"


def check_tokenizer_folder(folder: str | os.PathLike[str]) -> Path:
    """The folder, when its files can make a loadable, unambiguous tokenizer; otherwise an error naming the file,
    the key and the fix.

    Beyond what transformers itself refuses, this refuses what it would load silently but another loader (the
    inference engine's, another transformers version, the ``tokenizers`` library) could read differently: a damaged
    JSON file transformers happens not to read (``special_tokens_map.json``), a ``chat_template.jinja`` that is a
    folder (transformers falls back to ``tokenizer_config.json``'s template), an added token in ``tokenizer.json``
    with an invalid or duplicate id (transformers 5 rebuilds added tokens from ``tokenizer_config.json``; the
    ``tokenizers`` library reads them from ``tokenizer.json``), and keys of the wrong JSON type.
    """
    path = Path(folder)
    if path.is_symlink() and not path.exists():
        raise TemplateError(str(_not_a_readable_file(path)).replace("the file itself", "the folder itself"))
    if path.is_file():
        raise NotAFolderError(
            f"tokenizer folder {str(path)!r} is a file; pass the folder that holds tokenizer.json and "
            "tokenizer_config.json"
        )
    if not path.is_dir():
        raise MissingFileError(
            f"tokenizer folder {str(path)!r} does not exist; pass the folder that holds tokenizer.json "
            "and tokenizer_config.json"
        )
    for name in (*_JSON_FILES, "chat_template.jinja"):
        problem = _not_a_readable_file(path / name)
        if problem:
            raise TemplateError(problem)
    if not (path / "tokenizer.json").is_file():
        raise TemplateError(
            f"{path}: no tokenizer.json; verl_ext needs the fast tokenizer file. Copy tokenizer.json from the model's "
            "repository, or write it with AutoTokenizer.from_pretrained(...).save_pretrained(folder)"
        )
    contents: dict[str, dict[str, Any]] = {"tokenizer.json": _tokenizer_json_head(path / "tokenizer.json")}
    for name in _JSON_FILES[1:]:
        if (path / name).is_file():
            contents[name] = read_json_object(path / name)
    for name, check in _KEY_CHECKS.items():
        if name in contents:
            problem = check(contents[name])
            if problem:
                raise TemplateError(f"{path / name}: {problem}")
    problem = _added_tokens_problem(contents["tokenizer.json"], contents.get("tokenizer_config.json", {}))
    if problem:
        raise TemplateError(f"{path / 'tokenizer.json'}: {problem}")
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        empty = (
            "the chat template file is empty; write the template there, or delete the file to use "
            "tokenizer_config.json's 'chat_template'"
        )
        _read_text(jinja, _SAVE_AS_UTF8, empty)
    return path


# The token ids other files of the folder name, checked against the loaded vocabulary: (file, keys).
_ID_KEYS = (
    ("generation_config.json", ("eos_token_id", "bos_token_id", "pad_token_id")),
    ("config.json", ("eos_token_id",)),
)
_SAME_MODEL = "the files come from different models: copy {name} from the model of tokenizer.json (or remove it)"


def check_token_ids(folder: str | os.PathLike[str], tokenizer: Any) -> None:
    """Refuse a loaded folder whose files name token ids its vocabulary does not have: an eos id of
    generation_config.json or config.json past the vocabulary, or an added token of tokenizer_config.json that the
    loaded tokenizer holds under another id. Such a folder mixes files of two models (transformers loads it, and
    an engine would stop on an id no token has). Raises ``TemplateError`` naming the file, the key and the fix."""
    path = Path(folder)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    size = int(backend.get_vocab_size(with_added_tokens=True)) if backend is not None else len(tokenizer)
    for name, keys in _ID_KEYS:
        config = read_json_object(path / name) if (path / name).is_file() else {}
        for key in keys:
            value = config.get(key)
            for token_id in value if isinstance(value, list) else [value]:
                if _is_id(token_id) and token_id >= size:
                    raise TemplateError(
                        f"{path / name}: {key} {token_id} is past the vocabulary of tokenizer.json ({size:,} ids, "
                        f"0-{size - 1}); {_SAME_MODEL.format(name=name)}"
                    )
    _refuse_tokens_added_at_load(path, tokenizer)
    config_file = path / "tokenizer_config.json"
    decoder = read_json_object(config_file).get("added_tokens_decoder") if config_file.is_file() else None
    for key, token in (decoder or {}).items():
        loaded = tokenizer.convert_tokens_to_ids(token["content"])
        if loaded != int(key):
            where = (
                f"past the vocabulary of tokenizer.json ({size:,} ids)"
                if int(key) >= size
                else f"but the loaded tokenizer has it as id {loaded}"
            )
            raise TemplateError(
                f"{config_file}: 'added_tokens_decoder' gives {token['content']!r} id {key}, {where}; "
                "tokenizer_config.json and tokenizer.json come from different models: copy both again from the "
                "model's repository"
            )


def _refuse_tokens_added_at_load(path: Path, tokenizer: Any) -> None:
    """A special token the folder's config names (eos, bos, the additional ones; not pad or unk, which a user may
    add on purpose) that tokenizer.json lacks: transformers adds it at load as a new id, past every id the model was
    trained with, and the audit would list it as a stop id no model output can hold."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not (path / "tokenizer.json").is_file():
        return
    in_file = {t.get("id") for t in _tokenizer_json_head(path / "tokenizer.json").get("added_tokens", [])}
    base = int(backend.get_vocab_size(with_added_tokens=False))
    optional = {tokenizer.pad_token, tokenizer.unk_token}
    for token in tokenizer.all_special_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token in optional or not _is_id(token_id) or token_id < base or token_id in in_file:
            continue
        named = [n for n in ("tokenizer_config.json", "special_tokens_map.json") if _names(path / n, token)]
        where = path / (named[0] if named else "tokenizer_config.json")
        raise TemplateError(
            f"{where}: names the special token {token!r}, which tokenizer.json does not have (transformers added it "
            f"at load as id {token_id}, past the model's vocabulary of {base:,} ids): tokenizer_config.json and "
            "tokenizer.json come from different models: copy both again from the model's repository"
        )


def _names(file: Path, token: str) -> bool:
    """Whether ``file`` (a JSON file of the folder) holds ``token``'s text."""
    return file.is_file() and json.dumps(token)[1:-1] in file.read_text(encoding="utf-8", errors="replace")


def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads from its caller (``messages``, ``tools``, ``enable_thinking`` ...):
    the names it uses without setting them. A template kwarg not among them changes nothing."""
    import jinja2.meta

    return frozenset(jinja2.meta.find_undeclared_variables(_PARSER.parse(template)))


def _not_a_readable_file(file: Path) -> str | None:
    """Why a file the loader would read is not a regular file (a folder, a dangling link, a symlink loop)."""
    if file.is_symlink():
        try:
            file.resolve(strict=True)
        except RuntimeError:  # Python < 3.13
            return f"{file}: a symlink loop; replace it with the file itself"
        except OSError as err:
            if err.errno == errno.ELOOP:
                return f"{file}: a symlink loop; replace it with the file itself"
            return f"{file}: a symlink to {os.readlink(file)!r}, which does not exist; copy the file itself there"
    if file.is_dir():
        return f"{file}: a folder where the file should be; put the file {file.name} there (or remove the folder)"
    if file.exists() and not file.is_file():
        return f"{file}: not a regular file; put the file {file.name} there"
    if file.is_file() and not os.access(file, os.R_OK):
        return f"{file}: not readable (permissions); make it readable by this user"
    return None


def _tokenizer_json_head(file: Path) -> dict[str, Any]:
    """``{"added_tokens": [...]}`` of a tokenizer.json, read without parsing its tens of megabytes of vocabulary (a
    second or two on a busy machine, and transformers parses the file anyway): the tokenizers library writes
    'added_tokens' before 'model'. Any other layout, or a damaged file, is parsed whole, which names the problem."""
    text = _read_text(file, _COPY_AGAIN, _EMPTY_JSON)
    key, model = text.find('"added_tokens"'), text.find('"model"')
    if text.lstrip().startswith("{") and 0 <= key < model:
        start = text.find(":", key) + 1
        while text[start : start + 1].isspace():
            start += 1
        try:
            added, _ = json.JSONDecoder().raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            added = None
        if isinstance(added, list):
            return {"added_tokens": added}
    return _json_object(file, text)


def read_json_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; ``TemplateError`` naming the file, the place and the fix otherwise."""
    return _json_object(file, _read_text(file, _COPY_AGAIN, _EMPTY_JSON))


def explain_load_failure(folder: Path, exc: BaseException) -> TemplateError:
    """Why transformers could not load the folder, traced to a file where one is to blame."""
    for name in _JSON_FILES:
        problem = json_file_problem(folder / name)
        if problem:
            return TemplateError(problem)
    for file in sorted(folder.glob("*.jinja")):
        try:
            _read_text(file, _SAVE_AS_UTF8)
        except TemplateError as err:
            return err
    why = " ".join(str(exc).split())  # one line: the tokenizers library's messages span several
    if len(why) > 300:
        why = why[:300] + " ..."
    return TemplateError(
        f"tokenizer folder {str(folder)!r} could not be loaded ({type(exc).__name__}: {why}); check that "
        "tokenizer.json is a Hugging Face tokenizers file and tokenizer_config.json comes from the same model "
        "(copy both again from the model's repository, or save_pretrained the tokenizer)"
    )


def json_file_problem(file: Path) -> str | None:
    """``FILE: <what is wrong>; <fix>`` for a JSON file that exists and cannot be read as a JSON object."""
    if not file.is_file():
        return None
    try:
        read_json_object(file)
    except TemplateError as err:
        return str(err)
    return None


def _json_object(file: Path, text: str) -> dict[str, Any]:
    """``text`` (``file``'s, already read) as a JSON object; ``TemplateError`` naming the file, the place and the
    fix otherwise (a tokenizer.json must also have its 'model' object)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        problem = f"not valid JSON, line {err.lineno} column {err.colno}: {err.msg}"
    except RecursionError:
        problem = "JSON nested too deeply to read"
    else:
        if not isinstance(value, dict):
            problem = f"expected a JSON object, found {_json_type(value)}"
        elif file.name == "tokenizer.json" and not isinstance(value.get("model"), dict):
            problem = "JSON, but not a tokenizers file (no 'model' object)"
        else:
            return value
    raise TemplateError(f"{file}: {problem}; {_COPY_AGAIN}")


# --- the keys a loader reads, and their JSON types -------------------------------------------------------------

_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_BOOLEAN_KEYS = (
    "add_bos_token",
    "add_eos_token",
    "add_prefix_space",
    "clean_up_tokenization_spaces",
    "split_special_tokens",
    "legacy",
)
_FIX_KEY = "fix the key, or copy the file again from the model's repository"


def _json_type(value: Any) -> str:
    """How a JSON value is named in an error: its JSON type and a short excerpt."""
    kind = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    text = json.dumps(value, default=str, allow_nan=True)
    return f"{kind} ({text[:40] + '...' if len(text) > 40 else text})"


def _is_id(value: Any) -> bool:
    """A token id as the tokenizers library stores one: an unsigned 32-bit integer."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def _token_problem(key: str, value: Any) -> str | None:
    """A special token: null, its text, or an AddedToken object with a string 'content'."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return None
    return (
        f'key {key!r} must be a token string (e.g. "<|im_end|>") or an AddedToken object with a string '
        f"'content', got {_json_type(value)}; {_FIX_KEY}"
    )


def _token_list_problem(key: str, value: Any) -> str | None:
    """A list of special tokens (transformers 5's ``extra_special_tokens`` may also be an object of named ones)."""
    if isinstance(value, dict) and key == "extra_special_tokens":
        items = list(value.values())
    elif isinstance(value, list):
        items = value
    else:
        return f"key {key!r} must be a list of token strings, got {_json_type(value)}; {_FIX_KEY}"
    for k, item in enumerate(items):
        if item is None or _token_problem(key, item):
            return (
                f"key {key!r}: item {k} must be a token string or an AddedToken object, got {_json_type(item)}; "
                f"{_FIX_KEY}"
            )
    return None


def _special_tokens_problem(config: dict[str, Any]) -> str | None:
    for key in _SPECIAL_TOKEN_KEYS:
        if key in config:
            problem = _token_problem(key, config[key])
            if problem:
                return problem
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if key in config and config[key] is not None:
            problem = _token_list_problem(key, config[key])
            if problem:
                return problem
    return None


def _tokenizer_config_problem(config: dict[str, Any]) -> str | None:
    problem = _special_tokens_problem(config)
    if problem:
        return problem
    template = config.get("chat_template")
    if template is not None and not isinstance(template, str):
        named = isinstance(template, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in template
        )
        if not named:
            return (
                "key 'chat_template' must be the Jinja template as a string (or a list of {\"name\": ..., "
                f'"template": ...}} objects), got {_json_type(template)}; fix the key, or pass --chat-template FILE'
            )
    decoder = config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            return f"key 'added_tokens_decoder' must be an object of id -> token, got {_json_type(decoder)}; {_FIX_KEY}"
        for key, token in decoder.items():
            if not (key.isascii() and key.isdigit() and _is_id(int(key))):
                return (
                    f"key 'added_tokens_decoder': {key!r} is not a token id (a non-negative 32-bit integer); {_FIX_KEY}"
                )
            if not isinstance(token, dict) or not isinstance(token.get("content"), str):
                return (
                    f"key 'added_tokens_decoder'[{key!r}] must be an object with a string 'content', got "
                    f"{_json_type(token)}; {_FIX_KEY}"
                )
    for key in _BOOLEAN_KEYS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            return f"key {key!r} must be true or false, got {_json_type(config[key])}; {_FIX_KEY}"
    for key in ("tokenizer_class", "padding_side", "truncation_side"):
        if config.get(key) is not None and not isinstance(config[key], str):
            return f"key {key!r} must be a string, got {_json_type(config[key])}; {_FIX_KEY}"
    length = config.get("model_max_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, float)) or length < 0):
        return f"key 'model_max_length' must be a non-negative number, got {_json_type(length)}; {_FIX_KEY}"
    return None


def _generation_config_problem(config: dict[str, Any]) -> str | None:
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = config.get(key)
        if value is None or _is_id(value):
            continue
        if key == "eos_token_id" and isinstance(value, list) and value and all(_is_id(i) for i in value):
            continue
        ids = " or a list of ids" if key == "eos_token_id" else ""
        return (
            f"key {key!r} must be a token id (a non-negative 32-bit integer){ids}, got {_json_type(value)}; {_FIX_KEY}"
        )
    return None


def _added_tokens_json_problem(config: dict[str, Any]) -> str | None:
    for token, token_id in config.items():
        if not _is_id(token_id):
            return (
                f"token {token!r} must map to a token id (a non-negative 32-bit integer), got {_json_type(token_id)}; "
                f"{_FIX_KEY}"
            )
    return None


def _chat_template_json_problem(config: dict[str, Any]) -> str | None:
    if not isinstance(config.get("chat_template"), str):
        return (
            f"key 'chat_template' must be the Jinja template as a string, got {_json_type(config.get('chat_template'))}"
            "; fix the key, or remove the file and pass --chat-template FILE"
        )
    return None


_KEY_CHECKS = {
    "tokenizer_config.json": _tokenizer_config_problem,
    "special_tokens_map.json": _special_tokens_problem,
    "generation_config.json": _generation_config_problem,
    "added_tokens.json": _added_tokens_json_problem,
    "chat_template.json": _chat_template_json_problem,
}


def _added_tokens_problem(tokenizer: dict[str, Any], config: dict[str, Any]) -> str | None:
    """tokenizer.json's 'added_tokens': each an object with a unique non-negative id and a unique string 'content',
    and the same id -> content as tokenizer_config.json's 'added_tokens_decoder' (transformers 5 takes the config's,
    the tokenizers library the tokenizer.json's: two loaders must not see two vocabularies)."""
    added = tokenizer.get("added_tokens", [])
    if not isinstance(added, list):
        return f"key 'added_tokens' must be a list of token objects, got {_json_type(added)}; {_COPY_AGAIN}"
    ids: dict[int, str] = {}
    contents: set[str] = set()
    for k, token in enumerate(added):
        if not isinstance(token, dict) or not _is_id(token.get("id")) or not isinstance(token.get("content"), str):
            return (
                f"'added_tokens'[{k}] must be an object with an 'id' (a non-negative 32-bit integer) and a string "
                f"'content', got {_json_type(token)}; {_COPY_AGAIN}"
            )
        if token["id"] in ids or token["content"] in contents:
            return (
                f"'added_tokens'[{k}] ({token['content']!r}, id {token['id']}) repeats an id or a token of an earlier "
                f"entry; {_COPY_AGAIN}"
            )
        ids[token["id"]] = token["content"]
        contents.add(token["content"])
    decoder = config.get("added_tokens_decoder") or {}
    for key, token in decoder.items():
        if int(key) in ids and ids[int(key)] != token["content"]:
            return (
                f"added token {int(key)} is {ids[int(key)]!r} here but {token['content']!r} in tokenizer_config.json's "
                "'added_tokens_decoder'; the two files come from different tokenizers: copy both again from the "
                "model's repository"
            )
    return None


def read_template_file(file: str | os.PathLike[str]) -> str:
    """A ``--chat-template`` file's text: UTF-8, not empty, and parsing as a Jinja template."""
    path = Path(file)
    if path.is_symlink() and not path.exists():
        raise TemplateError(str(_not_a_readable_file(path)))
    if path.is_dir():
        raise IsAFolderError(f"chat template {str(path)!r} is a folder; pass the .jinja file")
    if not path.is_file():
        raise MissingFileError(f"chat template file {str(path)!r} does not exist; pass the path of a .jinja file")
    text = _read_text(path, _SAVE_AS_UTF8, "the chat template file is empty; pass a Jinja chat template")
    _refuse_json(text, path)
    refuse_unparsable(text, str(path))
    if "messages" not in template_variables(text):
        raise TemplateError(
            f"{path}: not a chat template: it never reads 'messages' (the conversation), so every prompt would render "
            "the same text; pass a Jinja chat template (a model's chat_template.jinja, or the 'chat_template' value "
            "of its tokenizer_config.json saved as a file)"
        )
    return text


def _refuse_json(text: str, path: Path) -> None:
    """A JSON file given as the template (a tokenizer_config.json, a chat_template.json): named as JSON, with the
    key that holds the template, instead of a Jinja syntax error deep inside an escaped string."""
    if not text.lstrip().startswith(("{", "[")):
        return
    try:
        value = json.loads(text)
    except ValueError:
        return  # Jinja that starts with a brace ('{{ bos_token }}'): the parser judges it
    key = "'chat_template' value" if isinstance(value, dict) and "chat_template" in value else "chat template"
    raise TemplateError(
        f"{path}: a JSON file, not a Jinja chat template; save its {key} (the template text itself) as a .jinja file "
        "and pass that"
    )


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
