"""The error hierarchy: one base class, each subclass also the standard exception it replaces, all drawn."""

from __future__ import annotations

import importlib

import pytest

from verl_ext.check.policy import CheckPolicy
from verl_ext.core import errors
from verl_ext.core.errors import IsAFolderError, MissingFileError, NotAFolderError, OptionsError, VerlExtError
from verl_ext.core.tokenizer_files import read_template_file

# every module that defines a VerlExtError subclass (importing them registers the subclasses)
MODULES = [
    "verl_ext.check.align",
    "verl_ext.check.policy",
    "verl_ext.core.replay",
    "verl_ext.engines.sglang_images",
    "verl_ext.engines.sglang_output",
    "verl_ext.gateway.errors",
    "verl_ext.plugin.config_errors",
    "verl_ext.plugin.engine_turn",
    "verl_ext.plugin.loop_routing",
    "verl_ext.plugin.preflight",
]


def _all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_all_subclasses(sub)}
    return out


def test_every_subclass_is_drawn_and_inherits_a_standard_exception():
    for name in MODULES:
        importlib.import_module(name)
    found = _all_subclasses(VerlExtError)
    assert len(found) >= 12, sorted(c.__name__ for c in found)
    for cls in found:
        assert cls.__name__ in errors.__doc__, f"{cls.__name__} is not drawn in errors.py"
        generic = (Exception, BaseException, object)
        standard = [b for b in cls.__mro__ if b.__module__ == "builtins" and b not in generic]
        assert standard, f"{cls.__name__} inherits no standard exception besides Exception"


def test_a_bad_option_raises_options_error_which_value_error_callers_still_catch():
    with pytest.raises(OptionsError, match="unknown option verl_ext.check.bogus") as info:
        CheckPolicy.from_mapping({"bogus": 1})
    assert isinstance(info.value, ValueError) and isinstance(info.value, VerlExtError)


def test_a_missing_template_file_is_a_missing_file_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        read_template_file(tmp_path / "absent.jinja")
    assert isinstance(info.value, MissingFileError)


def test_a_path_of_the_wrong_kind_is_a_verl_ext_error_that_os_error_callers_still_catch(tmp_path):
    from verl_ext.core.replay import read_json_lines
    from verl_ext.core.tokenizer_files import check_tokenizer_folder

    with pytest.raises(IsADirectoryError, match="is a folder; pass the .jinja file") as info:
        read_template_file(tmp_path)
    assert isinstance(info.value, IsAFolderError)
    with pytest.raises(IsAFolderError, match="is a folder; pass the JSONL file inside it"):
        list(read_json_lines(tmp_path, "records file"))
    (file := tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(NotADirectoryError, match="is a file; pass the folder") as info:
        check_tokenizer_folder(file)
    assert isinstance(info.value, NotAFolderError)
