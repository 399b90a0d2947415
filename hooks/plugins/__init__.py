"""The built-in runtime-hooks plugins, one module (or sub-package, as network) each; listed as entry
points in pyproject.toml. They import what runtimeproxy.hooks may."""
