"""The ``verl-ext`` command line: thin formatting over the token core."""
