"""CRI API protobuf definitions and their generated Python modules."""
