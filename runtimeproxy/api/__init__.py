"""CRI API protobuf definitions and their generated Python modules.

Imports nothing of runtimeproxy but itself.
"""
