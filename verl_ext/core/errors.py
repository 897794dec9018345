"""verl_ext's errors: one base class, and a subclass per kind of problem. Each message names the problem and the fix.

Every error verl_ext raises on purpose is a ``VerlExtError``, so a caller can catch all of them at once. Each
subclass also inherits the standard exception it stands for, so code written against that exception (``except
ValueError``) keeps working. The classes that need nothing above the token core live here; the others live next
to the code that raises them (the module is named in brackets) and subclass ``VerlExtError`` the same way::

    VerlExtError (Exception)
    ├── ValueError: the input is wrong; fix it and run again
    │   ├── TemplateError            the chat template cannot be used the way a rollout needs
    │   ├── TrajectoryError          a trajectory operation would break the token invariants
    │   ├── OptionsError             an option or command-line argument is unknown or has a bad value
    │   │   └── HarnessSpecError     [plugin.harness_options] the gateway loop's harness cannot run
    │   ├── EngineRequestError       an engine request verl_ext's engines cannot serve
    │   │   ├── StopStringError      [engines.sglang_output] a stop string sent to SGLang's token-in server
│   │   └── ImagePromptRebuildError [engines.sglang_images] an image prompt SGLang would rebuild to other ids
    │   ├── RecordError              [core.replay] a replay record is malformed
    │   ├── PreflightError           [plugin.config_errors] the config or dataset would fail or bypass verl_ext
    │   ├── UnknownLoopError         [plugin.loop_routing] default_agent_loop names no registered agent loop
    │   └── BypassError              [plugin.loop_routing] a dataset row names another loop (agent_name_column=stop)
    ├── RuntimeError: the run got into a state it must not train on
    │   ├── ConsistencyError         [check.policy] the trainer's tokens are not the engine's (strict mode)
    │   ├── RolloutInterrupted       [plugin.engine_turn] a turn could not be completed; the rollout is dropped
    │   ├── BudgetExceeded           [check.align] work would end past its deadline
    │   └── GatewayError             [gateway.errors] what a gateway client gets (HTTP status, OpenAI error)
    ├── FileNotFoundError
    │   └── MissingFileError         a file or folder verl_ext was pointed at does not exist
    ├── NotADirectoryError
    │   └── NotAFolderError          a folder verl_ext was pointed at is a file
    └── IsADirectoryError
        └── IsAFolderError           a file verl_ext was pointed at is a folder

Errors verl_ext does not raise on purpose (a bug, or a library's own error passed through) are not
``VerlExtError``s.
"""


class VerlExtError(Exception):
    """Base of every error verl_ext raises on purpose; ``str()`` names the problem and the fix."""


class TemplateError(VerlExtError, ValueError):
    """The chat template cannot be used the way a rollout needs (the message says why and what to do)."""


class TrajectoryError(VerlExtError, ValueError):
    """A trajectory operation was called with input that would break the token invariants."""


class OptionsError(VerlExtError, ValueError):
    """A verl_ext option (config key or command-line argument) is unknown or has a bad value."""


class EngineRequestError(VerlExtError, ValueError):
    """A request to one of verl_ext's engines asks for something the engine cannot do (the message says what)."""


class MissingFileError(VerlExtError, FileNotFoundError):
    """A file or folder verl_ext was pointed at does not exist (the message names it and what to pass instead)."""


class NotAFolderError(VerlExtError, NotADirectoryError):
    """A path verl_ext needs as a folder is a file (the message names it and the folder to pass)."""


class IsAFolderError(VerlExtError, IsADirectoryError):
    """A path verl_ext needs as a file is a folder (the message names it and the file to pass)."""
