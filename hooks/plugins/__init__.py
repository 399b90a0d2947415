"""The built-in runtime-hooks plugins, one module each; listed as entry points in pyproject.toml."""
