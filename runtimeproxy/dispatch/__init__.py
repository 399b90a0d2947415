"""Calling runtime-hook servers around CRI lifecycle calls: registration, dispatch, merge, store."""
