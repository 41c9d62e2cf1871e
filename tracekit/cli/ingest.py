"""PLACEHOLDER: replaced by the module that implements this command (see the issue that names it)."""
