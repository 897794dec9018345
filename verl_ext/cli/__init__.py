"""The ``verl-ext`` command line: thin formatting over the token core, the record, the report and the demo."""
