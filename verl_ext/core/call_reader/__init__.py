"""A tool-call reader derived from the chat template: learned from renders of known calls (``learn``), reading a
model's turn back into calls (``read``), in the template's own form and the forms a model plausibly writes."""

from verl_ext.core.call_reader.form import CallForm, ReadCall, ReadTurn
from verl_ext.core.call_reader.learn import Learned, learn_call_reader
from verl_ext.core.call_reader.read import CallReader, parameter_types

__all__ = ["CallForm", "CallReader", "Learned", "ReadCall", "ReadTurn", "learn_call_reader", "parameter_types"]
